"""Lightning's rich progress bar, doing its per-batch work only when a redraw is due."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class ThrottledRichProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar`` updating its training bar at most ``refresh_rate`` times a second.

    Lightning's bar redraws ``refresh_rate`` times a second, but on every training batch it still
    updates its task, gathers the progress-bar metrics and soft-refreshes: about 1.5 ms per batch
    on a 2-core CPU, a third of a small tabular model's step (``make bench``). Here that work runs
    only when a redraw is due and on an epoch's last batch, so what is shown is the same.
    """

    def __init__(self, refresh_rate: int = 4, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._last_train_update = 0.0
        self._epoch_stops_at: int | None = None  # batch index at which max_steps ends this epoch

    # ---- a run that max_steps stops inside an epoch: the bar counts to that step, not the epoch's end ----
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_stops_at = None
        if trainer.max_steps is not None and trainer.max_steps > 0:
            done = trainer.fit_loop.epoch_loop.batch_progress.current.ready  # batches of this epoch before a resume
            left = (trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
            self._epoch_stops_at = done + left
        super().on_train_epoch_start(trainer, pl_module)

    @property
    def total_train_batches(self) -> int | float:
        total = self.trainer.num_training_batches
        return total if self._epoch_stops_at is None else min(total, self._epoch_stops_at)

    def _get_train_description(self, current_epoch: int) -> str:
        # Lightning's "Epoch 0/4" counts to max_epochs, which a step limit may never reach (and with
        # max_epochs lifted to -1 by engine.config.let_max_steps_decide it would say "Epoch 0/-2").
        trainer = self.trainer
        by_steps = trainer.max_epochs is None or trainer.max_epochs < 0
        if self._epoch_stops_at is not None and (by_steps or self._epoch_stops_at < trainer.num_training_batches):
            return f"Epoch {current_epoch} (stops at step {trainer.max_steps})"
        return super()._get_train_description(current_epoch)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        # Lightning adds the logger's version (v_num) to the bar's metrics; the run folder's name
        # already says it, so the bar shows only the metrics.
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return metrics

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        last = batch_idx + 1 >= self.total_train_batches
        if self.refresh_rate > 0 and now - self._last_train_update < 1.0 / self.refresh_rate and not last:
            return
        self._last_train_update = now
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
