"""Precision rules in one place: bf16 fallback, when a fused optimizer is allowed, gradient clipping under FSDP.

Measured on an H100 and written down in docs/performance.md ("The GPU fast path"):
- ``bf16-mixed`` needs a GPU with bfloat16 (Ampere or later); older GPUs get ``16-mixed`` with
  loss scaling instead of an error.
- Fused AdamW (one kernel set for every parameter, as nanoGPT uses) is chosen on CUDA except with
  ``16-mixed``: there the loss scaler unscales the gradients inside the fused step, so they could
  not be clipped before it. Lightning's mixed-precision plugin refuses a fused optimizer with
  gradient clipping for ``bf16-mixed`` too, although bf16 has no loss scaler and nothing to
  unscale: :func:`clip_gradients_without_scaler` clips those runs itself, as the plugin's own base
  class does.
- Under FSDP each process holds a shard of the gradients: only the FSDP module computes their
  global norm (Lightning's FSDP precision plugin refuses norm clipping).
"""

import lightning as L
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_warn
from torch.distributed.fsdp import FullyShardedDataParallel

from {{ cookiecutter.package_name }}.engine.errors import ConfigError


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


def clip_gradients_without_scaler(
    trainer: L.Trainer, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None, algorithm: str | None
) -> bool:
    """Clip a fused optimizer's gradients under ``bf16-mixed``; False (nothing done) in any other case.

    Lightning's ``MixedPrecision.clip_gradients`` refuses every optimizer that unscales gradients
    inside its step (fused AdamW), a rule for float16's loss scaler. Without a scaler (bf16) the
    gradients are already true gradients, and the base ``Precision.clip_gradients`` (what the plugin
    calls after its check) clips them correctly.
    """
    plugin = trainer.precision_plugin
    if not gradient_clip_val or not isinstance(plugin, MixedPrecision) or plugin.scaler is not None:
        return False
    if not getattr(optimizer, "_step_supports_amp_scaling", False):  # not fused: the plugin's own path
        return False
    Precision.clip_gradients(plugin, optimizer, gradient_clip_val, GradClipAlgorithmType(algorithm or "norm"))
    return True


def clip_gradients_under_fsdp(trainer: L.Trainer, gradient_clip_val: float | None, algorithm: str | None) -> bool:
    """Clip by the global gradient norm through the FSDP module; False (nothing done) when not under FSDP.

    https://pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.FullyShardedDataParallel.clip_grad_norm_

    Raises:
        ValueError: FSDP with ``gradient_clip_algorithm`` other than "norm".
    """
    if not isinstance(trainer.model, FullyShardedDataParallel) or not gradient_clip_val:
        return False
    if algorithm not in (None, "norm"):
        raise ConfigError(f"trainer.gradient_clip_algorithm={algorithm!r}: FSDP clips by norm; set it to norm")
    trainer.model.clip_grad_norm_(gradient_clip_val)
    return True
