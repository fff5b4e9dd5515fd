"""Dependency messages a run does not need, switched off where the dependency allows it.

Only messages that are noise for every user are dropped, each named with its source; warnings
about the user's own setup (and everything our code says) still reach the terminal.
"""

import logging
import os
import shutil
import warnings

# lightning 2.6 (lightning/pytorch/utilities/_pytree.py) on torch >= 2.10 warns on every run that
# torch.utils._pytree.LeafSpec is deprecated: a note to Lightning's developers, not to a user.
LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
# lightning 2.6 (trainer/connectors/logger_connector) advertises its hosted LitLogger on every run,
# and (trainer.estimated_stepping_batches, which the learning-rate schedule reads) says it builds
# the training loader to count its batches, and (callback_connector) that the summary the default
# config lists replaces its own; (trainer/setup.py) on every run without a GPU or TPU, that there is
# none ("GPU available: True, used: False" still shows).
RANK_ZERO_NOISE = (
    "Tip: For seamless cloud logging",
    "to estimate number of stepping batches",
    "Trainer already configured with model summary callbacks",
    "GPU available: False, used: False",
    "TPU available: False",
)
# lightning 2.6 (loops/fit_loop.py) on every run of fewer training batches an epoch than
# trainer.log_every_n_steps: training metrics are then logged every few epochs instead, as the
# setting says; the validation metrics are logged every epoch whatever it is.
LOGGING_INTERVAL = r"The number of training batches \(\d+\) is smaller than the logging interval"


# lightning 2.6 when a run continues in its own folder (make resume, a requeued SLURM job): the
# CSV logger says "Previous log files in this directory will be deleted" (engine.run_records moves
# metrics.csv aside first, so nothing is lost) and ModelCheckpoint that the folder is not empty.
RESUME_WARNINGS = (
    r"Experiment logs directory .* exists and is not empty",
    r"Checkpoint directory .* exists and is not empty",
)


# lightning 2.6 (callbacks/model_checkpoint.py) when `predict --ckpt_path` restores the checkpoint's
# ModelCheckpoint state into a run with another folder: it says which bookkeeping it will not
# reload, which predicting never uses.
PREDICT_WARNINGS = (r"The dirpath has changed from",)


def silence_predict_warnings() -> None:
    """Drop the warning above for this process (the CLI's predict subcommand)."""
    for message in PREDICT_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


# lightning 2.6 (fabric/plugins/environments/slurm.py) on every machine with srun on its PATH (a
# cluster's login node) when the process was not started by srun: the hint to launch with srun,
# which a single-process tool (make predict, whatever the allocation) never needs.
SRUN_HINT = r"The `srun` command is available on your system but is not used"


def silence_srun_hint() -> None:
    """Drop the hint above for this process (entry points that always run as one process)."""
    warnings.filterwarnings("ignore", message=SRUN_HINT)


def replace_srun_hint() -> None:
    """Drop Lightning's srun hint (said by every Trainer, twice in a fit that tests) and say once where this trains.

    Said only when ``srun`` is on the PATH and this process was not started by it (a login node).
    """
    silence_srun_hint()
    if shutil.which("srun") and "SLURM_NTASKS" not in os.environ:
        logging.getLogger("lightning.pytorch.utilities.rank_zero").info(
            "srun is on this machine's PATH, but this run was not started by it: it trains here, on this "
            "machine. To train on the cluster, submit a batch script with sbatch."
        )


def drop_wandb_anonymous(loggers: list) -> None:
    """Stop wandb's "The anonymous setting has no effect" warning on every run.

    lightning 2.6's WandbLogger passes ``anonymous=None`` to ``wandb.init`` when the user left it
    unset, and wandb (>= 0.22) warns about the setting whenever it is passed at all. Dropping the
    unset value before the run starts changes nothing else (None is wandb's default).
    """
    for logger in loggers:
        init = getattr(logger, "_wandb_init", None)
        if isinstance(init, dict) and init.get("anonymous", "set") is None:
            del init["anonymous"]


class _DropRankZeroNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(noise in message for noise in RANK_ZERO_NOISE)


# Lightning 2.6's WeightAveraging (the ema preset) warns whenever the model overrides configure_model, as
# TrainingModule does for the fsdp2 preset alone: without a device mesh the hook builds nothing. The ema
# preset with fsdp2 is refused in one line instead (TrainingModule.configure_model).
WEIGHT_AVERAGING_OVERRIDE = "You're using the WeightAveraging callback with a model that overrides"


def silence_dependency_noise() -> None:
    """Filter the messages above; safe to call more than once."""
    warnings.filterwarnings("ignore", message=LEAFSPEC, category=FutureWarning)
    warnings.filterwarnings("ignore", message=LOGGING_INTERVAL)
    warnings.filterwarnings("ignore", message=WEIGHT_AVERAGING_OVERRIDE)
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(existing, _DropRankZeroNoise) for existing in logger.filters):
        logger.addFilter(_DropRankZeroNoise())


def replace_resume_warnings(run_dir: str) -> None:
    """Drop Lightning's alarming-but-harmless warnings of a resumed run, and say in one line what happens."""
    for message in RESUME_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").info(
        f"Continuing in {run_dir}: its checkpoints and logged metrics are kept (a CSV logger's earlier rows "
        "move to metrics-<n>.csv)."
    )
