"""Lightning's rich progress bar, doing its per-batch work only when a redraw is due."""

import time
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import ProcessingSpeedColumn
from rich.text import Text

from ..module import logger_writes


class ThrottledRichProgressBar(RichProgressBar):
    """Lightning's ``RichProgressBar`` updating its training bar at most ``refresh_rate`` times a second.

    Lightning's bar redraws ``refresh_rate`` times a second, but on every training batch it still
    updates its task, gathers the progress-bar metrics and soft-refreshes: about 1.5 ms per batch
    on a 2-core CPU, a third of a small tabular model's step (measured). Here that work runs
    only when a redraw is due and on an epoch's last batch, so what is shown is the same.

    In training, the metrics shown (the loss) are read only at the logger's steps (every
    ``trainer.log_every_n_steps``) and at an epoch's end, and kept in between: reading a value the
    GPU computed waits for every step queued before it: at four redraws a second, those waits and
    the logger's left an 85 M-parameter GPT 0.90x of its tokens/s without them (H200, bf16,
    compiled). The logger reads at those steps anyway, so the bar adds no wait of its own.
    """

    def __init__(self, refresh_rate: int = 4, **kwargs: Any) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._last_train_update = 0.0
        self._epoch_stops_at: int | None = None  # batch index at which max_steps ends this epoch
        self._shown: dict[str, Any] | None = None  # the training metrics read last
        self._read = True  # whether the next get_metrics reads the metrics afresh

    # ---- a run that max_steps stops inside an epoch: the bar counts to that step, not the epoch's end ----
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._shown = None  # the epoch's first redraw reads its metrics
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
        # max_epochs lifted to -1 by engine.preflight.let_max_steps_decide it would say "Epoch 0/-2").
        trainer = self.trainer
        by_steps = trainer.max_epochs is None or trainer.max_epochs < 0
        if self._epoch_stops_at is not None and (by_steps or self._epoch_stops_at < trainer.num_training_batches):
            return f"Epoch {current_epoch} (stops at step {trainer.max_steps})"
        return super()._get_train_description(current_epoch)

    def configure_columns(self, trainer: L.Trainer) -> list:
        return [
            _AverageSpeed(style=self.theme.processing_speed) if isinstance(column, ProcessingSpeedColumn) else column
            for column in super().configure_columns(trainer)
        ]

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        if trainer.training and not self._read and self._shown is not None:
            return dict(self._shown)  # a fresh read would wait for the GPU (see the class docstring)
        # Lightning adds the logger's version (v_num) to the bar's metrics; the run folder's name
        # already says it, so the bar shows only the metrics.
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        # train/loss is logged without prog_bar (engine.module): it is read here, at the reads above only.
        loss = trainer.logged_metrics.get("train/loss")
        if loss is not None and trainer.state.fn == "fit":
            metrics["train/loss"] = loss.item() if isinstance(loss, torch.Tensor) else loss
        self._shown, self._read = metrics, True
        return metrics

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read = True
        super().on_train_epoch_end(trainer, pl_module)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = time.monotonic()
        last = batch_idx + 1 >= self.total_train_batches
        if self.refresh_rate > 0 and now - self._last_train_update < 1.0 / self.refresh_rate and not last:
            return
        self._last_train_update = now
        # In this hook global_step already counts this step: the logger reads this step's metrics
        # when it is a multiple of log_every_n_steps (Lightning's should_update_logs).
        self._read = last or logger_writes(trainer, trainer.global_step)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


class _AverageSpeed(ProcessingSpeedColumn):
    """Batches a second, over the task's whole time when rich has too few updates to estimate it.

    rich estimates a task's speed from the updates of its last 30 s; a throttled bar updates a short
    epoch once or twice, and Lightning's column then shows "0.00it/s".
    """

    def render(self, task: Any) -> Text:
        speed = task.speed
        if speed is None and task.elapsed:
            speed = task.completed / task.elapsed
        return Text("" if speed is None else f"{speed:>.2f}it/s", style=self.style)
