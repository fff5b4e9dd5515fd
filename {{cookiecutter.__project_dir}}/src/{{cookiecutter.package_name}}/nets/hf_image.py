"""A pretrained Hugging Face vision backbone with a new classification head: images (B, C, H, W) -> logits (B, K).

``transformers.AutoModelForImageClassification`` builds the architecture a folder's ``config.json``
names (ViT, DINOv2, ConvNeXt, ResNet, Swin, EfficientNet, ...) with a new linear head (``classifier``)
for the DataModule's K classes, pooling the backbone's features as that architecture does (the
class token, or the global average). The folder may hold a backbone alone (``AutoModel``'s, as
``facebook/dinov2-small``) or a classifier: its head is replaced by a new one either way.
The images must be prepared as the backbone was pretrained: the image-folder DataModule's
``pretrained`` option reads the same folder's ``preprocessor_config.json`` (size, crop, mean and std).
Offline files, LoRA and checkpoints that hold only what was trained: :mod:`nets.hf`.
"""

from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError
from {{ cookiecutter.package_name }}.nets.hf import HFNet, LoRA, from_files, libraries
from {{ cookiecutter.package_name }}.nets.hub import locate
from {{ cookiecutter.package_name }}.nets.image_preprocessing import check_preprocessing_fits

HEAD = "classifier"  # the new head's name in every transformers image classifier


class HFImageClassifier(HFNet):
    """``transformers.AutoModelForImageClassification`` from local files with a new head, whole or under LoRA.

    Pair with ``engine.callbacks.finetuning.BackboneFreeze`` (the head trains first) for full fine-tuning; with
    ``lora`` the backbone stays frozen and adapters train beside its attention projections, with the
    head trained whole (and kept in checkpoints beside the adapters).

    Args:
        model: a folder written by ``save_pretrained`` (or a hub snapshot), or a Hugging Face hub id
            in the local cache (``HF_HOME``); ``hf download <id>`` fetches one where there is internet.
        revision: branch, tag or commit of a hub id (default: the cached main).
        num_classes: K, the new head's outputs (linked from the DataModule by the CLI).
        in_channels: the images' channels C (linked likewise): 1 (grey, repeated to the backbone's
            3) or the backbone's own.
        lora: LoRA settings (``target_modules`` such as ``[q_proj, v_proj]`` for ViT and DINOv2), or
            null to fine-tune every weight.

    Raises:
        FileNotFoundError: the model is neither a folder nor in the local cache (names the fetch command).
        ValueError: not an image model transformers can classify with, channels the backbone cannot
            take, or LoRA target modules the model lacks (lists those it has).
        ImportError: transformers or peft is not installed (names the extra).
    """

    def __init__(
        self,
        model: str,
        revision: str | None = None,
        num_classes: int = 10,
        in_channels: int = 3,
        lora: LoRA | None = None,
    ) -> None:
        super().__init__()
        transformers, _ = libraries(type(self).__name__)
        found = locate(model, revision)
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # its load report lists the new head as missing: by design
        try:
            base = from_files(
                transformers.AutoModelForImageClassification,
                found,
                "an image model transformers can classify with",
                "give a folder that save_pretrained wrote for a vision model (ViT, DINOv2, ConvNeXt, ResNet, ...)",
                new=HEAD,
                num_labels=num_classes,
                ignore_mismatched_sizes=True,  # a folder's own head for other classes is replaced
            )
        finally:
            transformers.logging.set_verbosity(verbosity)
        channels = getattr(base.config, "num_channels", 3)
        if in_channels not in (1, channels):
            raise ConfigError(
                f"the images have {in_channels} channels but {model} takes {channels}: use "
                f"{'RGB' if channels == 3 else f'{channels}-channel'} images, or a backbone made for yours"
            )
        self.repeat = channels if in_channels == 1 else 1
        for layer in getattr(base, HEAD).modules():  # a folder's own head, even for K classes, is not this data's
            if isinstance(layer, nn.Linear):
                layer.reset_parameters()
        self.adopt(base, found, lora, task_type="FEATURE_EXTRACTION", trained_whole=(HEAD,))

    @property
    def backbone(self) -> nn.Module:
        """Everything but the head (what ``engine.callbacks.finetuning.BackboneFreeze`` freezes); not a module of
        its own."""
        model = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model
        return getattr(model, model.base_model_prefix)

    def check_data(self, datamodule: Any) -> None:
        """Refuse, when fit starts, data prepared otherwise than this backbone's pretraining images
        (:func:`nets.image_preprocessing.check_preprocessing_fits`)."""
        check_preprocessing_fits(self, datamodule)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W), normalised as the backbone was pretrained -> class logits (B, K), float32."""
        if self.repeat > 1:
            images = images.expand(-1, self.repeat, -1, -1)  # (B, 1, H, W) -> (B, 3, H, W), no copy
        return self.model(pixel_values=images).logits.float()
