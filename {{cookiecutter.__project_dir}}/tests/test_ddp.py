"""Distributed data parallel on 2 CPU processes (gloo): started by Lightning itself, and by torchrun."""

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, ROOT, assert_ddp_run_resumes_exactly, fit_in_subprocess, shrunk_args

from {{ cookiecutter.package_name }}.data import DigitsDataModule
from {{ cookiecutter.package_name }}.engine.checkpoints import check_fits, read_checkpoint
from {{ cookiecutter.package_name }}.engine.errors import MissingFileError
from {{ cookiecutter.package_name }}.engine.run_folders import best_checkpoint
from {{ cookiecutter.package_name }}.engine.sharding import consolidate
from {{ cookiecutter.package_name }}.models import ImageClassifier


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_reaches_world_size_two(tmp_path: Path) -> None:
    batch_size = 64
    args = [
        *shrunk_args(tmp_path),
        f"--config={CONFIGS / 'presets' / 'ddp.yaml'}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        f"--data.init_args.batch_size={batch_size}",
    ]
    fit_in_subprocess(args)
    summary = json.loads(next((tmp_path / "logs").rglob("test_metrics.json")).read_text())
    assert summary["world_size"] == 2
    # One run folder, named after the last config given (the ddp preset), its start time and a random part.
    (run,) = (tmp_path / "logs" / "test").iterdir()
    assert re.fullmatch(r"ddp-\d{8}-\d{6}-[0-9a-f]{4}", run.name), run.name

    # Each process sees half the training set (DistributedSampler), so one epoch is half the steps.
    datamodule = DigitsDataModule(batch_size=batch_size)
    datamodule.setup("fit")
    per_process = math.ceil(len(datamodule.train_set) / 2)
    assert summary["global_step"] == math.ceil(per_process / batch_size)

    # Its checkpoint loads into a plain single-process model: no DDP "module." prefixes.
    last = next((tmp_path / "logs").rglob("last.ckpt"))
    model = ImageClassifier.load_from_checkpoint(last, map_location="cpu", weights_only=True)
    check_fits(read_checkpoint(last), model, last)


@pytest.mark.slow
@pytest.mark.skipif(
    torch.__version__ < (2, 7), reason="torch 2.6's fully_shard under torchrun on CPU: 'Stream' has no record_event"
)
def test_torchrun_with_the_fsdp2_preset_reaches_world_size_two_and_predict_takes_its_checkpoint(tmp_path: Path) -> None:
    # `make train-ddp NPROC=2 ARGS="--config configs/presets/fsdp2.yaml"` as the preset documents it, with the
    # shrunk overrides: the preset's `devices: auto` must not undo the Makefile's two processes (it did).
    args = [arg for arg in shrunk_args(tmp_path) if not arg.startswith(("--config=", "--trainer.devices="))]
    args += [f"--config={CONFIGS / 'presets' / 'fsdp2.yaml'}", "--trainer.max_epochs=3"]  # 10 steps a process
    # An older run with a single-file checkpoint: make predict fell back to it without a word.
    older = tmp_path / "logs" / "older" / "version_0" / "checkpoints" / "epoch=0-step=1.ckpt"
    older.parent.mkdir(parents=True)
    older.write_bytes(b"")
    os.utime(older, (1, 1))
    done = subprocess.run(
        ["make", "train-ddp", "NPROC=2", f"PYTHON={sys.executable}", "ARGS=" + " ".join(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {"PYTHONFAULTHANDLER": "1"},  # a rank that aborts prints where
    )
    # Rank 0's traceback fills the end of stderr: the first failure is another rank's, said before it.
    others = [line for line in done.stderr.splitlines() if not line.startswith("[rank0]")]
    assert done.returncode == 0, done.stdout[-2000:] + "\n".join(others)[-6000:]
    summary = json.loads(next((tmp_path / "logs").rglob("test_metrics.json")).read_text())
    assert summary["world_size"] == 2
    assert summary["metrics"]["test/acc"] > 0.5  # 30 steps
    (run,) = (tmp_path / "logs" / "test").iterdir()  # every process named the run after torchrun's id
    assert run.name.startswith("fsdp2-torchrun-"), run.name
    # The newest run is the one predicted: its best checkpoint is a folder of shards, so the command says how
    # to gather it; once gathered, that file is taken.
    (best,) = [path for path in run.glob("checkpoints/*.ckpt") if path.name != "last.ckpt"]
    named = re.escape(str(best))
    with pytest.raises(MissingFileError, match=rf"{named}, is a distributed one .*sharding {named}"):
        best_checkpoint(tmp_path / "logs")
    gathered = consolidate(best)
    assert best_checkpoint(tmp_path / "logs") == gathered


@pytest.mark.slow
def test_ddp_run_stopped_mid_epoch_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Two processes, 5 steps per process and epoch, 3 epochs; SIGTERM reaches both processes
    # after step 7 (as a scheduler's scancel does). PreemptionCheckpoint, a Checkpoint callback, runs
    # after the callback that sent it, so it saves at that step's end: step 7, mid-epoch 2.
    # The resumed run must train each process on exactly the batches it had not seen yet.
    exact = ["--trainer.max_epochs=3", "--trainer.deterministic=true", "--test_after_fit=false"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda folder: [*shrunk_args(folder), *exact], step=7)
