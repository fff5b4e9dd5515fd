"""Run folders and the run policy: where one run's config, checkpoints and metrics live, how a run is found again.

A run folder is ``<save_dir>/<name>/<version>`` of the first logger, the folder Lightning's
ModelCheckpoint writes ``checkpoints/`` into. Its version is the logger's run id (for wandb, the
run id too), so the folder and the logger run are found from each other. A new run's version is
``<config>-<YYYYmmdd-HHMMSS>-<4 hex digits>`` (``default-20261124-104404-3f9a``: the config file
it was started with, its local start time, and a random part so that runs started in the same
second differ), ``slurm-<job id>`` under SLURM, ``<config>-torchrun-<run id>`` under torchrun, or
what the user passes (``--trainer.logger.init_args.version=<name>``).
"""

import json
import os
import re
import secrets
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import DummyExperiment
from lightning.pytorch.utilities import rank_zero_info

from .checkpoints import check_distributed_checkpoint, check_members
from .errors import ConfigError, MissingFileError
from .launch import slurm_job_id


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


@dataclass(frozen=True)
class RunStart:
    """What a fit's run folder held when this process chose it: the only record cleanup trusts.

    Attributes:
        folder: the run folder.
        found: every path under it then (relative, POSIX), files and folders: never removed.
        made: the folder and those of its parents that did not exist then, deepest first: the only
            folders cleanup may remove (once empty).
    """

    folder: Path
    found: frozenset[str]
    made: tuple[Path, ...]


# The run folders this process claimed for a fit (claim_run_dir), by absolute path.
_STARTS: dict[Path, RunStart] = {}


def claim_run_dir(folder: Path, own_run: bool, option: str) -> RunStart:
    """Take ``folder`` as a fit's run folder and remember what it holds, before anything is built.

    A new run writes only into a folder that is missing or empty: one that holds anything (a user's
    folder named by mistake, another run) is refused, since Lightning would write over its files and a
    failed start would clean it up. ``own_run``: the folder is this run's own, continued (``--resume``,
    a ``--ckpt_path`` inside it, a requeued job), and what it holds is kept.

    Raises:
        ConfigError: ``folder`` is not empty and not the run's own; names ``option`` and the ways on.
    """
    folder = Path(folder).absolute()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(f"{option}: the run folder {folder} is a file: name a new folder")
    held = sorted(entry.name for entry in folder.iterdir()) if folder.is_dir() else []
    if held and not own_run:  # refused before anything is read below it (the folder may be a whole home)
        raise ConfigError(
            f"{option}: the run folder {folder} exists and holds {len(held)} entries ({', '.join(held[:3])}"
            f"{', ...' if len(held) > 3 else ''}): a new run writes only into a new or empty folder. Continue a run "
            "of this project with --resume=true (make resume), or name a new folder (leave the version out: "
            "one is named for you)"
        )
    found = frozenset(path.relative_to(folder).as_posix() for path in folder.rglob("*")) if held else frozenset()
    made = tuple(path for path in (folder, *folder.parents) if not path.exists())
    start = _STARTS[folder] = RunStart(folder, found, made)
    return start


def remove_unstarted_run_dir(trainer: L.Trainer) -> None:
    """Undo what a fit wrote when it stopped before its first training step (a data or config mistake
    found once fit started): the files and folders that were not in its run folder when it was claimed
    (:func:`claim_run_dir`), then the folders the run made, once empty. Nothing else is ever removed:
    not what the folder held before, not a folder this process did not claim, not a written checkpoint.
    """
    start = _STARTS.get(run_dir(trainer).absolute())
    if start is None or trainer.global_step > 0 or not start.folder.is_dir():
        return
    written = [path for path in start.folder.rglob("*") if path.relative_to(start.folder).as_posix() not in start.found]
    if any(path.suffix == ".ckpt" for path in written):
        return
    for path in sorted(written, key=lambda path: len(path.parts), reverse=True):  # a folder's files before it
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        elif not any(path.iterdir()):
            path.rmdir()
    for folder in start.made:
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


def announce_run(trainer: L.Trainer) -> None:
    """Say in one line where this run writes (rank zero), with how to upload an offline wandb run or its address."""
    if not trainer.is_global_zero:
        return
    where = f"Run folder: {run_dir(trainer)}"
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and not isinstance(logger.experiment, DummyExperiment):
            run = logger.experiment
            if run.settings.mode == "offline":
                where += f" (wandb offline: `wandb sync {Path(run.dir).parent}` uploads it)"
            else:
                where += f" (wandb: {run.url})"
    rank_zero_info(where)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest resumable checkpoint of a run folder, or None.

    Candidates are every checkpoint of ``checkpoints/``: ``last.ckpt`` (rewritten after every
    epoch), the ``interrupted-step<N>.ckpt`` that ``callbacks.PreemptionCheckpoint`` saves on a
    signal, and the best ``epoch*.ckpt`` (a whole training state too). The newest loadable one
    wins, so a job pre-empted twice resumes from its latest state, and a run whose last save failed
    (a full disk) from the save before. A sharded (FSDP2) checkpoint is a folder and counts too once its
    ``.metadata`` holds only torch's metadata classes (:func:`engine.checkpoints.check_distributed_checkpoint`);
    a file with compressed members is passed over (it would expand in memory).
    """
    existing = sorted(folder.glob("checkpoints/*.ckpt"), key=lambda path: path.stat().st_mtime, reverse=True)
    for path in existing:  # newest first; one that cannot be read (a save cut short, not a file) is passed over
        if _is_readable_checkpoint(path):
            return path
    return None


def _is_readable_checkpoint(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():  # a distributed checkpoint: its .metadata is unpickled
            check_distributed_checkpoint(path)
            return True
        if path.is_symlink() or not path.is_file():
            return False
        check_members(path)  # a compressed member would expand in memory
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # any reason not to resume from it (truncated, corrupt, refused): try the next one
        return False
    return isinstance(checkpoint, dict) and "state_dict" in checkpoint and "optimizer_states" in checkpoint


def best_checkpoint(root: str | Path = "logs") -> Path:
    """The best checkpoint of the latest run under ``root``: what ``make predict`` and friends load by default.

    The latest run is the run folder (``<run>/checkpoints/``) holding the newest checkpoint, a file or a
    distributed (fsdp2 preset) folder. Its best checkpoint is the one its ``test_metrics.json`` names (the
    first ModelCheckpoint's best), else its newest checkpoint that is not ``last.ckpt`` or an interrupted one,
    else its newest resumable one (:func:`latest_checkpoint`), said in one line on standard error. A folder
    is read as the one file :func:`engine.sharding.consolidate` gathered it into, once there is one.

    Raises:
        FileNotFoundError: no checkpoint under ``root`` (says to train first or pass a path), or the latest
            run's is a folder not yet gathered into one file (says how).
    """
    found = [path for path in Path(root).glob("**/checkpoints/*.ckpt") if path.is_file() or path.is_dir()]
    if not found:
        raise MissingFileError(f"no checkpoint under {root}/: train first (make train) or pass one (CKPT=path)")
    run = max(found, key=lambda path: path.stat().st_mtime).parent.parent
    named = (read_test_metrics(run) or {}).get("checkpoint")
    if isinstance(named, str) and Path(named).exists():
        return _one_file(Path(named))
    best = [
        path
        for path in run.glob("checkpoints/*.ckpt")
        if path.name != "last.ckpt" and not path.name.startswith("interrupted-") and path in found
    ]
    if best:
        return _one_file(max(best, key=lambda path: path.stat().st_mtime))
    fallback = latest_checkpoint(run) or max(run.glob("checkpoints/*.ckpt"), key=lambda path: path.stat().st_mtime)
    print(f"no best checkpoint in {run} (the run never validated): using its latest, {fallback.name}", file=sys.stderr)
    return _one_file(fallback)


def _one_file(checkpoint: Path) -> Path:
    """``checkpoint``; for a distributed checkpoint folder, the one file it was gathered into (``.consolidated``)."""
    if not checkpoint.is_dir():
        return checkpoint
    gathered = checkpoint.with_name(f"{checkpoint.name}.consolidated")
    if gathered.is_file() and gathered.stat().st_mtime >= checkpoint.stat().st_mtime:
        return gathered
    raise MissingFileError(
        f"the latest run's checkpoint, {checkpoint}, is a distributed one (a folder of shards): gather it into "
        f"one file with python -m {__package__}.sharding {checkpoint}, then run this again"
    )


def read_test_metrics(run: Path) -> dict | None:
    """A run's ``test_metrics.json`` as written by :func:`evaluate_best_checkpoint`; None when it is missing,
    not a regular file, truncated or not a JSON object (one line on standard error then: the file is data)."""
    path = run / "test_metrics.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        print(f"{path}: not readable ({type(error).__name__}): left aside", file=sys.stderr)
        return None
    if not isinstance(summary, dict) or not isinstance(summary.get("metrics", {}), dict):
        print(f"{path}: not the summary `make train` writes: left aside", file=sys.stderr)
        return None
    return summary


def configured_loggers(trainer_config) -> list:
    """The ``trainer.logger`` entries of a parsed config as a list: none, one, or several (a list given);
    ``false``/``null`` give none."""
    loggers = trainer_config.get("logger")
    return [logger for logger in (loggers if isinstance(loggers, list) else [loggers]) if logger]


def _first_logger(trainer_config):
    logger = next(iter(configured_loggers(trainer_config)), None)
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


def set_run_version(trainer_config, version: str, fit: bool = False) -> None:
    """Make a parsed trainer config log into run ``version`` (for wandb: continue that run id); without a
    logger, a fit's run folder becomes ``<default_root_dir>/<version>`` (each run a folder of its own)."""
    logger = _first_logger(trainer_config)
    if logger is not None:
        logger.init_args.version = version
    elif fit:
        trainer_config.default_root_dir = str(experiment_dir(trainer_config) / version)


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


# ---- the run policy: which folder a run logs into, what it resumes, what it leaves behind ----------


def choose_run(config, fit: bool = True) -> None:
    """Decide, in a parsed config, which run folder to log into and (for fit) which checkpoint to resume.

    - Under SLURM the run is ``slurm-<job id>``; a requeued job's fit resumes from that run's
      newest checkpoint.
    - ``--resume=true`` continues the latest run of the experiment from its newest checkpoint.
    - ``--ckpt_path`` inside a run folder of the experiment continues in that folder.
    - Otherwise the logger starts a new run (without a logger, fit's run folder is a new
      ``<default_root_dir>/<run name>``), in a folder that must be new or empty
      (:func:`claim_run_dir`, before anything is built).

    Raises:
        ConfigError: ``--resume`` and nothing to resume; a new run's folder that holds files.
    """
    trainer = config.trainer
    if job_id := slurm_job_id():
        name_run_after_slurm_job(trainer, job_id)
        run = Path(trainer.default_root_dir)
        # The job's own run when it was requeued (its id names the folder), or when it holds the job's checkpoint.
        own = int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0 or latest_checkpoint(run) is not None
    elif fit and config.get("resume"):
        run = run_to_resume(trainer)
        set_run_version(trainer, run.name, fit)
        own = True
    else:
        holder = run_of_checkpoint(trainer, config.ckpt_path) if fit and config.get("ckpt_path") else None
        if holder is not None and run_version(trainer) is None:
            set_run_version(trainer, holder.name, fit)
        elif run_version(trainer) is None:
            set_run_version(trainer, new_run_name(config), fit)
        if fit and _launching_process():
            # The run's own folder when the checkpoint it continues is in it (named by --ckpt_path or the version).
            own = holder is not None and planned_run_dir(trainer).resolve() == holder
            claim_run_dir(planned_run_dir(trainer), own, _folder_option(trainer))
        return
    if fit and _launching_process():
        # A torchelastic restart continues its own run too (the folder is named after torchrun's run id).
        claim_run_dir(run, own or int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0, _folder_option(trainer))
    if fit and config.get("ckpt_path") is None and (checkpoint := latest_checkpoint(run)) is not None:
        rank_zero_info(f"Resuming run {run} from {checkpoint}")
        config.ckpt_path = str(checkpoint)


def planned_run_dir(trainer_config) -> Path:
    """The run folder a parsed trainer config will write into: :func:`run_dir`'s rule before the Trainer exists."""
    version = run_version(trainer_config)
    if _first_logger(trainer_config) is None or version is None:
        return Path(trainer_config.get("default_root_dir") or ".")
    return experiment_dir(trainer_config) / (version if isinstance(version, str) else f"version_{version}")


def _folder_option(trainer_config) -> str:
    """The option that names a parsed trainer config's run folder, for messages."""
    if _first_logger(trainer_config) is None:
        return f"trainer.default_root_dir={trainer_config.get('default_root_dir')}"
    return f"trainer.logger.init_args.version={run_version(trainer_config)}"


def _launching_process() -> bool:
    """True in the process a run starts from: not a DDP, torchrun or srun process of another rank
    (they name the same folder once rank 0 has written into it)."""
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
    return all(os.environ.get(name, "0") == "0" for name in ranks)


# Every process of a DDP run must name the run alike. Lightning starts the other processes on this
# machine by running the same command again, with LOCAL_RANK set: they take the name rank 0 chose
# from the environment they inherit. torchrun starts every process itself: they share its run id.
RUN_NAME_VARIABLE = "RUN_NAME_OF_LOCAL_RANK_0"


def new_run_name(config) -> str:
    """``<config file>-<local start time>-<random>`` for a new run (see the module docstring);
    ``<config file>-torchrun-<its run id>`` for a run that torchrun started."""
    if os.environ.get("LOCAL_RANK", "0") != "0" and RUN_NAME_VARIABLE in os.environ:
        return os.environ[RUN_NAME_VARIABLE]
    files = config.get("config") or []
    stem = Path(str(files[-1])).stem if files else "run"
    if torchrun_id := os.environ.get("TORCHELASTIC_RUN_ID"):
        return f"{stem}-torchrun-{re.sub(r'[^A-Za-z0-9_-]', '-', torchrun_id)[:36]}"
    name = f"{stem}-{datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"
    os.environ[RUN_NAME_VARIABLE] = name
    return name


def run_to_resume(trainer_config) -> Path:
    """The run ``--resume=true`` continues: the one the logger's version names, else the latest with a checkpoint.

    Raises:
        ConfigError: no such run, or it has no checkpoint; says to start one with ``make train``.
    """
    version = run_version(trainer_config)  # a run the user named, else the latest
    if version is not None:
        run = experiment_dir(trainer_config) / (version if isinstance(version, str) else f"version_{version}")
    else:
        run = latest_run(trainer_config)
    if run is None or latest_checkpoint(run) is None:
        where = run or experiment_dir(trainer_config)
        raise ConfigError(f"--resume: no run with a checkpoint in {where}; start one with `make train`")
    return run


def finish_logger_runs() -> None:
    """End this process's wandb run (if any), so that the next Trainer of the process starts its own.

    wandb keeps one run per process (``wandb.run``): a second WandbLogger would log into the first
    run and its folder ("a wandb run already in progress ... will reuse this run"). Lightning's
    ``finalize`` does not end it; ``wandb.finish()`` does. A no-op when wandb was never imported.
    """
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
