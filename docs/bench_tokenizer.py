"""Bytes against a trained BPE (``data.tokenizer: bpe``) on the bundled corpus of a language-model bake.

For UTF-8 bytes and a BPE of each ``--vocab`` size, in this process: the BPE's training time on the
training split, tokens per byte of the corpus, and the tokenizer's encoding speed (tokens/s and
MB/s of text, the whole corpus through ``encode_with_bytes``, which also counts each token's
bytes). Then, each in a fresh process through the bake's CLI (``fit`` with the default config, the
default GPT, 128-token windows): the training step's time (from a 20-step and a 60-step run:
the difference, so start-up cancels), then a run of as many steps as fit in ``--minutes`` of
training at that step time, a whole cosine schedule each, and its test bits per byte (the best
checkpoint by val/loss). Equal training wall time is the fair comparison: a BPE step costs more (a
larger output layer) but reads about three times the text.

    python docs/bench_tokenizer.py /tmp/bk/language-model/byte-gpt --minutes 2 --vocab 1024 2048 4096

Prints one JSON line per measurement and a Markdown table at the end.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def tokenizer_figures(package: str, vocab: int | None) -> dict:
    """Training time, tokens per byte and encoding speed of bytes (``vocab`` None) or a BPE of ``vocab``."""
    text_module = __import__(f"{package}.data.text", fromlist=["TextDataModule", "bundled_text"])
    settings = {"tokenizer": "bytes"} if vocab is None else {"tokenizer": "bpe", "bpe_vocab_size": vocab}
    data = text_module.TextDataModule(**settings)
    start = time.perf_counter()
    tokenizer = data.tokenizer if vocab is None else data.train_tokenizer()  # reads, cuts and trains
    trained_s = time.perf_counter() - start
    text = text_module.bundled_text().decode("utf-8")
    size = len(text.encode("utf-8"))
    start = time.perf_counter()
    ids, counts = tokenizer.encode_with_bytes(text)
    encode_s = time.perf_counter() - start
    assert sum(counts) == size
    return {
        "tokenizer": "bytes" if vocab is None else f"bpe-{vocab}",
        "vocab_size": tokenizer.vocab_size,
        "setup_s": round(trained_s, 2),
        "tokens_per_byte": round(len(ids) / size, 4),
        "encode_tokens_per_s": round(len(ids) / encode_s),
        "encode_mb_per_s": round(size / encode_s / 1e6, 2),
    }


def fit(project: Path, package: str, vocab: int | None, steps: int, root: Path) -> dict:
    """``fit`` of ``steps`` steps in a fresh process; its wall time and test metrics."""
    args = [sys.executable, "-m", package, "fit", f"--config={project / 'configs' / 'default.yaml'}"]
    if vocab is not None:
        args += [f"--config={project / 'configs' / 'experiments' / 'bpe.yaml'}", f"--data.init_args.bpe_vocab_size={vocab}"]
    args += [
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.init_args.save_dir={root}",
        f"--trainer.default_root_dir={root}",
        "--trainer.max_epochs=-1",
        f"--trainer.max_steps={steps}",
        f"--trainer.val_check_interval={max(10, steps // 10)}",
        "--trainer.enable_progress_bar=false",
    ]
    start = time.perf_counter()
    done = subprocess.run(args, cwd=project, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"fit failed:\n{done.stderr[-3000:]}")
    (summary,) = root.rglob("test_metrics.json")
    return {"seconds": seconds, "metrics": json.loads(summary.read_text())["metrics"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project", type=Path, help="a language-model bake, installed in this Python")
    parser.add_argument("--vocab", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--minutes", type=float, default=2.0, help="training wall time of each run")
    options = parser.parse_args()
    project = options.project.resolve()
    package = next((project / "src").iterdir()).name
    sys.path.insert(0, str(project / "src"))
    rows = []
    for vocab in [None, *options.vocab]:
        row = tokenizer_figures(package, vocab)
        with tempfile.TemporaryDirectory() as work:
            short, long = (fit(project, package, vocab, steps, Path(work) / str(steps)) for steps in (20, 60))
            step_s = (long["seconds"] - short["seconds"]) / 40
            steps = int(options.minutes * 60 / step_s)
            run = fit(project, package, vocab, steps, Path(work) / "run")
        row |= {
            "step_ms": round(step_s * 1000, 1),
            "steps": steps,
            "train_text_mb_per_s": round(32 * 128 / row["tokens_per_byte"] / step_s / 1e6, 3),
            "test_bpb": round(run["metrics"]["test/bpb"], 4),
            "run_s": round(run["seconds"], 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| tokenizer | vocabulary | tokens/byte | BPE training s | encode tokens/s | encode MB/s | step ms | "
          f"steps in {options.minutes:g} min | text MB/s trained | test bits/byte |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['tokenizer']} | {row['vocab_size']} | {row['tokens_per_byte']} | {row['setup_s']} | "
            f"{row['encode_tokens_per_s']:,} | {row['encode_mb_per_s']} | {row['step_ms']} | {row['steps']} | "
            f"{row['train_text_mb_per_s']} | {row['test_bpb']} |"
        )


if __name__ == "__main__":
    main()
