"""``make bench``: the framework's cost per training step, against a plain PyTorch loop doing the same work.

Both paths train the default model on the default data for ``--steps`` optimizer steps:

- **project**: the LightningModule, DataModule, callbacks, logger and progress bar exactly as
  ``make train`` configures them (``configs/default.yaml`` through the project's CLI);
- **plain**: a hand-written loop over the same net (same initial weights), the same loader (same
  batches in the same order), AdamW with the same parameter groups, the same warm-up + cosine
  schedule, gradient clipping, the same torchmetrics updated every step and computed every
  epoch, validation every epoch, and the loss and learning rate read every
  ``log_every_n_steps`` steps.

The two alternate ``--repeats`` times in one process. A step's time is the interval between
the ends of consecutive steps, so it covers data, forward, backward, optimizer, hooks, logging
and the progress bar; the median over all steps drops the once-per-epoch validation and
checkpoint intervals from both. The last line is ``overhead_ratio=<project / plain>``.

Usage: ``python -m {{ cookiecutter.package_name }}.bench [--steps N] [--repeats R] [CLI arguments ...]``
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.models.classifier import adamw_warmup_cosine

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


class StepTimes(L.Callback):
    """Records ``time.perf_counter()`` at the end of every training step (and once at the first step's start)."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.first_start: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if self.first_start is None:
            self.first_start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        self.ends.append(time.perf_counter())


class FirstStepTime(L.Callback):
    """Prints the seconds since ``BENCH_T0`` (set by the parent) when the first training step starts, then stops."""

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        print(f"first_step_s={time.time() - float(os.environ['BENCH_T0']):.3f}", flush=True)
        raise SystemExit(0)


def project_args(folder: Path, steps: int, extra: list[str]) -> list[str]:
    return [
        f"--config={CONFIG}",
        f"--trainer.max_steps={steps}",
        "--trainer.max_epochs=-1",
        "--test_after_fit=false",
        f"--trainer.default_root_dir={folder}",
        f"--trainer.logger.init_args.save_dir={folder / 'logs'}",
        *extra,
    ]


def run_project(steps: int, extra: list[str]) -> list[float]:
    """Step intervals (s) of ``fit`` through the project's CLI, as ``make train`` runs it."""
    with tempfile.TemporaryDirectory() as folder:
        cli = main(project_args(Path(folder), steps, extra), run=False)
        timer = StepTimes()
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        if "wandb" in sys.modules:  # close the run now, not at exit (it prints after overhead_ratio)
            sys.modules["wandb"].finish()
    return [b - a for a, b in pairwise(timer.ends)]


def run_plain(steps: int, extra: list[str]) -> list[float]:
    """Step intervals (s) of a plain PyTorch loop doing the project's work (see the module docstring)."""
    with tempfile.TemporaryDirectory() as folder:
        cli = main([*project_args(Path(folder), steps, extra), "--trainer.logger=false"], run=False)
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    hp = model.hparams
    data.setup("fit")
    train_loader, val_loader = data.train_dataloader(), data.val_dataloader()
    net = model.net
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer, scheduler = adamw_warmup_cosine(params, hp.lr, hp.weight_decay, hp.warmup_ratio, hp.min_lr_ratio, steps)
    train_metrics, val_metrics = model.train_metrics, model.val_metrics
    logged: list[tuple[float, float]] = []
    ends: list[float] = []
    step, epoch = 0, 0
    while step < steps:
        net.train()
        if hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        for images, labels in train_loader:
            logits = net(images)
            loss = F.cross_entropy(logits, labels, label_smoothing=hp.label_smoothing)
            train_metrics.update(logits.detach(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, trainer.gradient_clip_val)
            optimizer.step()
            scheduler.step()
            step += 1
            if step % trainer.log_every_n_steps == 0:
                logged.append((loss.item(), scheduler.get_last_lr()[0]))
            ends.append(time.perf_counter())
            if step == steps:
                break
        train_metrics.compute()
        train_metrics.reset()
        net.eval()
        with torch.no_grad():
            for images, labels in val_loader:
                val_metrics.update(net(images), labels)
        val_metrics.compute()
        val_metrics.reset()
        epoch += 1
    return [b - a for a, b in pairwise(ends)]


def first_step_seconds(extra: list[str]) -> float:
    """Seconds from starting ``python -m <package> fit`` (what ``make train`` runs) to its first training step."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *project_args(Path(folder), 10, extra)]
        command.append("--trainer.callbacks+={{ cookiecutter.package_name }}.bench.FirstStepTime")
        # Its own wandb service: one inherited from this process would print into this terminal.
        env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
        env["BENCH_T0"] = repr(time.time())
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("first_step_s=")]
    if not lines:
        raise RuntimeError(f"the start-up run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(lines[-1].split("=")[1])


def main_bench(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each path, alternating (default 5)")
    args, extra = parser.parse_known_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    torch.set_num_threads(torch.get_num_threads())
    project, plain = [], []
    for _ in range(args.repeats):
        project += run_project(args.steps, extra)
        plain += run_plain(args.steps, extra)
    result = {
        "steps": args.steps,
        "repeats": args.repeats,
        "project_step_ms": 1000 * statistics.median(project),
        "plain_step_ms": 1000 * statistics.median(plain),
        "first_step_s": first_step_seconds(extra),
    }
    result["overhead_ratio"] = result["project_step_ms"] / result["plain_step_ms"]
    sys.stdout.flush()
    print(json.dumps(result, indent=2), flush=True)
    print(f"overhead_ratio={result['overhead_ratio']:.3f}", flush=True)
    return result


if __name__ == "__main__":
    main_bench()
