"""``make bench``: the framework's cost per training step, against a plain PyTorch loop doing the same work.

Both paths train the default model on the default data for ``--steps`` optimizer steps:

- **project**: the LightningModule, DataModule, callbacks, logger and progress bar exactly as
  ``make train`` configures them (``configs/default.yaml`` through the project's CLI);
- **plain**: a hand-written loop over the same net (same initial weights), the same loader (same
  batches in the same order), AdamW with the same parameter groups, the same warm-up + cosine
  schedule, gradient clipping, the same torchmetrics updated every step and computed every
  epoch, validation every epoch, and the loss and learning rate read every
  ``log_every_n_steps`` steps.

Each run is a fresh process, as ``make train`` is, and the two paths alternate ``--repeats``
times. A step's time is the interval between the ends of consecutive steps, so it covers data,
forward, backward, optimizer, hooks, logging and the progress bar; a run's median drops the
once-per-epoch validation and checkpoint intervals. ``overhead_ratio`` is the median, over the
pairs of runs, of project / plain: a pair runs back to back, so a slow spell of the machine
weighs on both sides of its ratio. It is the last line printed.

On a CUDA GPU both paths wait for the device at the end of every step (the times are the
steps' own, not their launches'), and the report adds training samples/s through the project's
path for float32, the gpu preset (configs/presets/gpu.yaml) and the gpu preset compiled
(``--no-gpu`` skips them).

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
RESULT = "BENCH_RESULT="  # the line a fresh-process run reports on


class StepTimes(L.Callback):
    """Records ``time.perf_counter()`` at the end of every training step."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()  # the step's kernels are done: its time, not its launch
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


def run_project(steps: int, extra: list[str]) -> tuple[list[float], int]:
    """Step intervals (s) of ``fit`` through the project's CLI, as ``make train`` runs it, and the batch size."""
    with tempfile.TemporaryDirectory() as folder:
        cli = main(project_args(Path(folder), steps, extra), run=False)
        timer = StepTimes()
        cli.trainer.callbacks.append(timer)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        if "wandb" in sys.modules:  # close the run now, not at exit (it prints after overhead_ratio)
            sys.modules["wandb"].finish()
    return [b - a for a, b in pairwise(timer.ends)], cli.datamodule.hparams.batch_size


def run_plain(steps: int, extra: list[str]) -> list[float]:
    """Step intervals (s) of a plain PyTorch loop doing the project's work (see the module docstring)."""
    with tempfile.TemporaryDirectory() as folder:
        cli = main([*project_args(Path(folder), steps, extra), "--trainer.logger=false"], run=False)
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    hp = model.hparams
    data.setup("fit")
    train_loader, val_loader = data.train_dataloader(), data.val_dataloader()
    device = trainer.strategy.root_device
    net = model.net.to(device)
    # The project's own speed switches, so that the two paths do the same work.
    if hp.channels_last:
        net.to(memory_format=torch.channels_last)
    if hp.compile:
        net.compile(mode=hp.compile_mode)
    precision = str(trainer.precision)
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
    params = [p for p in net.parameters() if p.requires_grad]
    fused = device.type == "cuda" and half is None  # as configure_optimizers chooses
    optimizer, scheduler = adamw_warmup_cosine(
        params, hp.lr, hp.weight_decay, hp.warmup_ratio, hp.min_lr_ratio, steps, fused=fused
    )
    train_metrics, val_metrics = model.train_metrics.to(device), model.val_metrics.to(device)
    logged: list[tuple[float, float]] = []
    ends: list[float] = []
    step, epoch = 0, 0
    while step < steps:
        net.train()
        if hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        for cpu_images, cpu_labels in train_loader:
            images = cpu_images.to(device, non_blocking=True)
            labels = cpu_labels.to(device, non_blocking=True)
            if hp.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device.type, dtype=half, enabled=half is not None):
                logits = net(images)
                loss = F.cross_entropy(logits, labels, label_smoothing=hp.label_smoothing)
            train_metrics.update(logits.detach(), labels)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, trainer.gradient_clip_val)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            if trainer.log_every_n_steps and step % trainer.log_every_n_steps == 0:
                logged.append((loss.item(), scheduler.get_last_lr()[0]))
            if device.type == "cuda":
                torch.cuda.synchronize()
            ends.append(time.perf_counter())
            if step == steps:
                break
        train_metrics.compute()
        train_metrics.reset()
        net.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=half, enabled=half is not None):
            for images, labels in val_loader:
                val_metrics.update(net(images.to(device)), labels.to(device))
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


def run_in_fresh_process(path: str, steps: int, extra: list[str]) -> dict[str, float]:
    """Run ``path`` ("project" or "plain") for ``steps`` steps in a new Python process.

    Returns its median step time (ms) and batch size.

    Raises:
        RuntimeError: the run failed; the message ends with its output.
    """
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}.bench", f"--worker={path}", f"--steps={steps}", *extra]
    # Its own wandb service: one inherited from this process would print into this terminal.
    env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {path} run failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix(RESULT))


def worker(path: str, steps: int, extra: list[str]) -> None:
    """The body of one fresh-process run: prints ``RESULT`` and the run's figures as JSON."""
    if path == "project":
        intervals, batch_size = run_project(steps, extra)
    else:
        intervals, batch_size = run_plain(steps, extra), 0
    print(RESULT + json.dumps({"step_ms": 1000 * statistics.median(intervals), "batch_size": batch_size}), flush=True)


def gpu_throughput(steps: int, extra: list[str]) -> dict[str, float]:
    """Training samples/s of the project's path on CUDA: float32 vs the gpu preset, eager vs compiled.

    Each variant runs ``steps`` steps in a fresh process; samples/s is the batch size over the
    median step time, which leaves out the first steps' cuDNN autotuning and compilation.
    """
    preset = f"--config={CONFIG.parent / 'presets' / 'gpu.yaml'}"
    variants = {
        "fp32_eager": ["--trainer.accelerator=gpu", "--trainer.precision=32-true"],
        "gpu_preset_eager": [preset],
        "gpu_preset_compiled": [preset, "--model.init_args.compile=true"],
    }
    result = {}
    for name, args in variants.items():
        run = run_in_fresh_process("project", steps, [*args, *extra])
        result[f"{name}_samples_per_s"] = run["batch_size"] / (run["step_ms"] / 1000)
    fp32 = result["fp32_eager_samples_per_s"]
    result["gpu_preset_speedup"] = result["gpu_preset_eager_samples_per_s"] / fp32
    result["gpu_preset_compiled_speedup"] = result["gpu_preset_compiled_samples_per_s"] / fp32
    return result


def main_bench(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each path, alternating (default 5)")
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU throughput report")
    parser.add_argument("--worker", choices=["project", "plain"], help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    os.environ.setdefault("WANDB_MODE", "offline")
    if args.worker:
        worker(args.worker, args.steps, extra)
        return {}
    project, plain = [], []
    for _ in range(args.repeats):
        project.append(run_in_fresh_process("project", args.steps, extra)["step_ms"])
        plain.append(run_in_fresh_process("plain", args.steps, extra)["step_ms"])
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "steps": args.steps,
        "repeats": args.repeats,
        "project_step_ms": statistics.median(project),
        "plain_step_ms": statistics.median(plain),
        "project_step_ms_per_run": [round(ms, 3) for ms in project],
        "plain_step_ms_per_run": [round(ms, 3) for ms in plain],
        "first_step_s": first_step_seconds(extra),
    }
    if torch.cuda.is_available() and not args.no_gpu:
        result.update(gpu_throughput(args.steps, extra))
    result["overhead_ratio"] = statistics.median(a / b for a, b in zip(project, plain, strict=True))
    print(json.dumps(result, indent=2), flush=True)
    print(f"overhead_ratio={result['overhead_ratio']:.3f}", flush=True)
    return result


if __name__ == "__main__":
    main_bench()
