"""Stop at the first training step whose loss or gradients are not finite, before it changes the weights."""

from typing import Any

import lightning as L
import torch

from ..gradients import gradient_norms


class NonFiniteError(RuntimeError):
    """A NaN or infinite loss or gradient; the message names the step and the tensor."""


class HostCopy:
    """A device scalar copied to the host without waiting for the GPU (page-locked memory and an event).

    :meth:`value` waits for that copy only, not for the work queued after it: read a step later, the
    GPU is done with it. ``wait=True``, or a CPU tensor, copies at once.
    """

    def __init__(self, value: torch.Tensor, wait: bool = False) -> None:
        self.event = None
        if wait or not value.is_cuda:
            self.host = value.cpu()
            return
        self.host = torch.empty((), dtype=value.dtype, pin_memory=True)
        self.host.copy_(value, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def value(self) -> float:
        if self.event is not None and not self.event.query():
            self.event.synchronize()
        return self.host.item()


class _Check:
    """One step's verdict, still on the device: its step, the loss and each gradient's 2-norm, and a host copy."""

    def __init__(
        self, step: int, epoch: int, names: list[str], values: torch.Tensor, bad: torch.Tensor, wait: bool
    ) -> None:
        self.step, self.epoch, self.names, self.values = step, epoch, names, values
        self.verdict = HostCopy(bad, wait)  # with wait, the host waits here for the GPU to reach this check

    def bad(self) -> bool:
        return bool(self.verdict.value())


class StopOnNonFinite(L.Callback):
    """Checks the loss and the gradients of every step before the optimizer uses them.

    A NaN at hour six otherwise spreads into every weight, and the next checkpoints (``last.ckpt``
    included) hold a dead model. This raises :class:`NonFiniteError` instead; the weights and the
    optimizer state keep their last good values, and no checkpoint is written after the bad step.

    The check reads each gradient's 2-norm, computed once a step and shared with clipping and the
    logged ``train/grad_norm`` (:mod:`engine.gradients`, foreach kernels), and the loss. How the
    host learns its verdict:

    - **On the device** (``on_device=True``, used when the optimizer can skip a step itself: fused
      AdamW, Adam and SGD, which the GPU preset picks): the verdict goes to the optimizer as its
      ``found_inf`` tensor, the protocol ``torch.amp.GradScaler`` uses, so a bad step changes
      nothing on the GPU, and the host reads the verdict one step later (or before any checkpoint
      is saved) and raises then, naming the bad step. No step waits for the GPU, so the host can
      queue the next step's work while the GPU runs this one.
    - **Synchronously** otherwise (any other optimizer, ``on_device=False``): the host waits for
      the verdict before the optimizer step; one host-device synchronisation a step.

    Under DDP or FSDP the verdicts are summed over the processes (one small all-reduce), so every
    process skips and stops at the same step. With ``16-mixed`` precision, infinite gradients are
    expected now and then (the loss scaler skips those steps and lowers its scale), so only the
    loss is checked there, synchronously. To find where a NaN comes from, rerun with
    ``--config configs/presets/debug.yaml`` (``torch.autograd`` anomaly detection).

    Args:
        on_device: let a fused optimizer skip a bad step on the device and raise one step later
            (no synchronisation); False waits for every step's verdict before its optimizer step.
    """

    def __init__(self, on_device: bool = True) -> None:
        self.on_device = on_device
        self._loss: torch.Tensor | None = None
        self._pending: _Check | None = None
        self._skipping: list[torch.optim.Optimizer] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pending = None

    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor) -> None:
        self._loss = loss.detach()

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any) -> None:
        self._raise_if_a_step_was_bad(trainer)  # the previous step's verdict, done on the GPU by now
        loss_scaled = trainer.precision in ("16-mixed", "16")
        names = [] if self._loss is None else ["loss"]
        values = [] if self._loss is None else [self._loss.float().reshape(1)]
        # Each gradient's 2-norm, shared with clipping and the logged norm (engine.gradients): NaN or
        # inf anywhere in a gradient makes its norm non-finite. FSDP: this process's shards.
        norms = None if loss_scaled else gradient_norms(pl_module)
        if norms is not None:
            names += norms.names
            values.append(norms.norms)
        if not values:
            return
        checked = torch.cat(values)
        bad = (~torch.isfinite(checked).all()).float()
        # Every process skips and stops together: a NaN seen by one rank alone would leave the others waiting.
        if trainer.world_size > 1:
            bad = (trainer.strategy.reduce(bad, reduce_op="sum") > 0).float()
        on_device = self.on_device and getattr(optimizer, "_step_supports_amp_scaling", False) and not loss_scaled
        self._pending = _Check(trainer.global_step, trainer.current_epoch, names, checked, bad, wait=not on_device)
        if not on_device:
            self._raise_if_a_step_was_bad(trainer)
            return
        # A fused optimizer skips the step (weights and state unchanged) where found_inf is 1.
        optimizer.found_inf = bad.to(checked.device)
        self._skipping.append(optimizer)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        for optimizer in self._skipping:  # found_inf holds for one step only (GradScaler deletes it too)
            optimizer.__dict__.pop("found_inf", None)
        self._skipping.clear()

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        self._raise_if_a_step_was_bad(trainer)  # no checkpoint after a bad step, even one skipped on the device

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_a_step_was_bad(trainer)  # a bad last step still fails the run

    def _raise_if_a_step_was_bad(self, trainer: L.Trainer) -> None:
        check, self._pending = self._pending, None
        if check is None or not check.bad():
            return
        values = check.values.cpu()
        bad = [name for name, finite in zip(check.names, torch.isfinite(values).tolist(), strict=True) if not finite]
        if bad and bad[0] == "loss":
            what = f"loss ({values[0].item()})"
        elif bad:
            count = len(check.names) - (check.names[0] == "loss")
            what = f"gradient of {bad[0]}" + (f" (and {len(bad) - 1} more of {count})" if len(bad) > 1 else "")
        else:
            what = f"loss or gradient on another process (this is rank {trainer.global_rank})"
        raise NonFiniteError(
            f"Non-finite {what} at global step {check.step} (epoch {check.epoch}): "
            "training stopped before its optimizer step changed the weights; the run's checkpoints hold "
            "the last good state. Lower model.init_args.lr, check the data for NaNs, or find the "
            "operation with --config configs/presets/debug.yaml (anomaly detection)."
        )
