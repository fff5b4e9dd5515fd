"""In memory against prepared (``make prepare`` + ``data.prepared``): peak memory of training as the data grows,
prepare's throughput, and the loader's samples/s against training's.

For one task's bake (installed in this Python) and each data size (1x, 10x, 100x), the script makes
a source (a folder of 32 px PNGs in 3 classes, a folder of text, or a CSV), prepares it with the
bake's ``python -m <package>.commands.prepare`` (timed: throughput per core), then trains for a fixed number
of steps twice through the bake's CLI, ``fit``, each in a fresh process: once from the source in
memory, once from the prepared data set, and records each process's peak resident memory
(``ru_maxrss`` of the training process, loader workers 0). Both ways run at every size in the same
session, so their ratio is what to read across machines. With ``--loader`` it also times the
prepared training split's DataLoader alone at 0, 2 and 4 workers (samples/s over 50 batches)
against the training step of the task's default model (samples/s of ``fit``, from ``make bench``'s
step timer).

    python docs/bench_prepared.py /tmp/bk/image-classification/digits-classifier --task image --scales 1 10 100
    python docs/bench_prepared.py /tmp/bk/language-model/byte-gpt --task text --scales 1 10 100 --loader
    python docs/bench_prepared.py /tmp/bk/image-classification/digits-classifier --task image --scales 1 10 --dataset
    python docs/bench_prepared.py /tmp/bk/tabular/tabular-classifier --task tabular --scales 1 10 --dataset

Prints one JSON line per measurement and a table in Markdown at the end.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BASE = {"image": 2_000, "text": 10 * 2**20, "tabular": 20_000}  # images, bytes, rows at 1x
EXPERIMENT = {"image": "image-folder", "text": "text-folder", "tabular": "tabular-csv"}
SOURCE_KEY = {"image": "root", "text": "path", "tabular": "path"}
STEPS = 30
# The experiment configs' settings that shaped the prepared data (checked when it is opened).
SETTINGS = {"image": {"image_size": 32}, "tabular": {"target": "label"}}


def as_dataset(root: Path, folder: Path) -> Path:
    """The class folders under ``root`` as a Hugging Face image dataset's Parquet shard (encoded PNG bytes, a
    ClassLabel of the folder names), as the Hub stores one: ``data/train-00000-of-00001.parquet``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = sorted(path.name for path in root.iterdir())
    rows = [(path.read_bytes(), label) for label, name in enumerate(names) for path in sorted((root / name).iterdir())]
    image = pa.array([{"bytes": data, "path": None} for data, _ in rows])
    table = pa.table({"image": image, "label": pa.array([label for _, label in rows], pa.int64())})
    features = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"}}
    table = table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})
    shard = folder / "dataset" / "data" / "train-00000-of-00001.parquet"
    shard.parent.mkdir(parents=True)
    pq.write_table(table, shard)
    shutil.rmtree(root)
    return folder / "dataset"


def make_source(task: str, size: int, folder: Path, parquet: bool = False) -> Path:
    import numpy as np

    rng = np.random.default_rng(0)
    if task == "image":
        from PIL import Image

        root = folder / "images"
        for label in range(3):
            (root / f"class{label}").mkdir(parents=True)
        for index in range(size):
            label = index % 3
            pixels = rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8)
            pixels[:, :, label] //= 3  # something to learn
            Image.fromarray(pixels).save(root / f"class{label}" / f"{index}.png", compress_level=1)
        return root
    if task == "text":
        root = folder / "texts"
        root.mkdir()
        words = np.array(["the", "whale", "sea", "ship", "captain", "follows", "finds", "an", "oar", "deck"])
        per_file = min(size, 10 * 2**20)
        picks = words[rng.integers(0, len(words), size=per_file // 6)]
        lines = [" ".join(picks[i : i + 12]) for i in range(0, len(picks), 12)]
        (root / "0000.txt").write_text("\n".join(lines) + "\n")
        for index in range(1, size // per_file):  # copies: as large, made in a moment
            shutil.copyfile(root / "0000.txt", root / f"{index:04d}.txt")
        return root
    import pandas as pd

    x = rng.normal(size=(size, 8)).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(8)])
    frame["colour"] = rng.choice(["red", "green", "blue"], size=size)
    frame["label"] = np.where(x[:, 0] + (frame["colour"] == "red") > 0.5, "yes", "no")
    if parquet:  # the colour as a dictionary (categorical) column, as a warehouse export writes it
        path = folder / "table.parquet"
        frame.astype({"colour": "category"}).to_parquet(path, index=False)
        return path
    path = folder / "table.csv"
    frame.to_csv(path, index=False)
    return path


def peak_rss_mb(command: list[str], cwd: Path) -> tuple[float, float]:
    """Run ``command`` in a fresh process; (its peak resident memory in MB, seconds)."""
    probe = (
        "import resource, subprocess, sys, time; start = time.perf_counter(); "
        "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
        "seconds = time.perf_counter() - start; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, seconds) if done.returncode == 0 "
        "else sys.exit(done.stderr[-3000:])"
    )
    out = subprocess.run([sys.executable, "-c", probe, *command], cwd=cwd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    rss, seconds = out.stdout.split()
    return float(rss), float(seconds)


def fit_command(package: str, task: str, source: Path, work: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable, "-m", package, "fit",
        "--config=configs/default.yaml", f"--config=configs/experiments/{EXPERIMENT[task]}.yaml",
        f"--data.init_args.{SOURCE_KEY[task]}={source}",
        f"--trainer.max_steps={STEPS}", "--trainer.max_epochs=-1", "--trainer.limit_val_batches=2",
        "--trainer.val_check_interval=null", "--trainer.check_val_every_n_epoch=1000", "--test_after_fit=false",
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--model.init_args.compile=false",
        f"--trainer.default_root_dir={work}", "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.init_args.save_dir={work / 'logs'}", "--trainer.enable_progress_bar=false",
        *extra,
    ]  # fmt: skip


def loader_rates(package: str, task: str, prepared: Path, batch: int) -> dict[str, float]:
    """Samples/s of the prepared training split's DataLoader alone, at 0, 2 and 4 workers."""
    data_module = __import__(f"{package}.data", fromlist=["x"])
    cls = {"image": "ImageFolderDataModule", "text": "TextDataModule", "tabular": "TabularDataModule"}[task]
    rates = {}
    for workers in (0, 2, 4):
        data = getattr(data_module, cls)(prepared=str(prepared), batch_size=batch, num_workers=workers,
                                         **SETTINGS.get(task, {}))  # fmt: skip
        data.setup("fit")
        loader = data.loader(data.train_set, shuffle=True)
        count, batches, start = 0, 0, None
        while batches < 50:  # epochs after epochs (worker start-up included) until 50 batches
            for samples in loader:
                if start is None:  # the clock starts once the first workers are up
                    start = time.perf_counter()
                    continue
                count, batches = count + len(samples[0]), batches + 1
                if batches == 50:
                    break
        rates[f"loader_{workers}_workers"] = count / (time.perf_counter() - start)
    return rates


def training_rate(package: str, task: str, prepared: Path, bake: Path) -> tuple[float, int]:
    """Samples/s of ``fit`` on the prepared data with the task's default model (median step), and the batch size."""
    os.chdir(bake)
    bench = __import__(f"{package}.commands.bench", fromlist=["run_project"])
    config = [Path("configs/default.yaml"), Path(f"configs/experiments/{EXPERIMENT[task]}.yaml")]
    extra = [f"--data.init_args.prepared={prepared}", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    extra += ["--trainer.enable_progress_bar=false"]
    result = bench.run_project(config, 25, extra)
    intervals = sorted(result["intervals"][5:])
    return result["batch_size"] / intervals[len(intervals) // 2], result["batch_size"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bake", type=Path)
    parser.add_argument("--task", choices=list(BASE), required=True)
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--loader", action="store_true")
    parser.add_argument(
        "--dataset",
        action="store_true",
        help="images as a Hugging Face dataset's Parquet shard, a table as a Parquet file",
    )
    args = parser.parse_args()
    bake = args.bake.resolve()
    package = next(p.name for p in (bake / "src").iterdir() if (p / "cli.py").exists())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for scale in args.scales:
            work = Path(folder) / f"x{scale}"
            work.mkdir()
            size = BASE[args.task] * scale
            source = make_source(args.task, size, work, parquet=args.dataset and args.task == "tabular")
            source = as_dataset(source, work) if args.dataset and args.task == "image" else source
            files = [source] if source.is_file() else [f for f in source.rglob("*") if f.is_file()]
            source_mb = sum(f.stat().st_size for f in files)
            prepared = work / "prepared"
            start = time.perf_counter()
            extra = ["--data.init_args.image_size=32"] if args.task == "image" else []
            subprocess.run(
                [sys.executable, "-m", f"{package}.commands.prepare", "--out", str(prepared),
                 "--config=configs/default.yaml", f"--config=configs/experiments/{EXPERIMENT[args.task]}.yaml",
                 f"--data.init_args.{SOURCE_KEY[args.task]}={source}", *extra],
                cwd=bake, check=True, capture_output=True,
            )  # fmt: skip
            prepare_s = time.perf_counter() - start
            prepared_mb = sum(f.stat().st_size for f in prepared.rglob("*") if f.is_file())
            memory_mb, memory_s = peak_rss_mb(fit_command(package, args.task, source, work / "a", extra), bake)
            disk = [*extra, f"--data.init_args.prepared={prepared}"]
            disk_mb, disk_s = peak_rss_mb(fit_command(package, args.task, source, work / "b", disk), bake)
            row = {
                "task": args.task, "scale": scale, "size": size, "source_mb": round(source_mb / 2**20, 1),
                "prepared_mb": round(prepared_mb / 2**20, 1), "prepare_s": round(prepare_s, 1),
                "prepare_per_core": round(size / prepare_s / (os.cpu_count() or 1)),
                "in_memory_peak_rss_mb": round(memory_mb), "prepared_peak_rss_mb": round(disk_mb),
                "in_memory_fit_s": round(memory_s, 1), "prepared_fit_s": round(disk_s, 1),
            }  # fmt: skip
            if args.loader and scale == args.scales[0]:
                rate, batch = training_rate(package, args.task, prepared, bake)
                row |= {"train_samples_per_s": round(rate), "batch_size": batch}
                row |= {k: round(v) for k, v in loader_rates(package, args.task, prepared, batch).items()}
            print(json.dumps(row), flush=True)
            rows.append(row)
            shutil.rmtree(work)
    unit = {"image": "images", "text": "bytes", "tabular": "rows"}[args.task]
    head = f"| {unit} | source MB | prepared MB | prepare {unit}/s per core | peak RSS in memory | peak RSS prepared |"
    print("\n" + head)
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['size']:,} | {row['source_mb']} | {row['prepared_mb']} | {row['prepare_per_core']:,} | "
              f"{row['in_memory_peak_rss_mb']:,} MB | {row['prepared_peak_rss_mb']:,} MB |")  # fmt: skip


if __name__ == "__main__":
    main()
