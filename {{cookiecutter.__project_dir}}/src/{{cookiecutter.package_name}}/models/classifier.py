"""Image classification: cross-entropy and torchmetrics over a net mapping images to logits."""

from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

from {{ cookiecutter.package_name }}.engine import TrainingModule, WarmupCosine
from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.module import CompileMode, adamw
from {{ cookiecutter.package_name }}.engine.pretrained import has_image_preprocessing, image_preprocessing


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
        optimizer, lr_scheduler, compile, compile_mode, channels_last: see :class:`engine.TrainingModule`.

    Raises:
        ValueError: if a hyperparameter is out of range.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        label_smoothing: float = 0.0,
        optimizer: OptimizerCallable = adamw,
        lr_scheduler: LRSchedulerCallable | None = WarmupCosine,
        compile: bool = False,
        compile_mode: CompileMode | None = None,
        channels_last: bool = False,
    ) -> None:
        if num_classes < 2:
            raise ConfigError(f"model.num_classes must be at least 2, got {num_classes}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        super().__init__(net, optimizer, lr_scheduler, compile, compile_mode, channels_last)
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

    def setup(self, stage: str) -> None:
        super().setup(stage)
        if stage == "fit" and self._trainer is not None:  # a module set up by hand has no trainer, nor data
            check_preprocessing_fits(self.net, self._trainer.datamodule)

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        images, labels = batch  # (B, C, H, W), (B,)
        logits = self(images)  # (B, num_classes)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        metrics.update(logits.detach(), labels)
        return loss


def check_preprocessing_fits(net: nn.Module, datamodule: Any) -> None:
    """Refuse to train a pretrained backbone (a net whose ``folder`` says how its images were prepared) on
    images not prepared as in its pretraining: other sizes or another normalisation would be learnt
    around, silently, instead of the features the backbone has.

    Raises:
        ValueError: the DataModule's sizes, mean or std are not the backbone's (names the fix).
    """
    folder = getattr(net, "folder", None)
    if folder is None or datamodule is None or not has_image_preprocessing(folder):
        return
    wanted = image_preprocessing(folder, key="net.model")
    hparams = getattr(datamodule, "hparams", {})
    given = (hparams.get("image_size"), hparams.get("crop_size"), getattr(datamodule, "pretrained_stats", None))
    if given != (wanted["image_size"], wanted["crop_size"], (wanted["mean"], wanted["std"])):
        raise ConfigError(
            f"net.model {folder} was pretrained on images prepared as its preprocessing file says "
            f"({wanted['image_size']} px, crop {wanted['crop_size']}, its own mean and std), but the data prepares "
            "them otherwise: set data.init_args.pretrained to the same model as net.model "
            "(configs/experiments/transfer-learning.yaml does)"
        )
