"""A torchvision classification backbone with a new head, for transfer learning.

torchvision is optional: its wheels are built against one torch release each, so install the one
that matches your torch (``make torchvision`` does, without moving torch). Weights are read from a
local file or torch's local hub cache (``torch.hub.get_dir()/checkpoints``), never downloaded during
a run: fetch them once on a machine with internet (``torchvision.models.get_model(name,
weights="DEFAULT")`` stores them there) or pass ``weights=None`` for random initialisation. The
file must hold every weight of the architecture (its classifier aside), or it is refused by name.
torchvision's weights come without a preprocessing file: set the DataModule's ``image_size``,
``crop_size``, ``mean`` and ``std`` to the weights' (``weights.transforms()`` prints them;
ImageNet's: 256, 224, ``[0.485, 0.456, 0.406]``, ``[0.229, 0.224, 0.225]``).
"""

from pathlib import Path

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError
from {{ cookiecutter.package_name }}.nets.hub import PICKLED_SUFFIXES, load_all_weights, read_weights


class PretrainedNet(nn.Module):
    """``backbone`` (a torchvision model without its classifier) -> features (B, F) -> ``head``: (B, num_classes).

    Pair with ``engine.callbacks.finetuning.BackboneFreeze`` to train the head first, then the backbone at a
    lower learning rate. Grey images (``in_channels=1``) are repeated to the 3 channels the
    pretrained filters expect.

    Args:
        architecture: a torchvision classification model name (``resnet18``, ``resnet50``,
            ``efficientnet_b0``, ``mobilenet_v3_small``, ``convnext_tiny``, ...).
        num_classes: number of output logits (linked from the DataModule by the CLI).
        in_channels: image channels C, 1 or 3 (linked likewise).
        weights: a torchvision weights name ("DEFAULT", "IMAGENET1K_V1", ...) in the local hub cache,
            a weights file (``.pth`` read with ``weights_only=True``, or ``.safetensors``), or None
            for random weights.
        dropout: dropout probability before the head.

    Raises:
        ImportError: torchvision is not installed or does not import beside this torch.
        ValueError: an unknown architecture or weights name, ``in_channels`` not 1 or 3, weights
            missing from the local cache (the message gives the file to provide), or a weights file
            that is not this architecture's.
        FileNotFoundError: a weights file that does not exist.
    """

    def __init__(
        self,
        architecture: str = "resnet18",
        num_classes: int = 10,
        in_channels: int = 3,
        weights: str | None = "DEFAULT",
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        try:
            import torchvision
        except (ImportError, RuntimeError) as error:
            raise ImportError(
                f"PretrainedNet needs torchvision built for torch {torch.__version__} ({error}); "
                "install the one built for your torch with: make torchvision"
            ) from None
        if in_channels not in (1, 3):
            raise ConfigError(f"PretrainedNet.in_channels must be 1 or 3, got {in_channels}")
        if architecture not in torchvision.models.list_models(module=torchvision.models):
            raise ConfigError(f"PretrainedNet.architecture={architecture!r} is not a torchvision classification model")
        self.in_channels = in_channels
        self.backbone = torchvision.models.get_model(architecture, weights=None)
        features, classifier = _drop_classifier(self.backbone)
        if weights is not None:
            is_file = weights.endswith((".safetensors", *PICKLED_SUFFIXES))
            file = Path(weights).expanduser() if is_file else _cached_file(torchvision, architecture, weights)
            state = read_weights(file, architecture)
            # Every weight but the classifier's, which the new head replaces.
            kept = {key: value for key, value in state.items() if not key.startswith(f"{classifier}.")}
            load_all_weights(self.backbone, kept, file, architecture)
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)  # (B, 1, H, W) -> (B, 3, H, W), no copy
        return self.head(self.backbone(x))  # (B, 3, H, W) -> (B, F) -> (B, num_classes)


def _cached_file(torchvision, architecture: str, name: str) -> Path:
    try:
        weights = torchvision.models.get_model_weights(architecture)[name]
    except (KeyError, ValueError):
        raise ConfigError(f"PretrainedNet.weights={name!r}: no such weights for {architecture}") from None
    path = Path(torch.hub.get_dir()) / "checkpoints" / Path(weights.url).name
    if not path.is_file():
        raise ConfigError(
            f"PretrainedNet: {architecture} weights {name} are not in the local cache ({path}). Fetch them once "
            f"where there is internet (python -c \"import torchvision; torchvision.models.get_model('{architecture}', "
            f"weights='{name}')\"), copy the file there, or set weights: null for random weights"
        )
    return path


def _drop_classifier(model: nn.Module) -> tuple[int, str]:
    """Replace a torchvision model's last ``nn.Linear`` (its classifier) with ``nn.Identity``; return its
    input width F and its name.

    Everything before it stays (MobileNet's hidden layer, ConvNeXt's norm and flatten), so the
    backbone ends in the features the pretrained classifier was trained on.
    """
    linears = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ConfigError(f"PretrainedNet: {type(model).__name__} has no linear classifier to replace")
    name, last = linears[-1]
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, nn.Identity())
    return last.in_features, name
