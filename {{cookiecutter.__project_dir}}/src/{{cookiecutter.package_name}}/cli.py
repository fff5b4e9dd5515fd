"""The command line: ``python -m {{ cookiecutter.package_name }} fit|validate|test|predict --config ...``.

Built on LightningCLI (https://lightning.ai/docs/pytorch/stable/cli/lightning_cli.html): every
option of the Trainer, the LightningModule and the LightningDataModule comes from their type
hints, configs stack with repeated ``--config``, and an unknown key or a wrong type stops the run
with jsonargparse's message before anything is built or trained.
"""

import importlib
import json
import netrc
import os
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from {{ cookiecutter.package_name }}.checkpoints import check_fits, read_checkpoint
from {{ cookiecutter.package_name }}.launch import check_world_size, slurm_job_id
from {{ cookiecutter.package_name }}.runs import (
    experiment_dir,
    latest_checkpoint,
    latest_run,
    name_run_after_slurm_job,
    run_dir,
    run_of_checkpoint,
    run_version,
    set_run_version,
)


def wandb_is_configured() -> bool:
    """True when the user chose a wandb mode or has credentials (WANDB_MODE, WANDB_API_KEY, netrc).

    Reads the same places as ``wandb login`` without importing wandb (slow to import).
    """
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).netloc
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def drop_progress_bar_if_disabled(trainer_config) -> None:
    """With ``trainer.enable_progress_bar`` false, remove progress bars from ``trainer.callbacks``.

    The default config lists Lightning's RichProgressBar (to set its refresh rate), and Lightning
    refuses a progress bar callback together with ``enable_progress_bar=False``: this keeps
    ``--trainer.enable_progress_bar=false`` working as the one switch.
    """
    callbacks = trainer_config.get("callbacks")
    if trainer_config.get("enable_progress_bar") is not False or not isinstance(callbacks, list):
        return
    trainer_config.callbacks = [c for c in callbacks if not _is_progress_bar(getattr(c, "class_path", ""))]


def fall_back_to_fp16_without_bf16(trainer_config) -> None:
    """Turn ``bf16-mixed`` into ``16-mixed`` (with loss scaling) on CUDA GPUs without bfloat16 (before Ampere).

    Checked only when the run would use CUDA (accelerator ``gpu``, ``cuda`` or ``auto`` with a GPU).
    """
    accelerator = str(trainer_config.get("accelerator", "auto"))
    if trainer_config.get("precision") != "bf16-mixed" or accelerator not in ("gpu", "cuda", "auto"):
        return
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported(including_emulation=False):
        rank_zero_warn(
            f"trainer.precision=bf16-mixed: {torch.cuda.get_device_name()} has no bfloat16; using 16-mixed "
            "(float16 with loss scaling) instead. Set trainer.precision to silence this."
        )
        trainer_config.precision = "16-mixed"


def _is_progress_bar(class_path: str) -> bool:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, ProgressBar)


def choose_run(config, fit: bool = True) -> None:
    """Decide, in a parsed config, which run folder to log into and (for fit) which checkpoint to resume.

    - Under SLURM the run is ``slurm-<job id>``; a requeued job's fit resumes from that run's
      newest checkpoint.
    - ``--resume=true`` continues the latest run of the experiment from its newest checkpoint.
    - ``--ckpt_path`` inside a run folder of the experiment continues in that folder.
    - Otherwise the logger starts a new run.

    Raises:
        ValueError: ``--resume`` and nothing to resume.
    """
    trainer = config.trainer
    if job_id := slurm_job_id():
        name_run_after_slurm_job(trainer, job_id)
        run = Path(trainer.default_root_dir)
    elif fit and config.get("resume"):
        run = _run_to_resume(trainer)
        set_run_version(trainer, run.name)
    else:
        explicit = fit and config.get("ckpt_path") and run_version(trainer) is None
        if explicit and (run := run_of_checkpoint(trainer, config.ckpt_path)) is not None:
            set_run_version(trainer, run.name)
        return
    if fit and config.get("ckpt_path") is None and (checkpoint := latest_checkpoint(run)) is not None:
        rank_zero_info(f"Resuming run {run} from {checkpoint}")
        config.ckpt_path = str(checkpoint)


def _run_to_resume(trainer_config) -> Path:
    version = run_version(trainer_config)  # a run the user named, else the latest
    if version is not None:
        run = experiment_dir(trainer_config) / (version if isinstance(version, str) else f"version_{version}")
    else:
        run = latest_run(trainer_config)
    if run is None or latest_checkpoint(run) is None:
        where = run or experiment_dir(trainer_config)
        raise ValueError(f"--resume: no run with a checkpoint in {where}; start one with `make train`")
    return run


def keep_csv_metrics(trainer: L.Trainer) -> None:
    """Move a CSVLogger's existing ``metrics.csv`` aside (``metrics-<n>.csv``) before a resumed run writes.

    Lightning's CSVLogger deletes ``metrics.csv`` when it finds one in its folder, so a run resumed
    into its own folder (a requeued SLURM job) would lose everything logged before the resume.
    """
    for logger in trainer.loggers:
        if trainer.is_global_zero and isinstance(logger, CSVLogger):
            metrics = Path(logger.log_dir, "metrics.csv")
            if metrics.is_file():
                number = 1 + len(list(metrics.parent.glob("metrics-*.csv")))
                metrics.rename(metrics.with_name(f"metrics-{number}.csv"))


class SaveConfigToRunDir(SaveConfigCallback):
    """Saves the full resolved config as ``config.yaml`` beside the run's ``checkpoints/``.

    Lightning's default writes it to ``trainer.log_dir``, which for wandb is the shared save
    folder, so every run would overwrite the last one's config.
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
        self.parser.save(self.config, path, skip_unset=False, overwrite=True, multifile=self.multifile)
        if path.name != self.config_filename:
            first = folder / self.config_filename
            if path.read_bytes() == first.read_bytes():
                path.unlink()
                return
            number = 1 + len(list(folder.glob(f"{first.stem}-resumed-*{first.suffix}")))
            path.rename(folder / f"{first.stem}-resumed-{number}{first.suffix}")


class CLI(LightningCLI):
    """LightningCLI with the project's links, switches and after-fit test."""

    def add_arguments_to_parser(self, parser) -> None:
        # The data decides the number of classes; the model and its net cannot disagree with it.
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.num_classes", "model.init_args.net.init_args.num_classes", apply_on="instantiate")
        parser.add_argument(
            "--float32_matmul_precision",
            type=Literal["highest", "high", "medium"] | None,
            default=None,
            help="torch.set_float32_matmul_precision: 'high' lets float32 matmuls use TF32 on Ampere+ GPUs.",
        )
        parser.add_argument(
            "--test_after_fit",
            type=bool,
            default=True,
            help="After fit, test the best checkpoint and write test_metrics.json into the run folder.",
        )
        parser.add_argument(
            "--resume",
            type=bool,
            default=False,
            help="fit: continue the latest run of this experiment (its run folder and logger run) from its "
            "newest checkpoint (last.ckpt or an interrupted-step*.ckpt). `make resume` sets it.",
        )

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand, self.config)
        if config.get("float32_matmul_precision"):
            torch.set_float32_matmul_precision(config["float32_matmul_precision"])
        loggers = config.get("trainer", {}).get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            save_dir = getattr(getattr(logger, "init_args", None), "save_dir", None)
            if save_dir:
                # wandb looks for a git repository from its save folder, and warns if it is missing.
                Path(save_dir).mkdir(parents=True, exist_ok=True)
            if "WandbLogger" in str(getattr(logger, "class_path", "")) and not wandb_is_configured():
                # No credentials and no chosen mode: log offline (sync later with `wandb sync`)
                # instead of stopping at a login prompt.
                os.environ["WANDB_MODE"] = "offline"
        if "trainer" in config:
            drop_progress_bar_if_disabled(config.trainer)
            fall_back_to_fp16_without_bf16(config.trainer)
            choose_run(config, fit=self.subcommand == "fit")

    def after_instantiate_classes(self) -> None:
        # Before any process group is set up: a mismatch fails here instead of hanging later.
        check_world_size(self.trainer)

    def parse_arguments(self, parser, args) -> None:
        super().parse_arguments(parser, args)
        # LightningCLI reads the checkpoint's hyperparameters right after parsing (they override
        # the model config): read it first, so a missing, truncated or corrupt file is named.
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path and self.config[subcommand].get("resume"):
            raise ValueError(
                "--resume and --ckpt_path: give only one (--resume picks the latest run's newest checkpoint)"
            )
        if ckpt_path and ckpt_path not in ("best", "last", "hpc", "registry") and not Path(ckpt_path).is_dir():
            read_checkpoint(ckpt_path)

    def _check_ckpt_path(self) -> None:
        # A checkpoint that does not fit the model fails here with what differs, before anything runs.
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        if ckpt_path and ckpt_path not in ("best", "last", "hpc", "registry") and not Path(ckpt_path).is_dir():
            check_fits(read_checkpoint(ckpt_path), self.model, ckpt_path)

    def before_validate(self) -> None:
        self._check_ckpt_path()

    def before_test(self) -> None:
        self._check_ckpt_path()

    def before_predict(self) -> None:
        self._check_ckpt_path()

    def before_fit(self) -> None:
        self._check_ckpt_path()
        keep_csv_metrics(self.trainer)
        profiler = self.trainer.profiler
        if self.trainer.is_global_zero and getattr(profiler, "filename", None) and profiler.dirpath is None:
            # Profilers write to trainer.log_dir, which for wandb is the shared save folder.
            # Other ranks keep that default: each writes its own rank-suffixed report.
            profiler.dirpath = run_dir(self.trainer)

    def after_fit(self) -> None:
        trainer = self.trainer
        if not self.config.fit.test_after_fit or trainer.interrupted:
            return
        # The first ModelCheckpoint tracks the best model. fast_dev_run and runs without a
        # ModelCheckpoint have none: then test the weights in memory.
        checkpoint = trainer.checkpoint_callback
        ckpt_path = checkpoint.best_model_path if checkpoint is not None and checkpoint.best_model_path else None
        results = trainer.test(self.model, datamodule=self.datamodule, ckpt_path=ckpt_path, weights_only=True)
        if trainer.is_global_zero and results and not trainer.fast_dev_run:
            summary = {
                "checkpoint": ckpt_path,
                "global_step": trainer.global_step,
                "world_size": trainer.world_size,
                "metrics": results[0],
            }
            path = run_dir(trainer) / "test_metrics.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(summary, indent=2) + "\n")
            rank_zero_info(f"Test metrics written to {path}")


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """Run the CLI on ``args`` (default: ``sys.argv[1:]``) and return it.

    With ``run=False`` there is no subcommand: the CLI only parses ``args`` and builds the
    Trainer, model and DataModule (``cli.trainer``, ``cli.model``, ``cli.datamodule``).
    """
    return CLI(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=SaveConfigToRunDir,
        # A mistyped option must fail, not silently match a longer one (--trainer.max_epoch).
        parser_kwargs={"allow_abbrev": False},
        args=args,
        run=run,
    )


if __name__ == "__main__":
    main()
