"""``make bench``: the framework's cost per training step, against a plain PyTorch loop doing the same work.

Both paths train the default model on the default data for ``--steps`` optimizer steps:

- **project**: the LightningModule, DataModule, callbacks, logger and progress bar exactly as
  ``make train`` configures them (``configs/default.yaml`` through the project's CLI);
- **lightning**: the same LightningModule and DataModule in Lightning's Trainer with none of the
  config's callbacks, no logger and no progress bar or checkpoints: Lightning's own loop, so that
  the framework's cost splits into Lightning's (``lightning_ratio``, lightning / plain) and that of
  the callbacks, logger and bar ``make train`` adds (``callbacks_ratio``, project / lightning;
  ``project_callbacks`` and ``lightning_callbacks`` name the callback classes each Trainer ran);
- **plain**: a hand-written loop around the same task module without the Trainer: the task's own
  ``shared_step`` (forward, loss, metric updates), ``setup`` (compile, channels-last) and
  ``build_optimizer`` (the configured optimizer and schedule), the same loader (same batches in
  the same order), gradient clipping, metrics computed every epoch, validation every epoch, and
  the loss and learning rate read every ``log_every_n_steps`` steps. Only the loop is its own.

Each run is a fresh process, as ``make train`` is, and the three paths alternate ``--repeats``
times, their order reversed every other time. A step's time is the interval between the
ends of consecutive steps, so it covers data, forward, backward, optimizer, hooks, logging and
the progress bar; a run's step time is the median of its intervals within an epoch. An epoch's end
(metrics computed, validation, checkpoints saved and synced to disk, the next epoch set up) is timed
apart, beside it: ``*_epoch_end_ms``, what an interval that spans one takes more than a step (the median
over the runs), ``*_epoch_end_ms_per_step``, that shared by an epoch's ``steps_per_epoch`` steps, and
``epoch_end_ratio`` (none when ``--steps`` ends no epoch). ``overhead_ratio`` is the median, over the
pairs of runs, of project / plain: a pair runs back to back, so a slow spell of the machine
weighs on both sides of its ratio (``lightning_ratio`` and ``callbacks_ratio`` are medians the same
way). It is the last line printed; the line before it gives the spread of the pair ratios (min,
median, max), and says so when the spread is wider than the overhead being measured (then add
``--repeats``).

On a CUDA GPU both paths wait for the device at the end of every step (the times are the
steps' own, not their launches'; ``--sync_every N`` waits every N steps only, as a run that logs
every N steps does, and divides each interval by N), and the report adds training samples/s through the project's
path for float32, the gpu preset (configs/presets/gpu.yaml) and the gpu preset compiled
(``--no-gpu`` skips them). The training loader alone (same workers, pinned memory and on-device
batch transform, no model) is timed too: ``loader_samples_per_s`` against training's
``train_samples_per_s`` (``loader_headroom``, their ratio), and ``setup_s``, the DataModule's
setup (decoding, for image folders). For token windows (a DataModule with ``block_size``) it adds
``train_tokens_per_s`` and ``plain_tokens_per_s``. ``model_gflops_per_s`` is the model's own
arithmetic (forward and backward FLOPs of a batch, counted once) per second through the project's
path; on a GPU each variant also gets its model FLOPs utilisation (``*_mfu``).

What each path does on the host, whatever the device: ``project_eager_ops_per_step`` and
``plain_eager_ops_per_step`` count the ``aten::`` calls dispatched from Python per optimizer step
(torch.profiler over a window of steps in a run of its own: not one inside another op, not inside a
torch.compile graph), ``eager_ops_ratio`` is their ratio, and ``*_eager_ops_by_op`` /
``*_eager_ops_by_part`` break them down by op and by the Lightning hook (or plain-loop stage) that
dispatched them ("[Callback]StopOnNonFinite.on_before_optimizer_step", "plain: clipping"). An epoch's
end in the window (metrics computed, checkpoints saved, the next epoch set up; validation left out)
is counted apart, per epoch end: ``*_eager_ops_per_epoch_end``, ``*_eager_ops_by_part_at_epoch_end``
and ``epoch_end_ops_ratio``. Each op costs the host a few microseconds: on a GPU whose kernels are
fast, their count is what separates the two paths.

Usage: ``python -m {{ cookiecutter.package_name }}.commands.bench [--config FILE ...] [--steps N] [--repeats R] [CLI arguments ...]``
(``make bench`` passes the Makefile's ``CONFIG``; the config path is relative to the working folder.)
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
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.fabric.utilities.throughput import get_available_flops, measure_flops
from lightning.pytorch.profilers import Profiler

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine import fused_optimizer_allowed

RESULT = "BENCH_RESULT="  # the line a fresh-process run reports on


class StepTimes(L.Callback):
    """Records ``time.perf_counter()`` at the end of every ``every``-th training step.

    On a CUDA GPU it first waits for the device, so a time is that of the steps' kernels, not their
    launches. ``every`` > 1 waits only at those steps, as a training run that logs every few steps
    does, so the host may queue the next step while the GPU runs this one.
    """

    def __init__(self, every: int = 1) -> None:
        self.every, self.steps, self.ends = every, 0, []
        self.crossed: list[bool] = []  # per end: whether an epoch's end lies between it and the end before it
        self._new_epoch = False

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._new_epoch = bool(self.ends)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        self.steps += 1
        if self.steps % self.every:
            return
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())
        self.crossed.append(self._new_epoch)
        self._new_epoch = False


class FirstStepTime(L.Callback):
    """Prints the seconds since ``BENCH_T0`` (set by the parent) when the first training step starts, then stops."""

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        print(f"first_step_s={time.time() - float(os.environ['BENCH_T0']):.3f}", flush=True)
        raise SystemExit(0)


class HookRanges(Profiler):
    """Lightning's profiler interface, marking every hook it times as a ``torch.profiler`` range (its name).

    Lightning wraps each hook, loop stage and strategy call in ``profiler.profile(name)``
    ("[Callback]StopOnNonFinite.on_before_optimizer_step", "[LightningModule]...training_step", ...):
    as ranges, they tell which of them dispatched each eager op (:func:`eager_ops`).
    """

    def __init__(self) -> None:
        super().__init__()
        self._open: dict[str, list[Any]] = {}

    def start(self, action_name: str) -> None:
        scope = torch.profiler.record_function(action_name)
        scope.__enter__()
        self._open.setdefault(action_name, []).append(scope)

    def stop(self, action_name: str) -> None:
        scopes = self._open.get(action_name)
        if scopes:
            scopes.pop().__exit__(None, None, None)

    def summary(self) -> str:
        return ""


class OpWindow:
    """Records ``torch.profiler`` events over optimizer steps ``first`` to ``first + count`` (CPU activity)."""

    def __init__(self, first: int, count: int) -> None:
        self.first, self.count, self.step, self.profile = first, count, 0, None

    def after_step(self) -> None:
        self.step += 1
        if self.step == self.first:
            self.profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            self.profile.__enter__()
        elif self.step == self.first + self.count and self.profile is not None:
            self.profile.__exit__(None, None, None)


class OpWindowCallback(L.Callback):
    """:class:`OpWindow` driven by Lightning's ``on_train_batch_end``; marks where validation runs and epoch ends
    start and end.

    Lightning's evaluation loop and epoch end are no profiler ranges of their own (a validation batch's
    transfer sits under no validation range), so they are told apart by time: an epoch's end runs from
    its last step's ``on_train_batch_end`` to the next epoch's ``on_train_epoch_start``.
    """

    def __init__(self, window: OpWindow) -> None:
        self.window = window

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, index) -> None:
        self.window.after_step()
        if index + 1 == trainer.num_training_batches:
            mark(EPOCH_END_STARTS)

    def on_train_epoch_start(self, *args: Any) -> None:
        mark(EPOCH_END_ENDS)

    def on_validation_start(self, *args: Any) -> None:
        mark(VALIDATION_STARTS)

    def on_validation_end(self, *args: Any) -> None:
        mark(VALIDATION_ENDS)


def mark(name: str) -> None:
    """An empty ``torch.profiler`` range: a point in time the recorded events are sorted against."""
    with torch.profiler.record_function(name):
        pass


# Ranges inside which ops run as a compiled graph (torch.compile), not dispatched one by one from Python.
COMPILED = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph", "TorchDynamo Cache Lookup")
# Validation is not a training step's work: the plain loop's runs inside a range, Lightning's between marks.
VALIDATION = "plain: validation"
VALIDATION_STARTS, VALIDATION_ENDS = "bench: validation starts", "bench: validation ends"
# An epoch's end (metrics computed, checkpoints saved, the next epoch's set-up) is reported beside the step.
EPOCH_END_STARTS, EPOCH_END_ENDS = "bench: epoch end starts", "bench: epoch end ends"


def marked_runs(events: list, starts: str, ends: str) -> list[tuple[float, float]]:
    """The (start, end) times between marks named ``starts`` and ``ends`` (:func:`mark`; open: no end)."""
    runs: list[tuple[float, float]] = []
    for event in sorted(events, key=lambda event: event.time_range.start):
        if event.name == starts:
            runs.append((event.time_range.start, float("inf")))
        elif event.name == ends and runs and runs[-1][1] == float("inf"):
            runs[-1] = (runs[-1][0], event.time_range.end)
    return runs


def eager_ops(window: OpWindow) -> dict[str, Any]:
    """Eager ops of a recorded window: every ``aten::`` call dispatched from Python (not one inside another op,
    not inside a compiled graph, not in a validation run that falls in the window).

    Those of the training steps, per step (``eager_ops_per_step``), by op and by the innermost
    Lightning hook (or plain-loop stage) around it; those of the epoch ends in the window (from an
    epoch's last step to the next epoch's start, validation left out), per epoch end
    (``eager_ops_per_epoch_end``, 0.0 when none falls in the window) and by hook.
    """
    by_name: dict[str, int] = {}
    by_part: dict[str, int] = {}
    epoch_end_parts: dict[str, int] = {}
    events = window.profile.events()
    validation = marked_runs(events, VALIDATION_STARTS, VALIDATION_ENDS)
    epoch_ends = marked_runs(events, EPOCH_END_STARTS, EPOCH_END_ENDS)
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        if any(start <= event.time_range.start <= end for start, end in validation):
            continue
        at_epoch_end = any(start <= event.time_range.start <= end for start, end in epoch_ends)
        part, parent, nested = "(outside any hook)", event.cpu_parent, False
        while parent is not None:
            if parent.name.startswith(("aten::", *COMPILED, VALIDATION)):
                nested = True
                break
            if part == "(outside any hook)" and not parent.name.startswith("ProfilerStep"):
                part = parent.name
            parent = parent.cpu_parent
        if nested:
            continue
        if at_epoch_end:
            epoch_end_parts[part] = epoch_end_parts.get(part, 0) + 1
            continue
        by_name[event.name] = by_name.get(event.name, 0) + 1
        by_part[part] = by_part.get(part, 0) + 1
    per_step = {name: count / window.count for name, count in by_name.items()}
    parts = {name: count / window.count for name, count in by_part.items()}
    ends = max(1, len(epoch_ends))
    epoch_end = {name: count / ends for name, count in epoch_end_parts.items()}
    return {
        "eager_ops_per_step": sum(per_step.values()),
        "eager_ops_by_op": dict(sorted(per_step.items(), key=lambda item: -item[1])[:12]),
        "eager_ops_by_part": dict(sorted(parts.items(), key=lambda item: -item[1])[:12]),
        "eager_ops_per_epoch_end": sum(epoch_end.values()),
        "eager_ops_by_part_at_epoch_end": dict(sorted(epoch_end.items(), key=lambda item: -item[1])[:12]),
    }


def project_args(config: list[Path], folder: Path, steps: int, extra: list[str]) -> list[str]:
    return [
        *(f"--config={path}" for path in config),
        f"--trainer.max_steps={steps}",
        "--trainer.max_epochs=-1",
        "--test_after_fit=false",
        f"--trainer.default_root_dir={folder}",
        f"--trainer.logger.init_args.save_dir={folder / 'logs'}",
        *extra,
    ]


def flops_per_step(cli) -> int | None:
    """FLOPs of one training batch's forward and backward, or None for a compiled or FSDP-sharded net (not counted).

    Counted by torch's ``FlopCounterMode`` through Lightning's ``measure_flops`` on a real batch of
    the training loader, so the count matches the configured model and batch exactly.
    """
    model, data = cli.model, cli.datamodule
    # Sharded parameters (FSDP) are whole only inside the strategy's forward: not counted.
    if model.hparams.get("compile") or "FSDP" in type(cli.trainer.strategy).__name__:
        return None
    batch = next(iter(data.train_dataloader()))
    batch = data.transform_batch(move_data_to_device(batch, model.device), training=True)
    flops = measure_flops(model, lambda: model.shared_step(batch, model.train_metrics), loss_fn=lambda loss: loss)
    model.zero_grad(set_to_none=True)
    return flops


def run_project(
    config: list[Path], steps: int, extra: list[str], every: int = 1, ops: OpWindow | None = None, bare: bool = False
) -> dict[str, Any]:
    """``fit`` through the project's CLI, as ``make train`` runs it: step intervals (s) and what they measured.

    ``bare``: the same module, data and Trainer settings (precision, clipping, logging cadence) without the
    config's callbacks, the logger, the progress bar and checkpoints, Lightning's own loop alone.

    Returns ``intervals``, ``crossed`` (per interval: whether it spans an epoch's end, see :func:`timed`),
    ``steps_per_epoch``, ``batch_size``, ``tokens_per_sample`` (when the DataModule serves token
    windows: it has a ``block_size``; else None), ``flops_per_step`` (:func:`flops_per_step`),
    ``precision``, ``peak_gpu_gib`` (on CUDA, else None) and ``callbacks`` (the classes the Trainer called,
    the bench's own left out).
    """
    with tempfile.TemporaryDirectory() as folder:
        cli = main(project_args(config, Path(folder), steps, extra), run=False)
        if bare:  # Lightning's loop alone: none of the callbacks it was given or added (bar, checkpoints)
            cli.trainer.callbacks = []
            cli.trainer.loggers = []
        timer = StepTimes(every)
        cli.trainer.callbacks.append(timer)
        if ops is not None:  # the ops of a window of steps, each under the Lightning hook that dispatched it
            cli.trainer.callbacks.append(OpWindowCallback(ops))
            cli.trainer.profiler = HookRanges()
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        if "wandb" in sys.modules:  # close the run now, not at exit (it prints after overhead_ratio)
            sys.modules["wandb"].finish()
        flops = flops_per_step(cli)
    return {
        "intervals": [(b - a) / every for a, b in pairwise(timer.ends)],
        "crossed": timer.crossed[1:],
        "steps_per_epoch": cli.trainer.num_training_batches,
        "batch_size": cli.datamodule.hparams.batch_size,
        "tokens_per_sample": getattr(cli.datamodule, "block_size", None),
        "flops_per_step": flops,
        "precision": str(cli.trainer.precision),
        "callbacks": sorted(
            type(callback).__name__
            for callback in cli.trainer.callbacks
            if not isinstance(callback, (StepTimes, OpWindowCallback))
        ),
        # The most GPU memory the run's tensors held at once (activations, gradients, optimizer state).
        "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
    }


def run_plain(
    config: list[Path], steps: int, extra: list[str], every: int = 1, ops: OpWindow | None = None
) -> dict[str, list]:
    """Step intervals (s) of a plain PyTorch loop doing the project's work (see the module docstring), and
    whether each spans an epoch's end (``intervals``, ``crossed``).

    As :class:`StepTimes`: timed (and on CUDA, synchronised) at every ``every``-th step.
    """
    with tempfile.TemporaryDirectory() as folder:
        cli = main([*project_args(config, Path(folder), steps, extra), "--trainer.logger=false"], run=False)
    model, data, trainer = cli.model, cli.datamodule, cli.trainer
    data.setup("fit")
    train_loader, val_loader = data.train_dataloader(), data.val_dataloader()
    device = trainer.strategy.root_device
    model.to(device)
    model.setup("fit")  # the task's own speed switches: channels-last, compile
    precision = str(trainer.precision)
    half = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
    fused = fused_optimizer_allowed(model, precision)
    optimizer, scheduler = model.build_optimizer(steps, fused=fused)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    train_metrics, val_metrics = model.train_metrics, model.val_metrics
    logged: list[tuple[float, float]] = []
    ends: list[float] = []
    crossed, new_epoch = [], False
    step, epoch = 0, 0
    while step < steps:
        mark(EPOCH_END_ENDS)
        new_epoch = bool(ends)
        model.train()
        if hasattr(train_loader.sampler, "set_epoch"):
            train_loader.sampler.set_epoch(epoch)
        for batch in train_loader:
            batch = data.transform_batch(move_data_to_device(batch, device), training=True)
            forward = torch.profiler.record_function("plain: forward and loss")
            with forward, torch.autocast(device.type, dtype=half, enabled=half is not None):
                loss = model.shared_step(batch, train_metrics)
            with torch.profiler.record_function("plain: backward"):
                optimizer.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
            with torch.profiler.record_function("plain: clipping"):
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(params, trainer.gradient_clip_val)
            with torch.profiler.record_function("plain: optimizer and schedule"):
                scaler.step(optimizer)
                scaler.update()
                if scheduler is not None:
                    scheduler.step()
            step += 1
            if trainer.log_every_n_steps and step % trainer.log_every_n_steps == 0:
                logged.append((loss.item(), optimizer.param_groups[0]["lr"]))
            if ops is not None:
                ops.after_step()
            if step % every == 0:
                if device.type == "cuda":
                    torch.cuda.synchronize()
                ends.append(time.perf_counter())
                crossed.append(new_epoch)
                new_epoch = False
            if step == steps:
                break
        mark(EPOCH_END_STARTS)
        train_metrics.compute()
        train_metrics.reset()
        model.eval()
        validation = torch.profiler.record_function("plain: validation")
        with validation, torch.no_grad(), torch.autocast(device.type, dtype=half, enabled=half is not None):
            for batch in val_loader:
                model.shared_step(data.transform_batch(move_data_to_device(batch, device), training=False), val_metrics)
        val_metrics.compute()
        val_metrics.reset()
        epoch += 1
    return {"intervals": [(b - a) / every for a, b in pairwise(ends)], "crossed": crossed[1:]}


def run_loader(config: list[Path], steps: int, extra: list[str]) -> dict[str, float]:
    """The training loader alone: samples/s through ``steps`` batches and the batch transform, and setup time.

    The same loader, workers, pinned memory and on-device batch transform (augmentation,
    normalisation) as training, with no model: if it is not well ahead of training's samples/s,
    the data, not the model, sets the speed.
    """
    with tempfile.TemporaryDirectory() as folder:
        cli = main([*project_args(config, Path(folder), steps, extra), "--trainer.logger=false"], run=False)
    data, device = cli.datamodule, cli.trainer.strategy.root_device
    start = time.perf_counter()
    data.setup("fit")  # decoding, splitting, statistics
    setup_s = time.perf_counter() - start
    loader, samples, done = data.train_dataloader(), 0, 0
    start = time.perf_counter()
    while done < steps:
        for batch in loader:
            batch = data.transform_batch(move_data_to_device(batch, device), training=True)
            samples += len(batch[-1])
            done += 1
            if done == steps:
                break
    if device.type == "cuda":
        torch.cuda.synchronize()
    return {"loader_samples_per_s": samples / (time.perf_counter() - start), "setup_s": setup_s}


def first_step_seconds(config: list[Path], extra: list[str]) -> float:
    """Seconds from starting ``python -m <package> fit`` (what ``make train`` runs) to its first training step."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *project_args(config, Path(folder), 10, extra)]
        command.append("--trainer.callbacks+={{ cookiecutter.package_name }}.commands.bench.FirstStepTime")
        # Its own wandb service: one inherited from this process would print into this terminal.
        env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
        env["BENCH_T0"] = repr(time.time())
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("first_step_s=")]
    if not lines:
        raise RuntimeError(f"the start-up run failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(lines[-1].split("=")[1])


def run_in_fresh_process(
    config: list[Path], path: str, steps: int, extra: list[str], every: int = 1
) -> dict[str, float]:
    """Run ``path`` ("project", "lightning", "plain", "loader" or an "_ops" count) for ``steps`` steps in a new process.

    Returns its figures: median step time (ms), batch size and tokens per sample, or the loader's
    samples/s and setup time.

    Raises:
        RuntimeError: the run failed; the message ends with its output.
    """
    command = [
        sys.executable,
        "-m",
        "{{ cookiecutter.package_name }}.commands.bench",
        f"--worker={path}",
        *(f"--config={c}" for c in config),
        f"--steps={steps}",
        f"--sync_every={every}",
        *extra,
    ]
    # Its own wandb service: one inherited from this process would print into this terminal.
    env = {key: value for key, value in os.environ.items() if key != "WANDB_SERVICE"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the {path} run failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix(RESULT))


def worker(config: list[Path], path: str, steps: int, extra: list[str], every: int = 1) -> None:
    """The body of one fresh-process run: prints ``RESULT`` and the run's figures as JSON."""
    if path == "loader":
        print(RESULT + json.dumps(run_loader(config, steps, extra)), flush=True)
        return
    if path.endswith("_ops"):  # a window of steps under torch.profiler: eager ops, not time
        window = OpWindow(first=max(1, steps // 2), count=max(1, min(20, steps - max(1, steps // 2))))
        run = run_project if path == "project_ops" else run_plain
        run(config, steps, extra, every, ops=window)
        if window.profile is not None and window.step < window.first + window.count:  # a run shorter than it
            window.profile.__exit__(None, None, None)
            window.count = max(1, window.step - window.first)
        print(RESULT + json.dumps(eager_ops(window)), flush=True)
        return
    if path == "plain":
        figures = run_plain(config, steps, extra, every)
    else:
        figures = run_project(config, steps, extra, every, bare=path == "lightning")
    figures.update(timed(figures.pop("intervals"), figures.pop("crossed"), every))
    print(RESULT + json.dumps(figures), flush=True)


def timed(intervals: list[float], crossed: list[bool], every: int) -> dict[str, float | None]:
    """``step_ms``: the median step interval (ms) of those within an epoch; ``epoch_end_ms``: what an epoch's
    end adds (ms: metrics computed, validation, checkpoints saved and synced, the next epoch set up), the
    median interval that spans one less the ``every`` steps it also holds; None when no epoch ended."""
    within = [t for t, end in zip(intervals, crossed, strict=True) if not end] or intervals
    step = statistics.median(within)
    spans = [t for t, end in zip(intervals, crossed, strict=True) if end]
    epoch_end = 1000 * every * (statistics.median(spans) - step) if spans else None
    return {"step_ms": 1000 * step, "epoch_end_ms": epoch_end}


def gpu_throughput(config: list[Path], steps: int, extra: list[str]) -> dict[str, float]:
    """Training samples/s of the project's path on CUDA: float32 vs the gpu preset, eager vs compiled.

    Each variant runs ``steps`` steps in a fresh process; samples/s is the batch size over the
    median step time, which leaves out the first steps' cuDNN autotuning and compilation. The model
    FLOPs utilisation (MFU) of each is the FLOPs per step counted in eager float32, over the step
    time, over the GPU's peak for the variant's precision (Lightning's ``get_available_flops``;
    absent for a GPU it does not know).
    """
    preset = f"--config={config[0].parent / 'presets' / 'gpu.yaml'}"
    variants = {
        "fp32_eager": ["--trainer.accelerator=gpu", "--trainer.precision=32-true"],
        "gpu_preset_eager": [preset],
        "gpu_preset_compiled": [preset, "--model.init_args.compile=true"],
    }
    result, flops = {}, None
    for name, args in variants.items():
        run = run_in_fresh_process(config, "project", steps, [*args, *extra])
        result[f"{name}_samples_per_s"] = run["batch_size"] / (run["step_ms"] / 1000)
        flops = flops or run["flops_per_step"]
        dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(run["precision"], torch.float32)
        peak = get_available_flops(torch.device("cuda"), dtype)
        if flops and peak:
            result[f"{name}_mfu"] = flops / (run["step_ms"] / 1000) / peak
    fp32 = result["fp32_eager_samples_per_s"]
    result["gpu_preset_speedup"] = result["gpu_preset_eager_samples_per_s"] / fp32
    result["gpu_preset_compiled_speedup"] = result["gpu_preset_compiled_samples_per_s"] / fp32
    return result


def epoch_end_figures(epoch_ends: dict[str, list[float]], steps_per_epoch: int) -> dict[str, float]:
    """``<path>_epoch_end_ms`` (the median over runs), ``<path>_epoch_end_ms_per_step`` (shared by an epoch's
    steps) and ``epoch_end_ratio`` (project / plain); none when no run ended an epoch (too few ``--steps``)."""
    if not (epoch_ends["project"] and epoch_ends["plain"]):
        return {}
    figures = {}
    for path, times in epoch_ends.items():
        figures[f"{path}_epoch_end_ms"] = statistics.median(times)
        figures[f"{path}_epoch_end_ms_per_step"] = figures[f"{path}_epoch_end_ms"] / steps_per_epoch
    figures["epoch_end_ratio"] = figures["project_epoch_end_ms"] / figures["plain_epoch_end_ms"]
    return figures


def main_bench(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config", type=Path, action="append", help="the run's config; repeat to stack (default configs/default.yaml)"
    )
{%- if cookiecutter.task == "language-model" %}
    # A GPT step is about 0.3 s on 2 CPU cores: 60 steps a run keep a default bench near 5 minutes.
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per run (default 60)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path, alternating (default 3)")
{%- else %}
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default 300)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each path, alternating (default 5)")
{%- endif %}
    parser.add_argument("--no-gpu", action="store_true", help="skip the GPU throughput report")
    parser.add_argument(
        "--sync_every",
        type=int,
        default=1,
        help="time (and on CUDA, wait for the GPU) every N steps only; a step's time is the interval / N (default 1)",
    )
    parser.add_argument(
        "--worker",
        choices=["project", "lightning", "plain", "loader", "project_ops", "plain_ops"],
        help=argparse.SUPPRESS,
    )
    args, extra = parser.parse_known_args(argv)
    configs = args.config or [Path("configs/default.yaml")]
    for path in configs:
        if not path.is_file():
            parser.error(f"--config {path}: no such file; run from the project folder or pass --config")
    config = [path.resolve() for path in configs]
    os.environ.setdefault("WANDB_MODE", "offline")
    if args.worker:
        sys.argv = sys.argv[:1]  # the CLI gets its arguments as args= (else LightningCLI warns of both)
        worker(config, args.worker, args.steps, extra, args.sync_every)
        return {}
    step_ms: dict[str, list[float]] = {"project": [], "lightning": [], "plain": []}
    epoch_ends: dict[str, list[float]] = {"project": [], "plain": []}
    callbacks: dict[str, list[str]] = {}  # the callback classes each Trainer ran (the split below holds if they differ)
    for repeat in range(1, args.repeats + 1):
        # The order reverses every other time (project first, then plain first, ...): a machine that
        # drifts faster or slower during a pair then favours no path.
        for path in ("project", "lightning", "plain") if repeat % 2 else ("plain", "lightning", "project"):
            print(
                f"bench: pair {repeat}/{args.repeats}, {path} path: {args.steps} steps in a fresh process ...",
                file=sys.stderr,
                flush=True,
            )
            run = run_in_fresh_process(config, path, args.steps, extra, args.sync_every)
            step_ms[path].append(run["step_ms"])
            if run["epoch_end_ms"] is not None and path in epoch_ends:
                epoch_ends[path].append(run["epoch_end_ms"])
            if path != "plain":
                callbacks[path] = run["callbacks"]
            if path != "project":
                continue
            batch_size, tokens, flops = run["batch_size"], run["tokens_per_sample"], run["flops_per_step"]
            steps_per_epoch = run["steps_per_epoch"]
        # On stderr: progress for a person, while stdout stays the JSON report.
        project, lightning, plain = (step_ms[path][-1] for path in ("project", "lightning", "plain"))
        print(
            f"pair {repeat}/{args.repeats}: project {project:.2f} ms/step, Lightning alone {lightning:.2f}, "
            f"plain {plain:.2f}, ratio {project / plain:.3f}",
            file=sys.stderr,
            flush=True,
        )
    project, lightning, plain = (step_ms[path] for path in ("project", "lightning", "plain"))
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "steps": args.steps,
        "repeats": args.repeats,
        "project_step_ms": statistics.median(project),
        "plain_step_ms": statistics.median(plain),
        "lightning_step_ms": statistics.median(lightning),
        **{f"{path}_step_ms_per_run": [round(ms, 3) for ms in runs] for path, runs in step_ms.items()},
        # Whose cost the overhead is: Lightning's loop (lightning / plain), the config's callbacks, logger and
        # progress bar (project / lightning); each the median over the pairs, as overhead_ratio.
        "lightning_ratio": statistics.median(a / b for a, b in zip(lightning, plain, strict=True)),
        "callbacks_ratio": statistics.median(a / b for a, b in zip(project, lightning, strict=True)),
        **{f"{path}_callbacks": names for path, names in callbacks.items()},
        # An epoch's end apart from the step (validation, metrics, checkpoints saved and synced): its median
        # time in each path, and what it adds to a step when shared by the epoch's steps.
        "steps_per_epoch": steps_per_epoch,
        **epoch_end_figures(epoch_ends, steps_per_epoch),
        "first_step_s": first_step_seconds(config, extra),
        "train_samples_per_s": batch_size / (statistics.median(project) / 1000),
    }
    if flops:  # the model's own arithmetic per second through the project's path
        result["model_gflops_per_s"] = flops / (statistics.median(project) / 1000) / 1e9
    if tokens is not None:  # language models are measured in tokens
        result["train_tokens_per_s"] = result["train_samples_per_s"] * tokens
        result["plain_tokens_per_s"] = batch_size * tokens / (statistics.median(plain) / 1000)
    # What each path dispatches per step outside a compiled graph (torch.profiler), and which hook did.
    for path in ("project", "plain"):
        counted = run_in_fresh_process(config, f"{path}_ops", args.steps, extra)
        result.update({f"{path}_{name}": value for name, value in counted.items()})
    result["eager_ops_ratio"] = result["project_eager_ops_per_step"] / result["plain_eager_ops_per_step"]
    result["epoch_end_ops_ratio"] = result["project_eager_ops_per_epoch_end"] / max(
        1.0, result["plain_eager_ops_per_epoch_end"]
    )
    result.update(run_in_fresh_process(config, "loader", args.steps, extra))
    # How far the loader is ahead of training: below about 2, the data sets the speed.
    result["loader_headroom"] = result["loader_samples_per_s"] / result["train_samples_per_s"]
    if torch.cuda.is_available() and not args.no_gpu:
        result.update(gpu_throughput(config, args.steps, extra))
    ratios = sorted(a / b for a, b in zip(project, plain, strict=True))
    result["pair_ratios"] = [round(ratio, 3) for ratio in ratios]
    result["overhead_ratio"] = statistics.median(ratios)
    print(json.dumps(result, indent=2), flush=True)
    spread = ratios[-1] - ratios[0]
    print(
        f"pair ratios: min {ratios[0]:.3f}, median {result['overhead_ratio']:.3f}, max {ratios[-1]:.3f}"
        + (
            f" (spread {spread:.3f} is wider than the overhead {result['overhead_ratio'] - 1:+.3f}: "
            "machine noise; add --repeats)"
            if spread > abs(result["overhead_ratio"] - 1)
            else ""
        ),
        flush=True,
    )
    print(f"overhead_ratio={result['overhead_ratio']:.3f}", flush=True)
    return result


if __name__ == "__main__":
    main_bench()
