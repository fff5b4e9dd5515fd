"""A user's own pieces, written as the README's "Add your own data, model or task" says, outside the package.

The tests train with them from here (a module the project's package does not hold, so loading a
checkpoint of theirs needs ``--trust own_pieces``), and copy this file into the package
(``data/``, ``nets/``, ``models/``), where the project's own trust covers them.
"""

import torch
{%- if cookiecutter.task == "image-classification" and cookiecutter.use_serving == "yes" %}
import torch.nn.functional as F
from torch import nn
{%- endif %}
from torch.utils.data import TensorDataset
{%- if cookiecutter.task == "image-classification" and cookiecutter.use_serving == "yes" %}
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy
{%- endif %}

from {{ cookiecutter.package_name }}.engine import ResumableDataModule{% if cookiecutter.task == "image-classification" and cookiecutter.use_serving == "yes" %}, TrainingModule{% endif %}
from {{ cookiecutter.package_name }}.engine.datamodule import split_indices


class OwnDataModule(ResumableDataModule):
    """A user's DataModule written as the README's "Add your own data" says: data sets in setup, nothing else."""
{% if cookiecutter.task == "tabular" %}
    # What the CLI links to the model and its net (README: "Add your own data").
    num_features, num_outputs, task, target_scale, class_names = 12, 3, "classification", (0.0, 1.0), ["a", "b", "c"]
{%- elif cookiecutter.task == "language-model" %}
    vocab_size, block_size = 256, 16  # the CLI links them to the net
{%- else %}
    num_classes = 3  # the CLI links it to the model and its net
{%- endif %}

    def __init__(self, size: int = 300, batch_size: int = 32, split_seed: int = 0) -> None:
        super().__init__(batch_size=batch_size)
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        generator = torch.Generator().manual_seed(self.hparams.split_seed)
{%- if cookiecutter.task == "language-model" %}
{%- elif cookiecutter.task == "tabular" %}
        inputs = torch.randn(self.hparams.size, self.num_features, generator=generator)
        labels = (inputs[:, 0] > 0).long() + (inputs[:, 1] > 1).long()  # (N,) in [0, 3)
{%- else %}
        inputs = torch.randn(self.hparams.size, 1, 8, 8, generator=generator)
        labels = (inputs.mean(dim=(1, 2, 3)) > 0).long() + (inputs[:, 0, 0, 0] > 1).long()  # (N,) in [0, 3)
{%- endif %}
{%- if cookiecutter.task == "language-model" %}
        tokens = torch.randint(0, 8, (self.hparams.size, self.block_size + 1), generator=generator)
        inputs, targets = tokens[:, :-1], tokens[:, 1:]  # (N, T) each, targets shifted by one
        splits = split_indices(None, len(tokens), 0.15, 0.15, self.hparams.split_seed)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(inputs[rows], targets[rows]) for rows in splits.values()
        )
{%- else %}
        splits = split_indices(labels.numpy(), len(labels), 0.15, 0.15, self.hparams.split_seed)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(inputs[rows], labels[rows]) for rows in splits.values()
        )
{%- endif %}
{%- if cookiecutter.task == "image-classification" and cookiecutter.use_serving == "yes" %}


class OwnNet(nn.Module):
    """A user's net: images (B, C, 8, 8) -> logits (B, num_classes); plain PyTorch, as ``nets/`` holds."""

    def __init__(self, num_classes: int = 10, in_channels: int = 1, width: int = 32) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * 64, width), nn.ReLU(), nn.Linear(width, num_classes)
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)


class OwnClassifier(TrainingModule):
    """A user's task module on ``engine.TrainingModule``: its loss and metrics only."""

    def __init__(self, net: nn.Module, num_classes: int = 10, **kwargs) -> None:
        super().__init__(net, **kwargs)
        self.set_metrics(MetricCollection({"acc": MulticlassAccuracy(num_classes)}))

    def shared_step(self, batch, metrics: MetricCollection) -> torch.Tensor:
        inputs, labels = batch
        logits = self(inputs)
        metrics.update(logits, labels)
        return F.cross_entropy(logits, labels)
{%- endif %}
