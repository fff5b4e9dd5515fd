"""Fix-ups of a parsed config, before anything is built: loggers, switched-off callbacks, precision, run folder.

The CLI calls :func:`prepare` between parsing and instantiation, so everything here acts on plain
config values and a bad value fails before any model, data or process group exists.
"""

import importlib
import netrc
import os
from pathlib import Path
from urllib.parse import urlsplit

import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelSummary, ProgressBar
from lightning.pytorch.utilities import rank_zero_info

from .errors import ConfigError
from .precision import fall_back_to_fp16_without_bf16
from .run_folders import choose_run, configured_loggers


def prepare(config, subcommand: str | None) -> None:
    """Apply every fix-up to the parsed config of ``subcommand`` (fit, validate, test, predict or None)."""
    if config.get("float32_matmul_precision"):
        torch.set_float32_matmul_precision(config["float32_matmul_precision"])
    if "trainer" not in config:
        return
    check_hardware(config.trainer)
    check_clipping(config.trainer)
    drop_disabled_callbacks(config.trainer)
    fall_back_to_fp16_without_bf16(config.trainer)
    if subcommand == "fit":
        let_max_steps_decide(config.trainer)
    choose_run(config, fit=subcommand == "fit")
    prepare_loggers(config.trainer)  # after the run folder is claimed: the save folder it makes is the run's


def let_max_steps_decide(trainer_config) -> None:
    """``trainer.max_steps`` given: it ends the run, and ``max_epochs`` is lifted (said in one line).

    Lightning stops at whichever limit comes first, so ``--trainer.max_steps=300`` on a config with
    ``max_epochs: 5`` of 16 batches stopped at step 80 without a word.
    """
    steps, epochs = trainer_config.get("max_steps"), trainer_config.get("max_epochs")
    if steps is not None and steps > 0 and epochs is not None and epochs >= 0:
        rank_zero_info(
            f"trainer.max_steps={steps} ends this run; trainer.max_epochs={epochs} is lifted so that it cannot end "
            "it sooner (give max_steps: -1 to train by epochs)"
        )
        trainer_config.max_epochs = -1


def check_hardware(trainer_config) -> None:
    """Stop in one line when the config asks for a GPU (accelerator gpu/cuda, or FSDP1) this machine lacks.

    Lightning would stop too, but later and under a long traceback.

    Raises:
        ConfigError: naming the setting (and the preset that sets it) and what to do instead.
    """
    if torch.cuda.is_available():
        return
    accelerator = str(trainer_config.get("accelerator") or "auto")
    strategy = trainer_config.get("strategy")
    strategy_name = str(getattr(strategy, "class_path", strategy) or "")
    # Lightning's FSDPStrategy (FSDP1; "fsdp" and its "fsdp_*" aliases) runs on CUDA only; the fsdp2 preset's
    # strategy (engine.sharding.FSDP2Strategy) runs on CPU processes too.
    name = strategy_name.rsplit(".", 1)[-1].lower()
    if name in ("fsdp", "fsdpstrategy") or name.startswith("fsdp_"):
        raise ConfigError(
            f"trainer.strategy={strategy_name} (configs/presets/fsdp.yaml) shards the model across CUDA GPUs, and "
            "this machine has none: use configs/presets/ddp.yaml to train on several CPU processes instead."
        )
    if accelerator in ("gpu", "cuda"):
        raise ConfigError(
            f"trainer.accelerator={accelerator} (the gpu and fsdp presets set it) needs a CUDA GPU, and this machine "
            "has none visible to torch: leave the preset out to train on the CPU, or run on a GPU machine."
        )


def check_clipping(trainer_config) -> None:
    """Refuse a negative ``trainer.gradient_clip_val``, which neither Lightning nor torch refuses: the clipping
    factor ``max_norm / norm`` is then negative and every step climbs the loss (by value: every gradient is set).

    Raises:
        ConfigError: naming the value and the values that work.
    """
    value = trainer_config.get("gradient_clip_val")
    if value is not None and not value >= 0:  # NaN too
        raise ConfigError(
            f"trainer.gradient_clip_val={value}: give a gradient norm (or value) of at least 0 to clip at; "
            "0 or null clips nothing"
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


def prepare_loggers(trainer_config) -> None:
    """Create the loggers' save folders, and make wandb log offline when it has no credentials."""
    for logger in configured_loggers(trainer_config):
        save_dir = getattr(getattr(logger, "init_args", None), "save_dir", None)
        if save_dir:
            # wandb looks for a git repository from its save folder, and warns if it is missing.
            Path(save_dir).mkdir(parents=True, exist_ok=True)
        if "WandbLogger" not in str(getattr(logger, "class_path", "")):
            continue
        if not wandb_is_configured():
            # No credentials and no chosen mode: log offline (sync later with `wandb sync`)
            # instead of stopping at a login prompt.
            os.environ["WANDB_MODE"] = "offline"
        # wandb prints a dozen lines per run, colour codes in a log file and a warning about the
        # `anonymous` argument Lightning always passes; engine.run_folders.announce_run says where the run
        # is in one line instead. WANDB_SILENT=false brings wandb's own lines back.
        os.environ.setdefault("WANDB_SILENT", "true")


def drop_disabled_callbacks(trainer_config) -> None:
    """Remove the progress bar or the model summary from ``trainer.callbacks`` when switched off.

    The default config lists both (to set the bar's refresh rate, and a summary without a column
    of zero FLOPs). Lightning refuses a progress bar callback together with
    ``enable_progress_bar=False`` and prints a listed model summary whatever
    ``enable_model_summary`` says: this keeps ``--trainer.enable_progress_bar=false`` and
    ``--trainer.enable_model_summary=false`` working as the switches. Likewise
    ``--trainer.logger=false`` drops ``LearningRateMonitor``, which Lightning refuses without a
    logger (it has nowhere to write).
    """
    callbacks = trainer_config.get("callbacks")
    if not isinstance(callbacks, list):
        return
    switches = (
        (ProgressBar, "enable_progress_bar"),
        (ModelSummary, "enable_model_summary"),
        (LearningRateMonitor, "logger"),
    )
    disabled = tuple(kind for kind, switch in switches if trainer_config.get(switch) is False)
    if disabled:
        trainer_config.callbacks = [c for c in callbacks if not _is_a(getattr(c, "class_path", ""), disabled)]


def _is_a(class_path: str, kinds: tuple[type, ...]) -> bool:
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, kinds)
