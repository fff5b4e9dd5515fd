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
    The check is one total norm and one host-device synchronisation per step (plus one small
    all-reduce under DDP or FSDP, so that every process stops at the same step). With ``16-mixed`` precision,
    infinite gradients are expected now and then (the loss scaler skips those steps and lowers
    its scale), so only the loss is checked there. To find where a NaN comes from, rerun with
    ``--config configs/presets/debug.yaml`` (``torch.autograd`` anomaly detection).
    """

    def __init__(self) -> None:
        self._loss: torch.Tensor | None = None
        self._params: list[torch.nn.Parameter] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Listed once, after the strategy has wrapped the model: walking ``pl_module.parameters()``
        # every step (metric modules included) cost more than the check itself (make bench).
        # Frozen ones too: a backbone unfrozen later (BackboneFreeze) gets gradients from then on;
        # parameters without a gradient are skipped at each step.
        self._params = list(pl_module.parameters())

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        tensors = [] if self._loss is None else [self._loss]
        if trainer.precision not in ("16-mixed", "16"):
            tensors += [p.grad for p in self._params if p.grad is not None]
        if not tensors:
            return
        # One total norm over the loss and every gradient (foreach kernels on CUDA): a NaN or inf
        # anywhere makes it non-finite. A check and a sync per tensor cost 0.3 ms a step (make bench).
        finite = bool(torch.isfinite(torch.nn.utils.get_total_norm(tensors)))  # the one synchronisation
        # Every process stops together: a NaN seen by one rank alone would leave the others waiting.
        if trainer.strategy.reduce_boolean_decision(finite, all=True):
            return
        if self._loss is not None and not torch.isfinite(self._loss).all():
            what = f"loss ({self._loss.item()})"
        else:
            grads = {name: p.grad for name, p in pl_module.named_parameters() if p.grad is not None}
            bad = [name for name, grad in grads.items() if not grad.isfinite().all()]
            if bad:
                what = f"gradient of {bad[0]}" + (f" (and {len(bad) - 1} more of {len(grads)})" if len(bad) > 1 else "")
            else:
                what = f"loss or gradient on another process (this is rank {trainer.global_rank})"
        raise NonFiniteError(
            f"Non-finite {what} at global step {trainer.global_step} (epoch {trainer.current_epoch}): "
            "training stopped before the optimizer step; the run's checkpoints hold the last good state. "
            "Lower model.init_args.lr, check the data for NaNs, or find the operation with "
            "--config configs/presets/debug.yaml (anomaly detection)."
        )
