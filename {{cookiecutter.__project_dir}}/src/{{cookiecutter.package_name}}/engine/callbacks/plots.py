"""Pictures of a run: learning curves after fit, a confusion matrix after test, in the run folder and the logger.

- ``curves.png``: ``train/loss`` (on the steps the logger writes) and ``val/loss`` over optimizer
  steps in one panel, and every other ``val/`` metric (accuracy, F1, bits per byte, ...) in a
  panel of its own. The history rides in the checkpoints, so a resumed run draws the whole curve.
- ``confusion_matrix.png``: after ``test``, when the model's metrics include a confusion matrix
  (a torchmetrics ``*ConfusionMatrix`` named ``confusion_matrix`` in the module's
  ``set_metrics``): counts per (true, predicted) class, with the DataModule's ``class_names``.

Both are logged as images to loggers that take them (wandb ``log_image``, TensorBoard
``add_figure``); the CSV logger keeps the files only. Drawn with matplotlib's object API (no
pyplot global state, no display needed) on global rank zero.
"""

import math
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from ..module import logger_writes
from ..run_folders import run_dir


class RunPlots(L.Callback):
    """Writes ``curves.png`` when fit ends and ``confusion_matrix.png`` when test ends (see the module docstring)."""

    def __init__(self) -> None:
        self.history: dict[str, list[tuple[int, float]]] = {}  # metric name -> [(global step, value)]

    # ---- recording --------------------------------------------------------------------------------
    def _record(self, trainer: L.Trainer, names: list[str]) -> None:
        for name in names:
            value = trainer.callback_metrics.get(name)
            if value is not None and value.numel() == 1:
                self.history.setdefault(name, []).append((trainer.global_step, float(value)))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # The module logs train/loss on the steps the logger writes (TrainingModule.training_step);
        # the optimizer step has been counted by now, hence global_step rather than global_step + 1.
        recorded = self.history.get("train/loss", [(-1, 0.0)])[-1][0]
        step = trainer.global_step
        if logger_writes(trainer, step) and step != recorded:  # once per step under gradient accumulation
            self._record(trainer, ["train/loss"])

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._record(trainer, sorted(name for name in trainer.callback_metrics if name.startswith("val/")))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.stage = stage  # Lightning calls setup before it restores a checkpoint's callback states

    def state_dict(self) -> dict[str, Any]:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if getattr(self, "stage", "fit") != "fit":
            return  # `test` on the best checkpoint: keep the whole fit's history, not that checkpoint's part
        self.history = {name: [tuple(point) for point in points] for name, points in state_dict["history"].items()}

    # ---- drawing ----------------------------------------------------------------------------------
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero or trainer.fast_dev_run or not self.history:
            return
        figure = draw_curves(self.history)
        self._save(trainer, figure, "curves")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        matrix = getattr(pl_module, "epoch_tensors", {}).get("test/confusion_matrix")
        if matrix is None or not trainer.is_global_zero or trainer.fast_dev_run:
            return
        names = (
            getattr(trainer.datamodule, "class_names", None)
            or getattr(pl_module.hparams, "class_names", None)
            or [str(i) for i in range(matrix.shape[0])]
        )
        self._save(trainer, draw_confusion_matrix(matrix.cpu(), list(names)), "confusion_matrix")

    def _save(self, trainer: L.Trainer, figure: Any, name: str) -> None:
        path = run_dir(trainer) / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=120)
        for logger in trainer.loggers:
            if hasattr(logger, "log_image"):  # wandb (and Neptune)
                logger.log_image(key=name, images=[str(path)], step=trainer.global_step)
            elif hasattr(getattr(logger, "experiment", None), "add_figure"):  # TensorBoard
                logger.experiment.add_figure(name, figure, global_step=trainer.global_step)
        rank_zero_info(f"Plot written to {path}")


def draw_curves(history: dict[str, list[tuple[int, float]]]) -> Any:
    """A matplotlib Figure: the losses in one panel, each other validation metric in its own, over steps."""
    from matplotlib.figure import Figure

    losses = [name for name in ("train/loss", "val/loss") if name in history]
    others = sorted(name for name in history if name.startswith("val/") and name != "val/loss")
    panels = [losses, *[[name] for name in others]] if losses else [[name] for name in others]
    columns = min(len(panels), 3)
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(4.5 * columns, 3.4 * rows), layout="constrained")
    for index, names in enumerate(panels, 1):
        axes = figure.add_subplot(rows, columns, index)
        for name in names:
            steps, values = zip(*history[name], strict=True)
            style = {"marker": "o", "markersize": 3} if name.startswith("val/") else {"linewidth": 1}
            axes.plot(steps, values, label=name, **style)
        axes.set_xlabel("optimizer step")
        axes.set_title(" and ".join(names) if len(names) > 1 else names[0])
        axes.grid(alpha=0.3)
        if len(names) > 1:
            axes.legend()
    return figure


def draw_confusion_matrix(matrix: torch.Tensor, class_names: list[str]) -> Any:
    """A matplotlib Figure of ``matrix`` (num_classes, num_classes): rows true, columns predicted, counts shown."""
    from matplotlib.figure import Figure

    counts = matrix.long().numpy()
    size = len(class_names)
    side = max(4.0, 0.55 * size + 2.0)
    figure = Figure(figsize=(side + 1.0, side), layout="constrained")
    axes = figure.add_subplot()
    image = axes.imshow(counts, cmap="Blues")
    figure.colorbar(image, ax=axes, shrink=0.8, label="test samples")
    axes.set_xticks(range(size), class_names, rotation=45 if max(map(len, class_names)) > 3 else 0, ha="right")
    axes.set_yticks(range(size), class_names)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    accuracy = counts.trace() / max(counts.sum(), 1)
    axes.set_title(f"Confusion matrix on the test split (accuracy {accuracy:.4f})")
    threshold = counts.max() / 2 if counts.size else 0
    if size <= 30:  # beyond that the numbers would not be readable
        for true in range(size):
            for predicted in range(size):
                value = counts[true, predicted]
                if value:  # zeros left blank, so the mistakes stand out
                    color = "white" if value > threshold else "black"
                    axes.text(predicted, true, str(value), ha="center", va="center", color=color, fontsize=8)
    return figure
