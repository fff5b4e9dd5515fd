"""Tables: classification (cross-entropy, accuracy and macro F1) or regression (MSE, MAE and R2)."""

from typing import Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MeanAbsoluteError, MetricCollection, R2Score
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from {{ cookiecutter.package_name }}.engine import TrainingModule, WarmupCosine
from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.module import CompileMode, adamw


class TabularModel(TrainingModule):
    """Trains a ``net`` mapping encoded rows (B, F) to class logits (B, num_outputs) or a value (B, 1).

    Classification logs ``{train,val,test}/acc`` (micro accuracy) and ``/f1`` (macro F1), as the
    image task does. Regression trains on the standardised target (MSE) and logs ``/mae`` in the
    target's own units and ``/r2``. Every stage logs ``/loss``.

    Args:
        net: the network (see ``nets``); its output width must equal ``num_outputs``.
        task: "classification" or "regression" (linked from the DataModule by the CLI).
        num_outputs: number of classes, or 1 for regression (linked).
        target_scale: (mean, std) of the regression target in the training split (linked), to
            report MAE and predictions in the target's units.
        class_names: class names in label order (linked), saved with the model for predictions.
        optimizer, lr_scheduler, compile, compile_mode, channels_last: see :class:`engine.TrainingModule`.

    Raises:
        ValueError: ``num_outputs`` does not fit ``task``.
    """

    def __init__(
        self,
        net: nn.Module,
        task: Literal["classification", "regression"] = "classification",
        num_outputs: int = 2,
        target_scale: tuple[float, float] = (0.0, 1.0),
        class_names: list[str] | None = None,
        optimizer: OptimizerCallable = adamw,
        lr_scheduler: LRSchedulerCallable | None = WarmupCosine,
        compile: bool = False,
        compile_mode: CompileMode | None = None,
        channels_last: bool = False,
    ) -> None:
        if task == "classification" and num_outputs < 2:
            raise ConfigError(f"model.num_outputs must be at least 2 classes for classification, got {num_outputs}")
        if task == "regression" and num_outputs != 1:
            raise ConfigError(f"model.num_outputs must be 1 for regression, got {num_outputs}")
        super().__init__(net, optimizer, lr_scheduler, compile, compile_mode, channels_last)
        if task == "classification":
            metrics = {
                "acc": MulticlassAccuracy(num_outputs, average="micro"),
                "f1": MulticlassF1Score(num_outputs, average="macro"),
            }
        else:
            metrics = {"mae": MeanAbsoluteError(), "r2": R2Score()}
        self.set_metrics(MetricCollection(metrics))
        if task == "classification":
            # Test only (no cost in training): callbacks.RunPlots draws it as confusion_matrix.png.
            self.test_metrics.add_metrics({"confusion_matrix": MulticlassConfusionMatrix(num_outputs)})

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        features, targets = batch  # (B, F), (B,) class indices or standardised values
        outputs = self(features)  # (B, num_outputs)
        if self.hparams.task == "classification":
            loss = F.cross_entropy(outputs, targets)
            metrics.update(outputs.detach(), targets)
            return loss
        predictions = outputs.squeeze(-1)  # (B,)
        loss = F.mse_loss(predictions, targets)
        mean, std = self.hparams.target_scale
        metrics.update(predictions.detach() * std + mean, targets * std + mean)  # in the target's units
        return loss

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """Class probabilities (B, num_outputs), or predicted values (B,) in the target's units."""
        outputs = self(batch[0])
        if self.hparams.task == "classification":
            return outputs.softmax(dim=-1)
        mean, std = self.hparams.target_scale
        return outputs.squeeze(-1) * std + mean
