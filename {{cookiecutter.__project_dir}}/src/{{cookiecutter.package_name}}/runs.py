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

    Candidates are ``checkpoints/last.ckpt`` (rewritten every epoch) and the pre-emption
    checkpoints ``hpc_ckpt_<n>.ckpt`` (saved on SIGUSR1 by
    :class:`~{{ cookiecutter.package_name }}.callbacks.PreemptionCheckpoint`, named as Lightning names
    its own); the newest file wins, so a job pre-empted twice resumes from its latest state, not
    from its first pre-emption.
    """
    candidates = [*folder.glob("hpc_ckpt_*.ckpt"), folder / "checkpoints" / "last.ckpt"]
    existing = [path for path in candidates if path.exists()]  # a sharded (FSDP) checkpoint is a folder
    return max(existing, key=lambda path: path.stat().st_mtime) if existing else None


def name_run_after_slurm_job(trainer_config, job_id: str) -> None:
    """Give the run of a SLURM job a fixed name, ``slurm-<job id>``, in a parsed trainer config.

    A requeued job (pre-emption, node failure) keeps its id, so it continues in the same run
    folder and the same logger run (the wandb id is the version). ``default_root_dir`` becomes that
    run folder, where pre-emption checkpoints are written and looked for on restart, so two jobs
    sharing ``logs/`` never resume from each other's checkpoint. A version set by the user is kept.
    """
    loggers = trainer_config.get("logger")
    logger = loggers[0] if isinstance(loggers, list) and loggers else loggers
    init = getattr(logger, "init_args", None)
    if init is None:
        trainer_config.default_root_dir = str(Path(trainer_config.get("default_root_dir") or ".", f"slurm-{job_id}"))
        return
    if init.get("version") is None and init.get("id") is None:
        init.version = f"slurm-{job_id}"
    version = init.get("version") or init.get("id")
    # The run folder, by the rule of run_dir(): wandb names it after the project.
    name = init.get("project") if "WandbLogger" in logger.class_path else init.get("name", "lightning_logs")
    save_dir = init.get("save_dir") or trainer_config.get("default_root_dir") or "."
    trainer_config.default_root_dir = str(Path(save_dir, name or "", str(version)))
