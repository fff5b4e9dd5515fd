"""What a run writes into its folder, and reads back when it is resumed.

``config.yaml`` (the resolved config; a resume that changes it adds ``config-resumed-<n>.yaml``),
``environment.json`` (:mod:`engine.environment`; ``environment-resumed-<n>.json`` when it changed),
the CSV logger's ``metrics.csv`` (kept as ``metrics-<n>.csv`` across resumes), the profiler's files
and ``test_metrics.json`` (the best checkpoint tested after fit). Where the folder is and which run a
command means: :mod:`engine.run_folders`.
"""

import json
import os
import re
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info

from .environment import describe_environment
from .run_folders import configured_loggers, run_dir


def next_numbered(path: Path, tag: str = "-resumed") -> Path:
    """``<stem><tag>-<n><suffix>`` beside ``path``, ``n`` one more than the highest there (1 for none).

    What a resumed run adds to its folder (a changed config, a new environment, the metrics before it)
    never overwrites what an earlier resume added, even after one of those files was deleted.
    """
    numbers = [int(number) for _, number in _numbered(path, tag)]
    return path.with_name(f"{path.stem}{tag}-{max(numbers, default=0) + 1}{path.suffix}")


def _numbered(path: Path, tag: str) -> list[tuple[Path, str]]:
    pattern = re.compile(rf"{re.escape(path.stem + tag)}-(\d+){re.escape(path.suffix)}")
    found = [(child, pattern.fullmatch(child.name)) for child in path.parent.iterdir()] if path.parent.is_dir() else []
    return [(child, match[1]) for child, match in found if match]


def own_config(run: Path) -> Path | None:
    """The config a run was last started or resumed with: ``config.yaml``, or its newest ``config-resumed-<n>.yaml``
    (:class:`SaveConfigToRunDir` writes one when a resume changes the config); None for a run without one."""
    resumed = [(int(number), path) for path, number in _numbered(run / "config.yaml", "-resumed")]
    if resumed:
        return max(resumed)[1]
    first = run / "config.yaml"
    return first if first.is_file() else None


def with_own_config(args: list[str], config: Path) -> list[str]:
    """``args`` of a ``fit`` command with every ``--config`` given replaced by ``config`` (the run's own).

    ``make resume`` passes the project's default config, but the run may have been started with an
    experiment config on top (another DataModule, another net): resuming it from the default would
    build a different model. The run's saved config holds the whole resolved config of the run; the
    other arguments (``--trainer.max_epochs=20``) still apply on top of it.
    """
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--config", "-c"):
            skip = True
        elif not arg.startswith("--config="):
            kept.append(arg)
    at = kept.index("fit") + 1 if "fit" in kept else 0
    return [*kept[:at], f"--config={config}", *kept[at:]]


def record_environment(folder: Path) -> Path:
    """Write :func:`describe_environment` to ``folder/environment.json``; a resumed run whose environment
    differs (an upgrade between a job and its requeue) adds ``environment-resumed-<n>.json`` beside it."""
    text = json.dumps(describe_environment(), indent=2) + "\n"
    path = folder / "environment.json"
    if path.exists():
        first = json.loads(path.read_text())
        now = json.loads(text)
        if {k: v for k, v in first.items() if k != "command"} == {k: v for k, v in now.items() if k != "command"}:
            return path
        path = next_numbered(path)
    path.write_text(text)
    return path


def keep_csv_metrics(trainer: L.Trainer) -> None:
    """Move a CSVLogger's existing ``metrics.csv`` aside (``metrics-<n>.csv``) before a resumed run writes.

    Lightning's CSVLogger deletes ``metrics.csv`` when it finds one in its folder, so a run resumed
    into its own folder (a requeued SLURM job) would lose everything logged before the resume.
    """
    for logger in trainer.loggers:
        if trainer.is_global_zero and isinstance(logger, CSVLogger):
            metrics = Path(logger.log_dir, "metrics.csv")
            if metrics.is_file():
                metrics.rename(next_numbered(metrics, tag=""))


def profile_into_run_dir(trainer: L.Trainer) -> None:
    """Point a file-writing profiler without a ``dirpath`` at the run folder (rank zero).

    Profilers write to ``trainer.log_dir``, which for wandb is the shared save folder. Other ranks
    keep that default: each writes its own rank-suffixed report.
    """
    profiler = trainer.profiler
    if trainer.is_global_zero and getattr(profiler, "filename", None) and profiler.dirpath is None:
        profiler.dirpath = run_dir(trainer)


def report_profiler_files(trainer: L.Trainer) -> None:
    """Name the files a file-writing profiler left in its folder (the ``profile`` and ``trace`` presets)."""
    profiler = trainer.profiler
    filename, dirpath = getattr(profiler, "filename", None), getattr(profiler, "dirpath", None)
    if not trainer.is_global_zero or not filename or dirpath is None:
        return
    for path in sorted(Path(dirpath).glob(f"*{filename}*")):
        rank_zero_info(f"Profiler report written to {path}")


def evaluate_best_checkpoint(trainer: L.Trainer, model: L.LightningModule, datamodule: L.LightningDataModule) -> None:
    """Test the best checkpoint of the fit that just ended and write ``test_metrics.json`` into the run folder.

    The first ModelCheckpoint tracks the best model. fast_dev_run and runs without a ModelCheckpoint
    have none: then the weights in memory are tested. The summary names the checkpoint, the epoch
    and global step it was saved at (the trainer's own when no checkpoint was tested), the world
    size and the metrics.
    """
    checkpoint = trainer.checkpoint_callback
    ckpt_path = checkpoint.best_model_path if checkpoint is not None and checkpoint.best_model_path else None
    results = trainer.test(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    if trainer.is_global_zero and results and not trainer.fast_dev_run:
        saved_at = {"epoch": max(trainer.current_epoch - 1, 0), "global_step": trainer.global_step}
        if ckpt_path and Path(ckpt_path).is_file():
            # Memory-mapped: the two counters are read without reading the weights.
            tested = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            saved_at = {name: tested[name] for name in saved_at}
        summary = {
            "checkpoint": ckpt_path,
            **saved_at,
            "world_size": trainer.world_size,
            "metrics": results[0],
        }
        path = run_dir(trainer) / "test_metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")  # whole or absent, never cut short
        partial.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(partial, path)
        rank_zero_info(f"Test metrics written to {path}")


class SaveConfigToRunDir(SaveConfigCallback):
    """Saves the full resolved config as ``config.yaml`` beside the run's ``checkpoints/``, and the
    environment it runs in as ``environment.json`` (:mod:`engine.environment`).

    Lightning's default writes it to ``trainer.log_dir``, which for wandb is the shared save
    folder, so every run would overwrite the last one's config. The loggers' run ids (``version``,
    ``id``) are left out: the folder already names the run, and a new run trained with
    ``--config <run>/config.yaml`` (or a copy of it)
    writes into a folder and logger run of its own, not the old one's.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs["save_to_log_dir"] = False
        super().__init__(*args, **kwargs)

    def save_config(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.fast_dev_run:  # a smoke test writes nothing, as Lightning intends for fast_dev_run
            return
        folder = run_dir(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / self.config_filename
        if path.exists():
            # A resumed run (requeued SLURM job, --ckpt_path) continues in the same folder: keep
            # its first config, and add this one beside it only when it differs.
            path = folder / f"{path.stem}.new{path.suffix}"
        record_environment(folder)
        config = self.config.clone()
        for logger in configured_loggers(config.trainer):
            for key in ("version", "id"):
                if getattr(logger, "init_args", None) is not None and logger.init_args.get(key) is not None:
                    logger.init_args[key] = None
        self.parser.save(config, path, skip_unset=False, overwrite=True, multifile=self.multifile)
        if path.name != self.config_filename:
            first = folder / self.config_filename
            if path.read_bytes() == first.read_bytes():
                path.unlink()
                return
            path.rename(next_numbered(first))
