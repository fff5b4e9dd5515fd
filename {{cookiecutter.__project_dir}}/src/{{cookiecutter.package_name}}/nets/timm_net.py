"""A timm backbone with a new head, for transfer learning: images (B, C, H, W) -> logits (B, K).

timm (https://huggingface.co/docs/timm) is optional: it depends on torchvision, whose wheels are
built for one torch release each, so ``make timm`` installs it with the torchvision built for your
torch (torch never moves). Weights come from local files only, never a download during a run:

- ``model`` a folder as timm's hub repositories hold one (``config.json`` naming the architecture,
  with its ``pretrained_cfg``, and ``model.safetensors``), or such a hub id (``timm/resnet50.a1_in1k``)
  in the local Hugging Face cache: ``hf download timm/resnet50.a1_in1k`` fetches it where there is
  internet. The image-folder DataModule's ``pretrained`` reads the same folder's ``pretrained_cfg``
  (size, crop, mean, std), so images are prepared as in pretraining.
- ``model`` an architecture name (``resnet50``, ``vit_small_patch16_224``, ``convnext_tiny``,
  ``efficientnet_b0``: ``timm.list_models()``) and ``weights`` a local file of its weights
  (``.safetensors``, or a ``.pth`` read with ``torch.load(weights_only=True)``, which runs no code),
  or no ``weights`` for random initialisation.

Every weight of the file must fit the architecture (its classifier aside): a file for another model
is refused by name, never half-loaded (:func:`nets.hub.load_all_weights`).
"""

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError
from {{ cookiecutter.package_name }}.nets.hub import json_object, load_all_weights, locate, read_weights
from {{ cookiecutter.package_name }}.nets.image_preprocessing import check_preprocessing_fits

# timm.create_model's own arguments and its builder's (timm 1.0): what to load and how to build, never
# the architecture's shape; a hub folder's model_args may not set them.
BUILD_ARGUMENTS = {"pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "cache_dir", "scriptable"}
BUILD_ARGUMENTS |= {"exportable", "no_jit", "features_only", "out_indices", "feature_cfg", "pretrained_strict"}


class TimmNet(nn.Module):
    """``backbone`` (a timm model without its classifier: pooled features (B, F)) -> ``head``: (B, K).

    Pair with ``engine.callbacks.finetuning.BackboneFreeze`` to train the head first, then the backbone at a
    lower learning rate. Grey images (``in_channels=1``) are repeated to the 3 channels the
    pretrained filters expect.

    Args:
        model: a timm hub folder or hub id in the local cache, or a timm architecture name (above).
        num_classes: K, the new head's outputs (linked from the DataModule by the CLI).
        in_channels: image channels C, 1 or 3 (linked likewise).
        weights: with an architecture name, a local weights file; None for random weights.
        revision: branch, tag or commit of a hub id (default: the cached main).
        dropout: dropout probability before the head.

    Raises:
        ImportError: timm is not installed or does not import beside this torch (names ``make timm``).
        FileNotFoundError: the folder, hub id or weights file is not on this machine (names the fix).
        ValueError: an unknown architecture, ``in_channels`` not 1 or 3, ``weights`` beside a folder,
            or a weights file that is not this architecture's (names the missing or unknown weights).
    """

    def __init__(
        self,
        model: str = "resnet18",
        num_classes: int = 10,
        in_channels: int = 3,
        weights: str | None = None,
        revision: str | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        timm = import_timm()
        if in_channels not in (1, 3):
            raise ConfigError(f"TimmNet.in_channels must be 1 or 3, got {in_channels}")
        self.in_channels = in_channels
        self.folder: Path | None = None  # a hub folder: check_preprocessing_fits reads its pretrained_cfg
        architecture, model_args, file = model, {}, Path(weights).expanduser() if weights else None
        if Path(model).expanduser().is_dir() or "/" in model:
            if weights is not None:
                raise ConfigError(
                    f"net.weights={weights}: net.model {model} is a folder with its own weights; drop one"
                )
            self.folder = locate(model, revision, key="net.model").folder
            architecture, model_args = hub_architecture(self.folder)
            file = self.folder / "model.safetensors"
        if architecture not in timm.list_models():
            raise ConfigError(
                f"net.model={architecture!r} is not a timm architecture (timm.list_models() lists them), "
                "a folder, or a hub id like timm/resnet50.a1_in1k"
            )
        self.backbone = timm.create_model(architecture, pretrained=False, num_classes=0, **model_args)
        if file is not None:
            load_weights(self.backbone, file, architecture)
        features = getattr(self.backbone, "head_hidden_size", None) or self.backbone.num_features
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(features, num_classes))

    def check_data(self, datamodule: Any) -> None:
        """Refuse, when fit starts, data prepared otherwise than this backbone's pretraining images
        (:func:`nets.image_preprocessing.check_preprocessing_fits`)."""
        check_preprocessing_fits(self, datamodule)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.in_channels == 1:
            x = x.expand(-1, 3, -1, -1)  # (B, 1, H, W) -> (B, 3, H, W), no copy
        return self.head(self.backbone(x))  # (B, 3, H, W) -> (B, F) -> (B, K)


def import_timm():
    try:
        import timm
    except (ImportError, RuntimeError) as error:  # RuntimeError: a torchvision built for another torch
        raise ImportError(
            f"TimmNet needs timm, and the torchvision built for torch {torch.__version__} ({error}); "
            "install both with: make timm"
        ) from None
    return timm


def hub_architecture(folder: Path) -> tuple[str, dict]:
    """(architecture, model_args) from a timm hub folder's ``config.json``, read as data.

    ``model_args`` may shape the architecture (``img_size``, ``drop_rate``, ...) but never name what
    timm loads or how it builds: its own loading arguments (``checkpoint_path``, ``pretrained_cfg``,
    ``cache_dir``, ...) would make a downloaded file read a file outside its folder.
    """
    path = folder / "config.json"
    config = json_object(path, f"net.model: {path}")
    if not isinstance(config.get("architecture"), str):
        raise ConfigError(
            f"net.model: {path} names no timm architecture; give a timm hub folder (config.json with "
            "architecture and pretrained_cfg, model.safetensors), or nets.HFImageClassifier for a transformers one"
        )
    model_args = config.get("model_args") or {}
    if not isinstance(model_args, dict):
        raise ConfigError(f"net.model: {path}: model_args is not a JSON object")
    loading = sorted(set(model_args) & BUILD_ARGUMENTS)
    if loading:
        raise ConfigError(
            f"net.model: {path}: model_args sets {', '.join(loading)}, which choose what timm loads or builds, not "
            "the architecture: remove them (this net loads the folder's model.safetensors itself)"
        )
    return config["architecture"], {k: v for k, v in model_args.items() if k not in ("num_classes", "pretrained")}


def load_weights(model: nn.Module, file: Path, architecture: str) -> None:
    """Load ``file`` into ``model`` (built with ``num_classes=0``): every weight but the classifier's."""
    state = read_weights(file, architecture)
    filter_fn = getattr(sys.modules[type(model).__module__], "checkpoint_filter_fn", None)
    if filter_fn is not None:  # timm's conversion of other layouts (original releases) to its own
        try:
            state = filter_fn(state, model)
        except (KeyError, IndexError, RuntimeError, ValueError) as error:  # it assumes the file is this model's
            raise ConfigError(
                f"net.weights: {file} is not {architecture}'s: timm cannot convert it ({type(error).__name__}: "
                f"{str(error)[:200]})"
            ) from None
    classifiers = model.pretrained_cfg.get("classifier") or ()
    for name in (classifiers,) if isinstance(classifiers, str) else classifiers:
        state = {key: value for key, value in state.items() if not key.startswith(f"{name}.")}
    load_all_weights(model, state, file, architecture)
