"""Run folders: where one run's config, checkpoints and metrics live, and how a run is found again.

A run folder is ``<save_dir>/<name>/<version>`` of the first logger, the folder Lightning's
ModelCheckpoint writes ``checkpoints/`` into. Its version is the logger's run id (the wandb id,
or ``version_<n>``), so the folder and the logger run are found from each other.
"""

from pathlib import Path

import lightning as L


def run_dir(trainer: L.Trainer) -> Path:
    """The folder of this run: ``<save_dir>/<name>/<version>`` of the first logger.

    It is the folder in which ModelCheckpoint puts ``checkpoints/`` by default (same rule as
    Lightning's ``ModelCheckpoint``), for every logger, wandb included. Without a logger it is
    ``trainer.default_root_dir``. Call it on global rank zero only: asking a logger for its
    version may start its run.
    """
    if not trainer.loggers:
        return Path(trainer.default_root_dir)
    logger = trainer.loggers[0]
    if logger.version is None:
        logger.experiment  # noqa: B018 - wandb knows its run id only once the run has started
    version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
    return Path(logger.save_dir or trainer.default_root_dir, str(logger.name), version)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest resumable checkpoint of a run folder, or None.

    Candidates are ``checkpoints/last.ckpt`` (rewritten after every epoch) and the
    ``checkpoints/interrupted-step<N>.ckpt`` that ``callbacks.PreemptionCheckpoint`` saves on a
    signal. The newest file wins, so a job pre-empted twice resumes from its latest state, not from its first
    pre-emption. A sharded (FSDP) checkpoint is a folder and counts too.
    """
    candidates = [folder / "checkpoints" / "last.ckpt", *folder.glob("checkpoints/interrupted-step*.ckpt")]
    existing = [path for path in candidates if path.exists()]
    return max(existing, key=lambda path: path.stat().st_mtime) if existing else None


def _first_logger(trainer_config):
    loggers = trainer_config.get("logger")
    logger = loggers[0] if isinstance(loggers, list) and loggers else loggers
    return logger if getattr(logger, "init_args", None) is not None else None


def experiment_dir(trainer_config) -> Path:
    """``<save_dir>/<name>`` of a parsed trainer config's first logger: the folder holding its runs.

    Follows the rule of :func:`run_dir` (wandb names the folder after the project); without a
    logger it is ``default_root_dir``.
    """
    root = trainer_config.get("default_root_dir") or "."
    logger = _first_logger(trainer_config)
    if logger is None:
        return Path(root)
    init = logger.init_args
    name = init.get("project") if "WandbLogger" in logger.class_path else init.get("name", "lightning_logs")
    return Path(init.get("save_dir") or root, name or "")


def set_run_version(trainer_config, version: str) -> None:
    """Make a parsed trainer config log into run ``version`` (for wandb: continue that run id)."""
    logger = _first_logger(trainer_config)
    if logger is not None:
        logger.init_args.version = version


def run_version(trainer_config) -> str | None:
    """The run version a parsed trainer config asks for (for wandb, ``version`` or ``id``), or None."""
    logger = _first_logger(trainer_config)
    if logger is None:
        return None
    return logger.init_args.get("version") or logger.init_args.get("id")


def latest_run(trainer_config) -> Path | None:
    """The run folder of this experiment whose newest checkpoint is the newest, or None."""
    folder = experiment_dir(trainer_config)
    runs = [(checkpoint, run) for run in folder.glob("*/") if (checkpoint := latest_checkpoint(run)) is not None]
    return max(runs, key=lambda pair: pair[0].stat().st_mtime)[1] if runs else None


def run_of_checkpoint(trainer_config, ckpt_path: str) -> Path | None:
    """The run folder of this experiment that holds ``ckpt_path`` (``<run>/checkpoints/...``), or None."""
    path = Path(ckpt_path).resolve()
    folder = experiment_dir(trainer_config).resolve()
    if path.parent.name == "checkpoints" and path.parent.parent.parent == folder:
        return path.parent.parent
    return None


def name_run_after_slurm_job(trainer_config, job_id: str) -> None:
    """Give the run of a SLURM job a fixed name, ``slurm-<job id>``, in a parsed trainer config.

    A requeued job (pre-emption, node failure) keeps its id, so it continues in the same run
    folder and the same logger run (the wandb id is the version). ``default_root_dir`` becomes that
    run folder, so anything Lightning writes there stays with the job. A version set by the user
    is kept.
    """
    if _first_logger(trainer_config) is None:
        trainer_config.default_root_dir = str(Path(trainer_config.get("default_root_dir") or ".", f"slurm-{job_id}"))
        return
    if run_version(trainer_config) is None:
        set_run_version(trainer_config, f"slurm-{job_id}")
    trainer_config.default_root_dir = str(experiment_dir(trainer_config) / str(run_version(trainer_config)))
