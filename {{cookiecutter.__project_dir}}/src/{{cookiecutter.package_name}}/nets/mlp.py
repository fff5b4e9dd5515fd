"""A multilayer perceptron over flattened images."""

from collections.abc import Sequence

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError


class MLP(nn.Module):
    """Flatten, then ``Linear -> GELU -> Dropout`` per hidden layer, then a linear classifier.

    Args:
        in_channels: image channels C (linked from the DataModule by the CLI).
        image_size: image side H = W in pixels (8 for digits): the input size after flattening
            is ``in_channels * image_size ** 2``.
        hidden_sizes: width of each hidden layer, in order.
        num_classes: number of output logits.
        dropout: dropout probability after each hidden activation.

    Raises:
        ValueError: if a size is not positive or ``dropout`` is outside [0, 1).
    """

    def __init__(
        self,
        in_channels: int = 1,
        image_size: int = 8,
        hidden_sizes: Sequence[int] = (256, 128),
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if in_channels < 1 or image_size < 1 or num_classes < 1 or any(h < 1 for h in hidden_sizes):
            raise ConfigError(
                f"MLP sizes must be positive, got in_channels={in_channels}, image_size={image_size}, "
                f"hidden_sizes={list(hidden_sizes)}, num_classes={num_classes}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.init_args.net.init_args.dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_channels * image_size**2
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, C, H, W) -> flattened (B, C*H*W) -> logits (B, num_classes)
        return self.layers(x)
