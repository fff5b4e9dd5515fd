"""Image classification: cross-entropy and torchmetrics over a net mapping images to logits."""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from {{ cookiecutter.package_name }}.engine import ConfigError, TrainingModule


class ImageClassifier(TrainingModule):
    """Trains any ``net`` mapping images (B, C, H, W) to logits (B, num_classes).

    Logs ``{train,val,test}/loss`` and, per epoch, ``{train,val,test}/acc`` (micro accuracy) and
    ``{train,val,test}/f1`` (macro F1) from torchmetrics. Optimizer, schedule, compile and
    channels-last come from :class:`engine.TrainingModule`.

    Built by LightningCLI, the checkpoint records the configs of the net, optimizer and schedule,
    so ``ImageClassifier.load_from_checkpoint(path)`` rebuilds it. Built in Python, pass the net
    again: ``ImageClassifier.load_from_checkpoint(path, net=CNN())``.

    Args:
        net: the network (see ``nets``); its output width must equal ``num_classes``.
        num_classes: number of classes (linked from the DataModule by the CLI).
        label_smoothing: cross-entropy label smoothing (Szegedy et al., 2016), in [0, 1).
        **kwargs: the settings every task shares (optimizer, lr_scheduler, compile, compile_mode,
            channels_last, init_from), declared once by :class:`engine.TrainingModule`.

    Raises:
        ValueError: if a hyperparameter is out of range.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        label_smoothing: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if num_classes < 2:
            raise ConfigError(f"model.num_classes must be at least 2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        super().__init__(net, **kwargs)
        self.set_metrics(
            MetricCollection(
                {
                    "acc": MulticlassAccuracy(num_classes, average="micro"),
                    "f1": MulticlassF1Score(num_classes, average="macro"),
                }
            )
        )
        # Test only (no cost in training): callbacks.RunPlots draws it as confusion_matrix.png.
        self.test_metrics.add_metrics({"confusion_matrix": MulticlassConfusionMatrix(num_classes)})

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        images, labels = batch  # (B, C, H, W), (B,)
        logits = self(images)  # (B, num_classes)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        metrics.update(logits.detach(), labels)
        return loss
