"""Precision rules in one place: bf16 fallback, and when a fused optimizer is allowed.

Measured on an H100 and written down in docs/performance.md ("The GPU fast path"):
- ``bf16-mixed`` needs a GPU with bfloat16 (Ampere or later); older GPUs get ``16-mixed`` with
  loss scaling instead of an error.
- Fused AdamW (one kernel set for every parameter, as nanoGPT uses) is chosen on CUDA except with
  ``16-mixed``: there the loss scaler unscales the gradients inside the fused step, so they could
  not be clipped before it. Lightning's mixed-precision plugin refuses a fused optimizer with
  gradient clipping for ``bf16-mixed`` too, although bf16 has no loss scaler and nothing to
  unscale: ``TrainingModule.configure_gradient_clipping`` clips every run itself (engine.gradients).
"""

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn


def fall_back_to_fp16_without_bf16(trainer_config) -> None:
    """Turn ``bf16-mixed`` into ``16-mixed`` (with loss scaling) on CUDA GPUs without bfloat16 (before Ampere).

    Works on a parsed trainer config (before the Trainer is built); checked only when the run
    would use CUDA (accelerator ``gpu``, ``cuda`` or ``auto`` with a GPU).
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


def fused_optimizer_allowed(module: L.LightningModule, precision: str) -> bool:
    """True when every parameter is on CUDA and the run has no loss scaler (not ``16-mixed``).

    Fused AdamW/Adam/SGD update every parameter in one kernel
    (https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
    on_cuda = all(p.is_cuda for p in module.parameters())
    return on_cuda and str(precision) not in ("16-mixed", "16")
