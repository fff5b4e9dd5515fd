"""A small convolutional network for low-resolution images (8x8 digits up to 32x32)."""

from collections.abc import Sequence
from itertools import pairwise

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError


class ConvBlock(nn.Module):
    """``Conv3x3 -> BatchNorm -> GELU``, twice, then 2x2 max-pooling: (B, C_in, H, W) -> (B, C_out, H/2, W/2)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        # No conv bias: BatchNorm's shift makes it redundant.
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.norm1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1, bias=False)
        self.norm2 = nn.BatchNorm2d(out_channels)
        self.act = nn.GELU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.conv1(x)))  # (B, C_out, H, W)
        x = self.act(self.norm2(self.conv2(x)))  # (B, C_out, H, W)
        return self.pool(x)  # (B, C_out, H/2, W/2)


class CNN(nn.Module):
    """Stacked :class:`ConvBlock` stages, global average pooling, then a linear classifier.

    Each stage halves the spatial size, so the input height and width must be divisible by
    ``2 ** len(channels)`` (8x8 digits allow up to 3 stages).

    Args:
        in_channels: image channels C (1 for digits).
        channels: output channels of each stage, in order.
        num_classes: number of output logits.
        dropout: dropout probability before the classifier.

    Raises:
        ValueError: if ``channels`` is empty, a size is not positive or ``dropout`` is outside [0, 1).
    """

    _no_split_modules = ("ConvBlock",)  # the FSDP units of the fsdp2 preset (engine.sharding)

    def __init__(
        self,
        in_channels: int = 1,
        channels: Sequence[int] = (32, 64),
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if not channels or in_channels < 1 or num_classes < 1 or any(c < 1 for c in channels):
            raise ConfigError(
                f"CNN sizes must be positive and channels non-empty, got in_channels={in_channels}, "
                f"channels={list(channels)}, num_classes={num_classes}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.init_args.net.init_args.dropout must be in [0, 1), got {dropout}")
        widths = [in_channels, *channels]
        self.blocks = nn.Sequential(*(ConvBlock(c_in, c_out) for c_in, c_out in pairwise(widths)))
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(widths[-1], num_classes)
{%- if cookiecutter.use_pretrained == "yes" %}

    @property
    def backbone(self) -> nn.Module:
        """The convolution stages (everything but the pooling and the head): what
        ``engine.callbacks.finetuning.BackboneFreeze`` freezes."""
        return self.blocks
{%- endif %}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)  # (B, C, H, W) -> (B, channels[-1], H / 2**stages, W / 2**stages)
        x = x.mean(dim=(2, 3))  # global average pool: (B, channels[-1])
        return self.head(self.dropout(x))  # (B, num_classes)
