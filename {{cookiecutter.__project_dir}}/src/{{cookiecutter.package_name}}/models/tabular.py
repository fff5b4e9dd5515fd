"""Tables: classification (cross-entropy, accuracy and macro F1) or regression (MSE, MAE and R2)."""

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanAbsoluteError, MetricCollection, R2Score
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from {{ cookiecutter.package_name }}.engine import ConfigError, TrainingModule


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
        **kwargs: the settings every task shares (optimizer, lr_scheduler, compile, compile_mode,
            channels_last, init_from), declared once by :class:`engine.TrainingModule`.

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
        **kwargs: Any,
    ) -> None:
        if task == "classification" and num_outputs < 2:
            raise ConfigError(f"model.num_outputs must be at least 2 classes for classification, got {num_outputs}")
        if task == "regression" and num_outputs != 1:
            raise ConfigError(f"model.num_outputs must be 1 for regression, got {num_outputs}")
        super().__init__(net, **kwargs)
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

    def output_head(self) -> nn.Module:
        """Class probabilities (B, classes), or (regression) the predicted value in the target's units (B,)."""
        if self.hparams.task == "classification":
            return nn.Softmax(dim=-1)
        return TargetUnits(*self.hparams.target_scale)
{%- if cookiecutter.use_serving == "yes" %}

    def output_description(self) -> str:
        if self.hparams.task == "classification":
            return "class probabilities (softmax), one column per class"
        return "the predicted target value in its own units (the table's, not standardised)"
{%- endif %}

    def describe(self, outputs: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
        if self.hparams.task == "classification":
            return super().describe(outputs, class_names or list(self.hparams.class_names or []))
        return [{"prediction": round(value, 6)} for value in outputs.tolist()]
{%- if cookiecutter.use_serving == "yes" %}

    def response(self, outputs: torch.Tensor, class_names: list[str]) -> dict[str, Any]:
        if self.hparams.task == "classification":
            return super().response(outputs, class_names or list(self.hparams.class_names or []))
        return {"predictions": outputs.tolist()}

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Accuracy, or (regression) the mean absolute error in the target's units."""
        if self.hparams.task == "classification":
            return super().score(outputs, targets)
        return {"mae": (outputs - targets).abs().mean().item()}
{%- endif %}


class TargetUnits(nn.Module):
    """A regression net's output (B, 1), trained on the standardised target -> the value in its units (B,)."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean, self.std = float(mean), float(std)

    def forward(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs.squeeze(-1) * self.std + self.mean
