"""Your own images: a folder of PNGs made here trains to a stated accuracy; bad folders fail before training."""

{% if cookiecutter.use_serving == "yes" -%}
import base64
{% endif -%}
import csv
{% if cookiecutter.use_serving == "yes" -%}
import importlib.util
{% endif -%}
import io
import json
import logging
import re
import shlex
import shutil
{% if cookiecutter.use_serving == "yes" -%}
import struct
{% endif -%}
import subprocess
import sys
{% if cookiecutter.use_serving == "yes" -%}
import urllib.error
{% endif -%}
{% if cookiecutter.use_serving == "yes" -%}
import urllib.request
{% endif -%}
{% if cookiecutter.use_serving == "yes" -%}
import zlib
{% endif -%}
from pathlib import Path
{% if cookiecutter.use_serving == "yes" -%}
from typing import Any
{% endif %}
import numpy as np
import pytest
import torch
from conftest import (
    CONFIGS,
    ROOT,
    assert_ddp_run_resumes_exactly,
{%- if cookiecutter.use_prepared == "yes" %}
    assert_prepared_run_resumes_as_in_memory,
{%- endif %}
    assert_run_resumes_exactly,
    cached_snapshot,
    fit_stopped_by_signal,
    shrunk_args,
    user_error,
    with_tests_importable,
)
from PIL import Image{{ ", ImageFile" if cookiecutter.use_serving == "yes" else "" }}

from {{ cookiecutter.package_name }}.cli import main
{%- if cookiecutter.use_serving == "yes" %}
from {{ cookiecutter.package_name }}.commands.export import main as export_main
{%- endif %}
from {{ cookiecutter.package_name }}.commands.predict import main as predict_main
from {{ cookiecutter.package_name }}.commands.predict import predict
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.commands.prepare import main as prepare_main
{%- endif %}
{% if cookiecutter.use_prepared == "yes" -%}
from {{ cookiecutter.package_name }}.commands.prepare import train_command
{% endif -%}
from {{ cookiecutter.package_name }}.data import ImageFolderDataModule
from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.contract import stack_samples
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}
from {{ cookiecutter.package_name }}.engine.export import export_all
{%- endif %}
from {{ cookiecutter.package_name }}.engine.inference import load_trained
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.prepared import file_sha256, sampled_sha256
{%- endif %}

EXPERIMENT = CONFIGS / "experiments" / "image-folder.yaml"
CLASSES = ("blobs", "horizontal", "vertical")  # tell-apart patterns that survive a flip and a crop


def pattern(name: str, rng: np.random.Generator, size: int = 24) -> np.ndarray:
    """A noisy (size, size) uint8 picture of ``name``'s pattern."""
    y, x = np.mgrid[:size, :size]
    phase = rng.integers(0, 4)
    if name == "horizontal":
        picture = ((y + phase) // 3) % 2
    elif name == "vertical":
        picture = ((x + phase) // 3) % 2
    else:
        cy, cx = rng.integers(6, size - 6, size=2)
        picture = (y - cy) ** 2 + (x - cx) ** 2 < 25
    noisy = picture * 180 + rng.integers(0, 60, size=(size, size))
    return noisy.clip(0, 255).astype(np.uint8)


def make_folder(root: Path, per_class: int = 40, seed: int = 0) -> Path:
    """root/<class>/<n>.png: grey PNGs, every fifth one saved as RGB (a mixed-mode folder)."""
    rng = np.random.default_rng(seed)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            image = Image.fromarray(pattern(name, rng), mode="L")
            (image.convert("RGB") if index % 5 == 0 else image).save(root / name / f"{index}.png")
    return root


def test_folder_gives_classes_channels_splits_and_train_statistics(tmp_path: Path) -> None:
    data = ImageFolderDataModule(root=str(make_folder(tmp_path / "images")), image_size=16, batch_size=16)
    assert data.class_names == list(CLASSES)
    assert (data.num_classes, data.num_channels) == (3, 3)  # grey and RGB mixed: all RGB
    data.setup("fit")
    sizes = [len(data.train_set), len(data.val_set), len(data.test_set)]
    assert sum(sizes) == 120 and sizes[1] == pytest.approx(18, abs=1) and sizes[2] == pytest.approx(18, abs=1)
    train = data.train_set.tensors[0].float() / 255  # (N, 3, 16, 16) uint8 in memory
    assert data.train_set.tensors[0].dtype == torch.uint8
    assert data.mean == pytest.approx(train.mean(dim=(0, 2, 3)).tolist(), abs=1e-5)
    images, labels = data.transform_batch(next(iter(data.val_dataloader())), training=False)
    assert images.shape == (16, 3, 16, 16) and images.dtype == torch.float32 and labels.dtype == torch.int64
{%- if cookiecutter.use_prepared == "yes" %}


def prepare_folder(tmp_path: Path, root: Path, *extra: str) -> Path:
    """``make prepare`` of ``root`` at 16 px on two processes; returns the prepared folder."""
    out = tmp_path / "prepared"
    config = [f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    prepare_main(["--out", str(out), "--workers", "2", *config, "--data.init_args.image_size=16", *extra])
    return out
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


def test_a_prepared_folder_holds_exactly_what_memory_would(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    prepared = prepare_folder(tmp_path, root)
    in_memory = ImageFolderDataModule(root=str(root), image_size=16)
    on_disk = ImageFolderDataModule(root=str(root), image_size=16, prepared=str(prepared))
    for data in (in_memory, on_disk):
        data.setup("fit")
    for split in ("train", "val", "test"):
        expected, actual = (stack_samples(getattr(data, f"{split}_set")) for data in (in_memory, on_disk))
        assert all(torch.equal(a, b) for a, b in zip(expected, actual, strict=True)), split
    assert (on_disk.class_names, on_disk.mode) == (list(CLASSES), "RGB")
    assert (on_disk.mean, on_disk.std) == (in_memory.mean, in_memory.std)  # exact integer sums, both ways
    assert in_memory.mean == pytest.approx((in_memory.train_set.tensors[0].float() / 255).mean((0, 2, 3)).tolist())

    # Settings that shaped the data must match it; a changed source is named with the fix.
    with user_error(r"data.image_size=32, but data.prepared=.* was prepared with image_size=16: set data.image_size"):
        main(["fit", *shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.prepared={prepared}"])
    # Labels altered in place (same size) are caught by the shard's SHA-256; labels beyond the classes
    # by their range, even when the manifest's hash was rewritten to match.
    altered = shutil.copytree(prepared, tmp_path / "altered")
    (labels,) = (altered / "train").glob("labels-*.bin")
    values = np.fromfile(labels, dtype=np.int64)
    labels.write_bytes(values[::-1].tobytes())
    with pytest.raises(ValueError, match=r"labels-00000.bin has another SHA-256 than prepare recorded"):
        ImageFolderDataModule(root=str(root), image_size=16, prepared=str(altered)).setup("fit")
    values[0] = len(CLASSES) + 4
    labels.write_bytes(values.tobytes())
    manifest = json.loads((altered / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["fields"]["labels"]["shards"][0]
    shard.update(sha256=file_sha256(labels), sample_sha256=sampled_sha256(labels))
    (altered / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=rf"train/labels holds {len(CLASSES) + 4}, outside 0..{len(CLASSES) - 1}"):
        ImageFolderDataModule(root=str(root), image_size=16, prepared=str(altered)).setup("fit")

    (root / "blobs" / "0.png").unlink()
    with pytest.raises(ValueError, match=r"source .*images changed since prepare \(120 files, .* 119 files, .*prepare"):
        ImageFolderDataModule(root=str(root), image_size=16, prepared=str(prepared)).setup("fit")
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow  # a SIGTERM and a resume: two more processes (CI: .ci/slow)
def test_a_prepared_run_trains_and_resumes_exactly_as_in_memory_after_the_folder_moved(tmp_path: Path) -> None:
    # The reference: in memory, 2 epochs of 6 batches. The prepared run reads from disk through two
    # loader workers, is stopped by SIGTERM after step 8 (mid-epoch 2), its image folder moved away,
    # and resumed: its weights and optimizer state must equal the reference's.
    root = make_folder(tmp_path / "images")
    prepared = prepare_folder(tmp_path, root)
    common = [f"--config={EXPERIMENT}", "--data.init_args.image_size=16", "--data.init_args.batch_size=16"]
    common += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    common += ["--trainer.log_every_n_steps=3"]
    common += [f"--data.init_args.root={root}"]
    assert_prepared_run_resumes_as_in_memory(tmp_path, common, prepared, root, step=8)
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow
def test_a_prepared_run_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Two processes, each reading its half of the prepared training split (3 batches of 16 an
    # epoch), 2 epochs; SIGTERM after step 4, mid-epoch 2.
    root = make_folder(tmp_path / "images")
    prepared = prepare_folder(tmp_path, root)
    args = [f"--config={EXPERIMENT}", "--data.init_args.image_size=16", "--data.init_args.batch_size=16"]
    args += [f"--data.init_args.root={root}", f"--data.init_args.prepared={prepared}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=3"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda folder: [*shrunk_args(folder), *args], step=4)
{%- else %}


@pytest.mark.slow
def test_an_image_folder_run_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Two processes, each reading its half of the training split (3 batches of 16 an epoch), 2 epochs;
    # SIGTERM after step 4, mid-epoch 2.
    root = make_folder(tmp_path / "images")
    args = [f"--config={EXPERIMENT}", "--data.init_args.image_size=16", "--data.init_args.batch_size=16"]
    args += [f"--data.init_args.root={root}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=3"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda folder: [*shrunk_args(folder), *args], step=4)
{%- endif %}


def test_make_resume_rebuilds_an_experiment_run_from_its_own_config(tmp_path: Path) -> None:
    # `make resume` names the project's default config (digits: 10 classes of 8 px grey images); a
    # run started with the image-folder experiment (3 classes, 16 px, RGB) must continue as that run.
    root = make_folder(tmp_path / "images", per_class=12)
    args = [*shrunk_args(tmp_path), "--test_after_fit=false"]
    experiment = [f"--config={EXPERIMENT}", f"--data.init_args.root={root}", "--data.init_args.image_size=16"]
    first = main(["fit", *args, *experiment, "--data.init_args.batch_size=16"])
    steps = first.trainer.global_step
    resumed = main(["fit", *args, "--resume=true", "--trainer.max_epochs=2"])  # what `make resume ARGS=...` runs
    assert isinstance(resumed.datamodule, ImageFolderDataModule)
    assert (resumed.datamodule.hparams.root, resumed.datamodule.num_classes) == (str(root), 3)
    assert resumed.trainer.global_step == 2 * steps
    (run,) = (tmp_path / "logs" / "test").iterdir()
    assert sorted(path.name for path in run.glob("config*.yaml")) == ["config-resumed-1.yaml", "config.yaml"]


def test_make_resume_refuses_in_one_line_an_argument_that_changes_the_runs_model(tmp_path: Path) -> None:
    args = [*shrunk_args(tmp_path), "--test_after_fit=false", "--trainer.limit_train_batches=2"]
    main(["fit", *args, "--trainer.limit_val_batches=1"])
    (run,) = (tmp_path / "logs" / "test").iterdir()
    other_net = "--model.init_args.net={{ cookiecutter.package_name }}.nets.MLP"
    with user_error(
        rf"--resume=true continues the run with its own config \({re.escape(str(run / 'config.yaml'))}\); the "
        rf"arguments given on top of it \(--model.init_args.compile=false {re.escape(other_net)}\) change the model "
        r"it trained: leave them out, or start a new run \(no --resume\)"
    ):
        main(["fit", *args, "--resume=true", "--trainer.max_epochs=2", other_net])
    assert sorted(path.name for path in run.glob("config*.yaml")) == ["config.yaml"]  # nothing written for it


@pytest.mark.slow  # a SIGTERM and a resume: two processes
def test_an_interrupted_experiment_run_continues_with_the_command_it_printed(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=12)
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    args += ["--data.init_args.image_size=16", "--data.init_args.batch_size=16", "--trainer.max_epochs=2"]
    args += ["--test_after_fit=false"]
    interrupted = fit_stopped_by_signal(args, step=3)
    printed = (tmp_path / "fit.log").read_text()
    command = re.search(r"Continue this run with `make resume` \(python (-m .*)\)", printed)
    assert command, printed[-2000:]
    continued = [sys.executable, *shlex.split(command[1])]
    done = subprocess.run(continued, cwd=ROOT, env=with_tests_importable(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    data = ImageFolderDataModule(root=str(root), image_size=16, batch_size=16)
    data.setup("fit")
    last = read_checkpoint(interrupted.parent / "last.ckpt")
    assert last["global_step"] == 2 * len(data.train_dataloader()) > 3  # both epochs, as if uninterrupted
    assert last["datamodule_hyper_parameters"]["root"] == str(root)


def wide_folder(root: Path, per_class: int = 12) -> Path:
    """root/<class>/<n>.png: grey 60 x 20 pictures, a class pattern in the centre square, plain bands beside it."""
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            picture = np.full((20, 60), 128, np.uint8)
            picture[:, 20:40] = pattern(name, rng, size=20)
            Image.fromarray(picture, mode="L").save(root / name / f"{index}.png")
    return root


def test_images_at_real_sizes_keep_their_aspect_and_are_cropped_at_random_in_training_centrally_elsewhere(
    tmp_path: Path,
) -> None:
    # The ImageNet recipe at small scale: a 20 px square kept of each image (shorter side), a 16 px crop.
    root = wide_folder(tmp_path / "images")
    settings = {"root": str(root), "image_size": 20, "crop_size": 16, "crop_scale": (0.25, 1.0), "batch_size": 8}
    data = ImageFolderDataModule(**settings)
    data.setup("fit")
    # Kept: the centre 20 x 20 square, not the whole picture squeezed (the bands would then fill 2/3).
    for path in sorted((root / "vertical").glob("*.png"))[:3]:
        centre = np.asarray(Image.open(path))[:, 20:40]
        stored = data.read_inputs(str(path))[1][0, 0]  # (20, 20), as {{ "INPUTS= and serving decode" if cookiecutter.use_serving == "yes" else "INPUTS= decodes" }} it
        assert np.abs(stored.numpy() - centre).max() <= 1

    # Evaluation takes the centre 16 x 16 crop; inference ({{ "predict, export, serve" if cookiecutter.use_serving == "yes" else "predict" }}) crops the same from raw pixels.
    raw, labels = next(iter(data.val_dataloader()))  # (B, 1, 20, 20) uint8
    images, _ = data.transform_batch((raw, labels), training=False)
    assert images.shape[1:] == (1, 16, 16)
    assert torch.equal(images, data.normalize(raw[..., 2:18, 2:18].float() / 255.0))
    assert torch.allclose(data.inference_transform()(raw.float()), images, atol=1e-6)
{%- if cookiecutter.use_serving == "yes" %}
    assert data.request_schema()["shape"] == [1, 20, 20]
{%- endif %}

    # Training: random resized crops of 16 px, on the batch's device; two draws differ.
    batch = next(iter(data.train_dataloader()))
    first, second = (data.transform_batch(batch, training=True)[0] for _ in range(2))
    assert first.shape == second.shape == (8, 1, 16, 16) and not torch.equal(first, second)

{%- if cookiecutter.use_prepared == "yes" %}

    # The prepared path stores the same squares; a prepared data set made without the crop is refused.
    config = [f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    sizes = ["--data.init_args.image_size=20", "--data.init_args.crop_size=16"]
    prepare_main(["--out", str(tmp_path / "prepared"), "--workers", "2", *config, *sizes])
    on_disk = ImageFolderDataModule(**settings, prepared=str(tmp_path / "prepared"))
    on_disk.setup("fit")
    for split in ("train", "val", "test"):
        expected, actual = (stack_samples(getattr(module, f"{split}_set")) for module in (data, on_disk))
        assert all(torch.equal(a, b) for a, b in zip(expected, actual, strict=True)), split
    uncropped = [*shrunk_args(tmp_path), *config[1:], sizes[0]]
    with user_error(r"data.crop_size=None, but data.prepared=.* was prepared with crop_size=16: set data.crop_size"):
        main(["fit", *uncropped, f"--data.init_args.prepared={tmp_path / 'prepared'}"])
{%- else %}

    # A crop larger than the stored square is refused before anything trains.
    config = [f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    uncropped = [*shrunk_args(tmp_path), *config, "--data.init_args.image_size=20"]
{%- endif %}
    with user_error(r"data.crop_size=24 must be between 4 and data.image_size=20 pixels"):
        main(["fit", *uncropped, "--data.init_args.crop_size=24"])
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow
def test_a_cropping_model_trains_on_prepared_data_and_predicts_raw_squares_as_it_was_tested(tmp_path: Path) -> None:
{%- if cookiecutter.use_serving == "yes" %}
    # prepare -> train -> test on the streamed path with crops; the shipped model takes 20 px squares,
    # and the export scores the test split as training's test did.
{%- else %}
    # prepare -> train -> test on the streamed path with crops, the training folder moved away.
{%- endif %}
    root = wide_folder(tmp_path / "images", per_class=30)
    config = [f"--config={EXPERIMENT}", f"--data.init_args.root={root}", "--data.init_args.image_size=20"]
    config += ["--data.init_args.crop_size=16", "--data.init_args.crop_scale=[0.5,1.0]"]
    config += ["--data.init_args.batch_size=16"]
    prepare_main(["--out", str(tmp_path / "prepared"), f"--config={CONFIGS / 'default.yaml'}", *config])
    shutil.move(root, tmp_path / "moved")
    args = [*shrunk_args(tmp_path), *config, f"--data.init_args.prepared={tmp_path / 'prepared'}"]
    cli = main(["fit", *args, "--trainer.max_epochs=12", "--trainer.log_every_n_steps=2"])
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.85
{%- if cookiecutter.use_serving == "yes" %}
    trained = load_trained(cli.trainer.checkpoint_callback.best_model_path)
    record = export_all(trained, tmp_path / "export", onnx=importlib.util.find_spec("onnxruntime") is not None)
    assert record["input"]["shape"] == ["batch", 1, 20, 20]
    for kind in record["files"]:
        assert record["test_scores"][kind]["acc"] == pytest.approx(summary["metrics"]["test/acc"], abs=1e-6)
{%- endif %}
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


def test_prepare_names_a_corrupt_image_or_counts_what_it_skipped(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=10)
    whole = (root / "vertical" / "0.png").read_bytes()
    (root / "vertical" / "truncated.png").write_bytes(whole[: len(whole) // 2])  # the header reads, the pixels do not
    with user_error(r"truncated.png: not a readable image \(.*\); remove or replace the file, or set data.init_args"):
        prepare_folder(tmp_path, root)
    assert not (tmp_path / "prepared").exists() and not list(tmp_path.glob(".prepared.partial-*"))
    prepared = prepare_folder(tmp_path, root, "--data.init_args.skip_unreadable=true")
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert manifest["state"]["skipped"] == 1 and sum(s["count"] for s in manifest["splits"].values()) == 30
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}


def test_export_needs_no_training_folder_and_checks_on_inputs_given(tmp_path: Path, capsys) -> None:
    root = make_folder(tmp_path / "images", per_class=12)
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    cli = main(["fit", *args, "--data.init_args.image_size=16", "--data.init_args.batch_size=8"])
    checkpoint = Path(cli.trainer.checkpoint_callback.best_model_path)
    samples = shutil.copytree(root / "vertical", tmp_path / "samples")
    root.rename(tmp_path / "moved")  # the training folder is gone: predict works, and so must export
    # model.pt2 alone: ONNX needs torch >= 2.9, and what is checked on which inputs is the same for both.
    record = export_all(load_trained(checkpoint), tmp_path / "export", onnx=False)
    assert record["checked_on"].startswith("64 random inputs of the checkpoint's shape [3, 16, 16]")
    assert record["test_scores"] == {} and set(record["max_abs_diff"]) == {"pt2"}
    given = ["--output", str(tmp_path / "given"), "--inputs", str(samples), "--onnx", "false"]
    export_main(["--ckpt", str(checkpoint), *given])
    printed = capsys.readouterr().out
    assert f"checked on INPUTS={samples}" in printed and "; test {" not in printed
    assert json.loads((tmp_path / "given" / "export.json").read_text())["checked_on"] == f"INPUTS={samples}"
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


def test_prepare_prints_the_command_that_trains_on_what_it_wrote(tmp_path: Path, capsys) -> None:
    root = make_folder(tmp_path / "images")
    prepared = prepare_folder(tmp_path, root)
    printed = capsys.readouterr().out
    command = re.search(r"^train on it: python -m \w+ (fit .*)$", printed, re.MULTILINE)
    assert command, printed
    quick = [arg for arg in shrunk_args(tmp_path) if not arg.startswith("--config")]  # files land in tmp_path
    cli = main([*shlex.split(command[1]), *quick, "--test_after_fit=false"])
    assert (cli.datamodule.hparams.prepared, cli.datamodule.num_classes) == (str(prepared), 3)
    # `make prepare` passes the project's default config first: the printed command is make's own.
    made = train_command(["--config", "configs/default.yaml", "--config", "configs/experiments/image-folder.yaml"], "p")
    assert made == "make train ARGS='--config configs/experiments/image-folder.yaml --data.init_args.prepared=p'"
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


def test_prepare_of_the_bundled_digits_says_which_data_has_a_prepared_form(tmp_path: Path) -> None:
    with user_error(r"data: DigitsDataModule has no prepared form .*--config configs/experiments/<experiment>.yaml"):
        prepare_main(["--out", str(tmp_path / "prepared"), f"--config={CONFIGS / 'default.yaml'}"])
    assert not (tmp_path / "prepared").exists()
{%- endif %}


def test_given_split_folders_are_used(tmp_path: Path) -> None:
    make_folder(tmp_path / "images" / "train", per_class=20)
    make_folder(tmp_path / "images" / "test", per_class=5, seed=1)
    data = ImageFolderDataModule(root=str(tmp_path / "images"), image_size=16, batch_size=8)
    data.setup("fit")
    assert len(data.test_set) == 15  # the test folder as given
    assert len(data.train_set) + len(data.val_set) == 60  # validation held out of train/
    assert torch.bincount(data.val_set.tensors[1]).tolist() == [3, 3, 3]  # val_fraction 0.15 of train/, stratified
    # k-fold with test/ given: the folds are train/'s, each image validated on once
    folds = [
        ImageFolderDataModule(root=str(tmp_path / "images"), image_size=16, batch_size=8, num_folds=4, fold=k)
        for k in range(4)
    ]
    for fold in folds:
        fold.setup("fit")
    assert [(len(f.train_set), len(f.val_set), len(f.test_set)) for f in folds] == [(45, 15, 15)] * 4
    validated = torch.cat([fold.val_set.tensors[0].flatten(1) for fold in folds])
    assert len(torch.unique(validated, dim=0)) == 60
    # val/ given instead: the test split is cut from train/
    (tmp_path / "images" / "test").rename(tmp_path / "images" / "val")
    data = ImageFolderDataModule(root=str(tmp_path / "images"), image_size=16, batch_size=8, test_fraction=0.25)
    data.setup("fit")
    assert (len(data.train_set), len(data.val_set), len(data.test_set)) == (45, 15, 15)


def test_a_run_reports_the_files_bytes_classes_splits_and_images_per_class_it_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    make_folder(tmp_path / "images" / "train", per_class=20)
    make_folder(tmp_path / "images" / "test", per_class=5, seed=1)
    (tmp_path / "images" / "train" / "notes.txt").write_text("not an image: not read")
    root = tmp_path / "images"
    data = ImageFolderDataModule(root=str(root), image_size=16, batch_size=8, val_fraction=0.25)
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    megabytes = sum(path.stat().st_size for path in root.rglob("*.png")) / 1e6
    train, val = len(data.train_set), len(data.val_set)
    assert (train, val) == (45, 15)
    per_class = [
        f"{name} {(data.train_set.tensors[1] == label).sum()}/{(data.val_set.tensors[1] == label).sum()}/5"
        for label, name in enumerate(CLASSES)
    ]
    assert caplog.text.count("Images of data.root=") == 1
    report = caplog.text[caplog.text.index("Images of data.root=") :].splitlines()[:3]
    assert report == [
        f"Images of data.root={root}: 75 files ({megabytes:.1f} MB), 3 classes, decoded as RGB at 16 px",
        "  splits: train 45 (train/ less the cuts), test 15 (test/), val 15 (seeded stratified cuts of train/, "
        "split_seed=0)",
        f"  images per class (train/val/test): {', '.join(per_class)}",
    ]


def test_a_train_folder_alone_gives_all_three_splits(tmp_path: Path) -> None:
    make_folder(tmp_path / "images" / "train", per_class=20)
    data = ImageFolderDataModule(root=str(tmp_path / "images"), image_size=16, batch_size=8)
    data.setup("fit")
    sizes = [len(data.train_set), len(data.val_set), len(data.test_set)]
    assert sum(sizes) == 60 and sizes[1] == pytest.approx(9, abs=1) and sizes[2] == pytest.approx(9, abs=1)


def test_a_folder_copied_from_a_mac_or_a_notebook_reads_its_nested_images_and_leaves_the_rest_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A class folder's images at any depth count, as torchvision's ImageFolder reads them (they were left
    # out without a word); what a Mac, a zip made on one and Jupyter leave beside them is no class and no image.
    root = make_folder(tmp_path / "images", per_class=20)
    nested = root / "blobs" / "2026" / "march"
    nested.mkdir(parents=True)
    for index in range(4):
        shutil.copy(root / "blobs" / f"{index}.png", nested / f"{index}.png")
    for name in CLASSES:
        (root / name / ".DS_Store").write_bytes(b"Bud1 not an image")
        (root / name / "._0.png").write_bytes(b"AppleDouble, not a PNG")  # macOS's copy on a foreign disk
    (root / "__MACOSX" / "blobs").mkdir(parents=True)
    (root / "__MACOSX" / "blobs" / "._1.png").write_bytes(b"AppleDouble, not a PNG")
    (root / ".ipynb_checkpoints").mkdir()
    shutil.copy(root / "vertical" / "0.png", root / ".ipynb_checkpoints" / "0-checkpoint.png")
    data = ImageFolderDataModule(root=str(root), image_size=16, batch_size=8)
    assert data.class_names == list(CLASSES)
    with caplog.at_level(logging.INFO):
        data.setup("fit")
    assert sum(len(split) for split in (data.train_set, data.val_set, data.test_set)) == 64  # 24 + 20 + 20
    # The run's report says what it left out: the three ._0.png copies, __MACOSX's and the notebook's copy.
    assert "64 files" in caplog.text
    assert "5 left out as tools' files (.ipynb_checkpoints/0-checkpoint.png, " in caplog.text
    ids, images = data.read_inputs(str(root / "blobs"))  # INPUTS= reads a folder the same way
    assert len(ids) == 24 and "2026/march/3.png" in ids and not [i for i in ids if "/." in f"/{i}"]
    assert images.shape == (24, 3, 16, 16)


# ---- a Hugging Face image dataset: Parquet or Arrow shards of an image column and a label column -------------


def folder_rows(root: Path) -> list[tuple[bytes, int]]:
    """The (PNG bytes, label) of a :func:`make_folder` folder, in the order the folder form reads it."""
    files = [(label, sorted((root / name).glob("*.png"), key=str)) for label, name in enumerate(CLASSES)]
    return [(path.read_bytes(), label) for label, paths in files for path in paths]


def write_shard(path: Path, rows: list[tuple[bytes | None, int | None]], form: str = "parquet") -> Path:
    """``rows`` as a Hugging Face ``datasets`` shard writes them: an ``image`` column of ``{bytes, path}`` (the
    Image feature), a ``label`` column of int64 whose ``ClassLabel`` names are CLASSES, in the schema's
    ``huggingface`` metadata; Parquet, or an Arrow stream (``save_to_disk``'s ``data-*.arrow``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    image_feature, label_feature = {"_type": "Image"}, {"names": list(CLASSES), "_type": "ClassLabel"}
    features = {"image": image_feature, "label": label_feature}
    kind = pa.struct({"bytes": pa.binary(), "path": pa.string()})
    image = pa.array([{"bytes": data, "path": None} for data, _ in rows], kind)
    table = pa.table({"image": image, "label": pa.array([label for _, label in rows], pa.int64())})
    info = dict(info=dict(features=features))
    table = table.replace_schema_metadata({"huggingface": json.dumps(info)})
    path.parent.mkdir(parents=True, exist_ok=True)
    if form == "parquet":
        pq.write_table(table, path)
    else:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def splits_of(data: ImageFolderDataModule) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    data.setup("fit")
    return {split: getattr(data, f"{split}_set").tensors for split in ("train", "val", "test")}


def test_a_dataset_shard_gives_the_split_and_tensors_its_image_folder_gives(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    shard = write_shard(tmp_path / "dataset" / "images.parquet", folder_rows(root))  # no split named: one pool
    folder = ImageFolderDataModule(root=str(root), image_size=16, batch_size=16)
    for dataset_root in (shard, shard.parent):  # the file, or its folder
        dataset = ImageFolderDataModule(root=str(dataset_root), image_size=16, batch_size=16)
        assert (dataset.class_names, dataset.mode) == (list(CLASSES), "RGB")  # the ClassLabel's names
        expected, got = splits_of(folder), splits_of(dataset)
        for split in expected:
            assert torch.equal(got[split][0], expected[split][0]) and torch.equal(got[split][1], expected[split][1])
        assert (dataset.mean, dataset.std) == (folder.mean, folder.std)
    for fold in range(3):  # k-fold (data.num_folds): the same folds of the same rows
        folds = {"num_folds": 3, "fold": fold, "image_size": 16, "batch_size": 16}
        expected, got = (splits_of(ImageFolderDataModule(root=str(r), **folds)) for r in (root, shard.parent))
        assert all(torch.equal(a, b) for s in expected for a, b in zip(got[s], expected[s], strict=True)), fold
{%- if cookiecutter.use_prepared == "yes" %}
    # make prepare of the dataset holds what memory does; a changed shard is named as a changed image would be.
    prepared = prepare_folder(tmp_path, shard.parent)
    on_disk = ImageFolderDataModule(root=str(shard.parent), image_size=16, prepared=str(prepared))
    on_disk.setup("fit")
    for split, tensors in splits_of(dataset).items():
        stored = stack_samples(getattr(on_disk, f"{split}_set"))
        assert all(torch.equal(a, b) for a, b in zip(tensors, stored, strict=True)), split
    write_shard(shard, folder_rows(root)[::-1])
    with pytest.raises(ValueError, match=r"changed since"):
        ImageFolderDataModule(root=str(shard.parent), image_size=16, prepared=str(prepared)).setup("fit")
{%- endif %}


def test_a_datasets_split_files_are_its_splits_in_parquet_and_arrow(tmp_path: Path) -> None:
    rows, test_rows = folder_rows(make_folder(tmp_path / "images")), folder_rows(make_folder(tmp_path / "held", 4, 1))
    hub = tmp_path / "hub"  # the Hub's layout: data/<split>-<shard>-of-<shards>.parquet
    write_shard(hub / "data" / "train-00000-of-00002.parquet", rows[::2])
    write_shard(hub / "data" / "train-00001-of-00002.parquet", rows[1::2])
    write_shard(hub / "data" / "test-00000-of-00001.parquet", test_rows)
    disk = tmp_path / "disk"  # save_to_disk's layout: <split>/data-<shard>-of-<shards>.arrow, Arrow streams
    write_shard(disk / "train" / "data-00000-of-00002.arrow", rows[::2], form="arrow")
    write_shard(disk / "train" / "data-00001-of-00002.arrow", rows[1::2], form="arrow")
    write_shard(disk / "test" / "data-00000-of-00001.arrow", test_rows, form="arrow")
    (disk / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    from_hub = splits_of(ImageFolderDataModule(root=str(hub), image_size=16, batch_size=8))
    assert from_hub["test"][1].tolist() == [label for _, label in test_rows]  # the test shard, in its order
    assert len(from_hub["train"][0]) + len(from_hub["val"][0]) == 120  # validation held out of the train shards
    from_disk = splits_of(ImageFolderDataModule(root=str(disk), image_size=16, batch_size=8))
    for split in from_hub:
        assert all(torch.equal(a, b) for a, b in zip(from_hub[split], from_disk[split], strict=True))


def test_a_hub_dataset_is_read_from_the_local_cache_by_its_address(tmp_path: Path, monkeypatch) -> None:
    # hf://datasets/<owner>/<name>: the snapshot a dataset's download left in the cache reads as the same shards in a
    # folder; without huggingface_hub (a bake without pretrained nets) the address says what installs it.
    address = "hf://datasets/owner/digits"
    try:
        import huggingface_hub.constants
    except ImportError:
        with pytest.raises(FileNotFoundError, match=r"is a Hugging Face dataset, read with huggingface_hub: `pip ins"):
            ImageFolderDataModule(root=address, image_size=16).setup("fit")
        return
    cache = tmp_path / "hf-cache"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    rows = folder_rows(make_folder(tmp_path / "images", per_class=10))
    for root in (cached_snapshot(cache, "owner/digits", "dataset"), tmp_path / "local"):
        write_shard(root / "data" / "train-00000-of-00001.parquet", rows[:24])
        write_shard(root / "data" / "test-00000-of-00001.parquet", rows[24:])
    from_cache = splits_of(ImageFolderDataModule(root=address, image_size=16, batch_size=8))
    local = splits_of(ImageFolderDataModule(root=str(tmp_path / "local"), image_size=16, batch_size=8))
    for split in local:
        assert all(torch.equal(a, b) for a, b in zip(from_cache[split], local[split], strict=True)), split
    with pytest.raises(FileNotFoundError, match=r"`hf download owner/other --repo-type dataset`, or give its folder"):
        ImageFolderDataModule(root="hf://datasets/owner/other", image_size=16).setup("fit")


def test_a_dataset_written_by_hugging_face_datasets_reads_as_ours(tmp_path: Path, caplog) -> None:
    datasets = pytest.importorskip("datasets", reason="the datasets library is not installed (pip install datasets)")
    rows = folder_rows(make_folder(tmp_path / "images", per_class=10))
    features = datasets.Features({"picture": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})
    pictures = [Image.open(io.BytesIO(data)) for data, _ in rows]
    written = datasets.Dataset.from_dict({"picture": pictures, "label": [y for _, y in rows]}, features=features)
    datasets.DatasetDict({"train": written, "test": written.select(range(0, 30, 3))}).save_to_disk(tmp_path / "disk")
    write_shard(tmp_path / "ours" / "train" / "data.arrow", rows, form="arrow")
    write_shard(tmp_path / "ours" / "test" / "data.arrow", rows[::3], form="arrow")
    theirs = ImageFolderDataModule(root=str(tmp_path / "disk"), image_column="picture", image_size=16, batch_size=4)
    with caplog.at_level(logging.INFO):
        got = splits_of(theirs)
    report = "40 images (0.0 MB), 3 classes, decoded as RGB at 16 px\n  splits: train 25 (the train shards less"
    assert report in caplog.text and "test 10 (the test shards)" in caplog.text
    expected = splits_of(ImageFolderDataModule(root=str(tmp_path / "ours"), image_size=16, batch_size=4))
    assert all(torch.equal(got[split][1], expected[split][1]) for split in got)  # the same labels, split alike


def test_a_dataset_without_class_label_names_takes_its_sorted_labels_as_classes(tmp_path: Path) -> None:
    # A binary image column and text labels, as a table exported elsewhere holds them (no huggingface metadata).
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = make_folder(tmp_path / "images", per_class=10)
    rows = folder_rows(root)
    names = {0: "stripes-b", 1: "stripes-a", 2: "dots"}  # another order than the folder's
    table = pa.table({"image": pa.array([data for data, _ in rows]), "label": [names[y] for _, y in rows]})
    pq.write_table(table, tmp_path / "export.parquet")
    data = ImageFolderDataModule(root=str(tmp_path / "export.parquet"), image_size=16, batch_size=4)
    assert data.class_names == ["dots", "stripes-a", "stripes-b"]
    folder = splits_of(ImageFolderDataModule(root=str(root), image_size=16, batch_size=4))
    by_image = {image.numpy().tobytes(): int(y) for xs, ys in folder.values() for image, y in zip(xs, ys, strict=True)}
    for images, labels in splits_of(data).values():  # folder class y is named names[y]: class 2 - y here
        assert [2 - by_image[image.numpy().tobytes()] for image in images] == labels.tolist()


def hostile_shard(kind: str, path: Path, rows: list[tuple[bytes, int]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True)
    if kind == "no label column":
        pq.write_table(pa.table({"image": pa.array([data for data, _ in rows])}), path)
    elif kind == "an image column of numbers":
        pq.write_table(pa.table({"image": pa.array(range(len(rows))), "label": pa.array([y for _, y in rows])}), path)
    elif kind == "a row that names a path":
        write_shard(path, [(None, 0), *rows])
    elif kind == "a label outside its classes":
        write_shard(path, [*rows, (rows[0][0], 7)])
    elif kind == "a shard of no split":
        write_shard(path.parent / "train-00000-of-00001.parquet", rows)
        write_shard(path.parent / "extra.parquet", rows)
    else:
        path.write_bytes(b"PAR1 not really")
    return path.parent if kind == "a shard of no split" else path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("no label column", r"x\.parquet has no column 'label' \(its columns: image\); name the image and label"),
        ("an image column of numbers", r"column 'image' holds int64, not encoded images"),
        ("a row that names a path", r"x\.parquet, row 0: no image bytes \(a path is never read"),
        ("a label outside its classes", r"x\.parquet, row 12: label 7 is not one of the 3 classes the dataset"),
        ("a shard of no split", r"1 file\(s\) name no split \(extra\.parquet\)"),
        ("a broken file", r"x\.parquet is not a readable Parquet table"),
    ],
)
def test_a_bad_dataset_is_refused_in_one_line_before_training(tmp_path: Path, kind: str, message: str) -> None:
    rows = folder_rows(make_folder(tmp_path / "images", per_class=4))
    root = hostile_shard(kind, tmp_path / "dataset" / "x.parquet", rows)
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"])
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))


@pytest.mark.slow
def test_a_dataset_in_parquet_shards_trains_to_90_percent_and_predicts_its_images(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    rows = folder_rows(root)
    write_shard(tmp_path / "dataset" / "data" / "train-00000-of-00002.parquet", rows[::2])
    write_shard(tmp_path / "dataset" / "data" / "train-00001-of-00002.parquet", rows[1::2])
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={tmp_path / 'dataset'}"]
    size = ["--data.init_args.image_size=16", "--data.init_args.batch_size=16", "--trainer.log_every_n_steps=5"]
    cli = main(["fit", *args, *size, "--trainer.max_epochs=12"])
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.9
    shutil.rmtree(tmp_path / "dataset")  # the model stands alone
    path = predict(ckpt=cli.trainer.checkpoint_callback.best_model_path, inputs=str(root / "vertical"),
                   output=tmp_path / "p.csv", accelerator="cpu")  # fmt: skip
    with path.open() as file:
        assert sum(row["label"] == "vertical" for row in csv.DictReader(file)) >= 36


@pytest.mark.slow
def test_a_dataset_run_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # 6 batches of 16 an epoch, 2 epochs, SIGTERM after step 8 (mid-epoch 2).
    # Under DDP the engine splits and resumes every map-style data set alike (this file's DDP run, on prepared or
    # in-memory data);
    # what is the data set's own, the same examples in the same order after a restart, is held here in one process.
    shard = write_shard(tmp_path / "dataset" / "train-00000-of-00001.parquet", folder_rows(make_folder(tmp_path / "i")))
    args = [f"--config={EXPERIMENT}", "--data.init_args.image_size=16", "--data.init_args.batch_size=16"]
    args += [f"--data.init_args.root={shard.parent}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=3"]
    assert_run_resumes_exactly(tmp_path, lambda folder: [*shrunk_args(folder), *args], step=8)


@pytest.mark.slow
def test_own_image_folder_trains_to_90_percent(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    size = ["--data.init_args.image_size=16", "--data.init_args.batch_size=16", "--trainer.log_every_n_steps=5"]
    cli = main(["fit", *args, *size, "--trainer.max_epochs=12"])
    assert cli.model.net.blocks[0].conv1.in_channels == 3  # linked from the data
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.9
{%- if cookiecutter.use_serving == "yes" %}

    # Shipped: the export takes raw 8-bit pixels and scores what training measured; predict reads a folder.
    trained = load_trained(cli.trainer.checkpoint_callback.best_model_path)
    record = export_all(trained, tmp_path / "export", onnx=importlib.util.find_spec("onnxruntime") is not None)
    for kind in record["files"]:
        assert record["test_scores"][kind]["acc"] == pytest.approx(summary["metrics"]["test/acc"], abs=1e-6)
    assert record["input"]["shape"] == ["batch", 3, 16, 16]
{%- else %}

    # Shipped: predict reads a folder.
    trained = load_trained(cli.trainer.checkpoint_callback.best_model_path)
{%- endif %}
    path = predict(ckpt=trained.checkpoint, inputs=str(root / "vertical"), output=tmp_path / "p.csv", accelerator="cpu")
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 40 and rows[0]["id"] == "0.png"
    assert sum(row["label"] == "vertical" for row in rows) >= 36

    # The trained model stands alone: a class folder added after training (sorted first) shifts
    # nothing, and a folder moved away is not needed to predict on files{{ " or to serve" if cookiecutter.use_serving == "yes" else "" }}.
    samples = tmp_path / "samples"
    shutil.copytree(root / "vertical", samples)
    before = predict(ckpt=trained.checkpoint, inputs=str(samples), output=tmp_path / "before.csv", accelerator="cpu")
    make_folder(tmp_path / "extra", per_class=3)
    shutil.move(tmp_path / "extra" / "blobs", root / "aaa-new-class")
    for moved in (False, True):
        if moved:
            root.rename(tmp_path / "moved")
        again = load_trained(trained.checkpoint)
        assert again.class_names == list(CLASSES) and again.datamodule.num_channels == 3
        after = predict(ckpt=trained.checkpoint, inputs=str(samples), output=tmp_path / "after.csv", accelerator="cpu")
        assert after.read_text() == before.read_text()
        # What needs the training folder (the test split) says what is wrong, in one line.
        message = "no such folder" if moved else r"class folders \['aaa-new-class', .*\] are not the classes"
        with user_error(message):
            predict_main(["--ckpt", str(trained.checkpoint), "--output", str(tmp_path / "test.csv")])
{%- if cookiecutter.use_serving == "yes" %}

    # Served: image files as base64 text beside arrays, answered as predict answers for the same
    # files; refused files are one 422 line each, and the worker goes on.
    if importlib.util.find_spec("litserve") is None:
        pytest.skip("the serve extra is not installed: pip install -e '.[serve]'")
    from conftest import serving
    from test_ship import post

    files = sorted(samples.glob("*.png"), key=lambda path: int(path.stem))[:3]
    encoded = [base64.b64encode(path.read_bytes()).decode() for path in files]
    encoded[1] = "data:image/png;base64," + encoded[1]
    array = again.datamodule.read_inputs(str(files[2]))[1][0].tolist()
    with open(after) as file:
        expected = {row["id"]: row for row in csv.DictReader(file)}
    with serving(trained.checkpoint, tmp_path, "--max_image_pixels", "4096") as (port, process, _):
        status, answer = post(port, json.dumps({"inputs": [*encoded, array]}).encode())
        assert status == 200, answer
        assert answer["labels"] == [expected[path.name]["label"] for path in [*files, files[2]]]
        for probabilities, path in zip(answer["probabilities"], [*files, files[2]], strict=True):
            assert max(probabilities) == pytest.approx(float(expected[path.name]["probability"]), abs=1e-5)
        bomb = base64.b64encode(bomb_png(100_000, 100_000)).decode()
        refused = {
            "not base64": ("@@@", "inputs[0] must be an image file (PNG, JPEG, ...) as base64 text"),
            "not an image": (base64.b64encode(b"hello").decode(), "inputs[0] is not a PNG, JPEG, GIF, BMP or TIFF"),
            "too large": (png_base64(np.zeros((80, 80), np.uint8)), "80x80 = 6400 pixels; the server takes at most"),
            "a bomb": (bomb, "too many pixels; the server takes at most 4096"),
        }
        for case, (item, message) in refused.items():
            status, answer = post(port, json.dumps({"inputs": [item]}).encode())
            assert status == 422 and message in answer, (case, answer)
        assert post(port, json.dumps({"inputs": encoded[:1]}).encode())[0] == 200
        # A multipart upload (curl -F file=@a.png -F file=@b.png): its files are the inputs, in order.
        status, answer = upload(port, [path.read_bytes() for path in files])
        assert status == 200 and answer["labels"] == [expected[path.name]["label"] for path in files], answer
        status, answer = upload(port, [b"\0" * (1 << 20)])
        assert status == 413 and "over 1048576 bytes, the server's --max_body_bytes" in answer, answer
        assert process.poll() is None

    # The load test with the expensive request among good ones (the server's default limits): 256
    # PNGs of 16000x1000 pixels, 2 KB each, refused from their headers; every good request answered
    # in under 10 s (before the per-request pixel budget, good requests got 504 after 30 s). The load
    # test takes its good example from the test split: the training folder goes back as it was.
    (tmp_path / "moved").rename(root)
    shutil.rmtree(root / "aaa-new-class")
    command = [sys.executable, str(ROOT / "scripts" / "serve_load.py"), "--ckpt", str(trained.checkpoint)]
    command += ["--requests", "24", "--concurrency", "4", "--expensive-every", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = done.stdout.splitlines()[-1]
    counts = r"good 12/12 answered, bad 0/0 refused, expensive 12/12 refused"
    found = re.search(counts + r", p50 [\d.]+ ms, p99 ([\d.]+) ms", line)
    assert found and float(found.group(1)) < 10_000, line


def upload(port: int, files: list[bytes]) -> tuple[int, Any]:
    """POST ``files`` to the server as a multipart/form-data upload, each as a part named "file"."""
    boundary = "----test-boundary-7MA4YWxkTrZu0gW"
    head = '--{}\r\nContent-Disposition: form-data; name="file"; filename="{}.png"\r\nContent-Type: image/png\r\n\r\n'
    parts = [head.format(boundary, index).encode() + data + b"\r\n" for index, data in enumerate(files)]
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def png_base64(pixels: np.ndarray) -> str:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def bomb_png(width: int, height: int) -> bytes:
    """A PNG header claiming ``width`` x ``height`` grey pixels, with almost no data behind it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    data = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")


def test_a_request_may_hold_image_files_decoded_as_inputs_files_are(tmp_path: Path) -> None:
    pytest.importorskip("litserve", reason="the serve extra is not installed: pip install -e '.[serve]'")
    from {{ cookiecutter.package_name }}.serving.api import check_inputs

    root = make_folder(tmp_path / "images", per_class=10)
    data = ImageFolderDataModule(root=str(root), image_size=8, batch_size=4)
    data.setup("fit")
    schema = {**data.request_schema(), "max_inputs": 4, "max_image_pixels": 24 * 24}
    files = [root / "blobs" / "0.png", root / "vertical" / "1.png"]  # RGB and grey: both become RGB
    encoded = [base64.b64encode(path.read_bytes()).decode() for path in files]
    check_inputs(encoded, schema)
    decoded = data.inputs_from_json(encoded)
    assert torch.equal(decoded, torch.cat([data.read_inputs(str(path))[1] for path in files]))
    with pytest.raises(ValueError, match=r"^inputs\[0\]: an image of 25x24 = 600 pixels; the server takes at most 576"):
        check_inputs([png_base64(np.zeros((24, 25), np.uint8))], schema)
    # However small the body, one request decodes at most max_request_pixels in all (each image under its limit).
    wide = png_base64(np.zeros((2, 288), np.uint8))  # 576 pixels: at the per-image limit
    check_inputs([wide, wide], {**schema, "max_request_pixels": 2 * 576})
    with pytest.raises(ValueError, match=r"^the images up to inputs\[2\] hold 1728 pixels in all; .* at most 1152 per"):
        check_inputs([wide, wide, wide], {**schema, "max_request_pixels": 2 * 576})
    with pytest.raises(ValueError, match=r"^inputs\[0\]: the image file does not decode"):
        data.inputs_from_json([base64.b64encode(files[0].read_bytes()[:200]).decode()])  # truncated after the header
    # Formats Pillow decodes on open are refused by their header: an ICO decodes the PNG it wraps.
    png = io.BytesIO()
    Image.new("RGBA", (256, 256)).save(png, "PNG")  # the size its directory entry says (0: 256)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png.getvalue()), 22)
    ico = struct.pack("<HHH", 0, 1, 1) + entry + png.getvalue()
    assert Image.open(io.BytesIO(ico)).size == (256, 256)  # Pillow reads it, by decoding the PNG inside
    decoded = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ImageFile.ImageFile, "load", lambda self: decoded.append(self.format))
        with pytest.raises(ValueError, match=r"^inputs\[0\] is not a PNG, JPEG, GIF, BMP or TIFF image file"):
            check_inputs([base64.b64encode(ico).decode()], schema)
    assert decoded == []
{%- endif %}


def write_bad(kind: str, root: Path) -> Path:
    if kind == "missing":
        return root / "nowhere"
    (root / "a").mkdir(parents=True)
    if kind == "one-class":
        Image.new("L", (8, 8)).save(root / "a" / "0.png")
    if kind == "no-images":
        (root / "b").mkdir()
        (root / "a" / "notes.txt").write_text("not an image")
    if kind == "corrupt":
        (root / "b").mkdir()
        for name in ("a", "b"):
            for index in range(4):
                Image.new("L", (8, 8)).save(root / name / f"{index}.png")
        (root / "b" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a PNG")
    return root


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "data.root=.*nowhere: no such folder"),
        ("one-class", "1 class folder"),
        ("no-images", "no images"),
        ("corrupt", r"broken.png: not a readable image \(.*\); remove or replace the file, or set data.init_args.skip"),
    ],
)
def test_bad_folders_fail_before_training_and_write_nothing(tmp_path: Path, kind: str, message: str) -> None:
    root = write_bad(kind, tmp_path / "images")
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"])
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))


def test_skip_unreadable_leaves_out_broken_files_and_names_them(tmp_path: Path, caplog) -> None:
    root = make_folder(tmp_path / "images", per_class=10)
    (root / "blobs" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n this is not a PNG")  # fails at the header
    whole = (root / "vertical" / "0.png").read_bytes()
    (root / "vertical" / "truncated.png").write_bytes(whole[: len(whole) // 2])  # fails when decoded
    args = ["fit", *shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"]
    args += ["--data.init_args.batch_size=8", "--trainer.log_every_n_steps=1"]
    with user_error(r"broken.png: not a readable image \(.*\); remove or replace the file, or set data.init_args"):
        main([*args, "--test_after_fit=false"])

    with caplog.at_level(logging.INFO):
        cli = main([*args, "--data.init_args.skip_unreadable=true", "--test_after_fit=false"])
    data = cli.datamodule
    assert len(data.train_set) + len(data.val_set) + len(data.test_set) == 30  # the 32 files less the 2 broken
    (line,) = [r.getMessage() for r in caplog.records if "unreadable file" in r.getMessage()]
    assert line.startswith(f"data.root={root}: left out 2 unreadable file(s) (data.skip_unreadable): ")
    assert str(root / "blobs" / "broken.png") in line and str(root / "vertical" / "truncated.png") in line
    assert cli.trainer.global_step > 0

    inputs = tmp_path / "inputs"
    shutil.copytree(root / "vertical", inputs)
    ids, images = data.read_inputs(str(inputs))  # INPUTS= follows the same setting
    assert sorted(ids) == sorted(f"{n}.png" for n in range(10)) and images.shape == (10, 3, 32, 32)


def test_a_decompression_bomb_is_named_in_training_and_in_inputs(tmp_path: Path, monkeypatch) -> None:
    # Pillow refuses an image of more than twice MAX_IMAGE_PIXELS; a lower limit makes a 64x64 PNG one.
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    root = make_folder(tmp_path / "images", per_class=10)  # 24x24 pictures: within the limit
    bomb = root / "blobs" / "bomb.png"
    Image.new("L", (64, 64)).save(bomb)
    message = rf"^{bomb}: Image size \(4096 pixels\) exceeds limit of 2000 pixels, Pillow's guard against decompression"
    message += r" bombs; remove or replace the file, or set data.init_args.skip_unreadable=true \(or raise PIL.Image"
    with user_error(message + r".MAX_IMAGE_PIXELS if you trust it\)$"):
        main(["fit", *shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={root}"])
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))

    bomb.unlink()
    data = ImageFolderDataModule(root=str(root), image_size=8, batch_size=4)
    data.setup("fit")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    Image.new("L", (64, 64)).save(inputs / "bomb.png")
    # The advice is one make predict can follow: a training setting is not among its options.
    advice = rf"; remove or replace the file in INPUTS={inputs} \(or raise PIL.Image.MAX_IMAGE_PIXELS if you"
    with pytest.raises(ValueError, match=rf"^{inputs / 'bomb.png'}: Image size \(4096 pixels\) exceeds.*{advice}"):
        data.read_inputs(str(inputs))
    (inputs / "bomb.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"bomb.png: not a readable image \(.*\); remove or replace the file in INP"):
        data.read_inputs(str(inputs))
