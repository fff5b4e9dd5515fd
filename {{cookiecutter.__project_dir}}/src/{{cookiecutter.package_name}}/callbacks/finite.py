"""Stop at the first training step whose loss or gradients are not finite, before it changes the weights."""

from typing import Any

import lightning as L
import torch


class NonFiniteError(RuntimeError):
    """A NaN or infinite loss or gradient; the message names the step and the tensor."""


class StopOnNonFinite(L.Callback):
    """Checks the loss and the gradients of every step before the optimizer uses them.

    A NaN at hour six otherwise spreads into every weight, and the next checkpoints (``last.ckpt``
    included) hold a dead model. This raises :class:`NonFiniteError` instead: the optimizer step
    is skipped, nothing more is saved, and the run's latest checkpoint keeps the last good state.
    The check costs one host-device synchronisation per step. With ``16-mixed`` precision,
    infinite gradients are expected now and then (the loss scaler skips those steps and lowers
    its scale), so only the loss is checked there. To find where a NaN comes from, rerun with
    ``--config configs/presets/debug.yaml`` (``torch.autograd`` anomaly detection).
    """

    def __init__(self) -> None:
        self._loss: torch.Tensor | None = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        check_grads = trainer.precision not in ("16-mixed", "16")
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None] if check_grads else []
        finite = torch.isfinite(self._loss).all() if self._loss is not None else torch.tensor(True)
        if grads:
            norms = torch.stack([torch.linalg.vector_norm(g.detach().float()) for g in grads])
            finite = finite & torch.isfinite(norms).all().to(finite.device)
        if bool(finite):  # the one synchronisation
            return
        if self._loss is not None and not torch.isfinite(self._loss).all():
            what = f"loss ({self._loss.item()})"
        else:
            names = [name for name, p in pl_module.named_parameters() if p.grad is not None]
            bad = [
                name for name, p in pl_module.named_parameters() if p.grad is not None and not p.grad.isfinite().all()
            ]
            what = f"gradient of {bad[0]}" + (f" (and {len(bad) - 1} more of {len(names)})" if len(bad) > 1 else "")
        raise NonFiniteError(
            f"Non-finite {what} at global step {trainer.global_step} (epoch {trainer.current_epoch}): "
            "training stopped before the optimizer step; the run's checkpoints hold the last good state. "
            "Lower model.init_args.lr, check the data for NaNs, or find the operation with "
            "--config configs/presets/debug.yaml (anomaly detection)."
        )
