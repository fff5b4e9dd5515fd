"""A multilayer perceptron over flattened images."""

from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Flatten, then ``Linear -> GELU -> Dropout`` per hidden layer, then a linear classifier.

    Args:
        in_features: input size after flattening, C * H * W (64 for 8x8 digits).
        hidden_sizes: width of each hidden layer, in order.
        num_classes: number of output logits.
        dropout: dropout probability after each hidden activation.

    Raises:
        ValueError: if a size is not positive or ``dropout`` is outside [0, 1).
    """

    def __init__(
        self,
        in_features: int = 64,
        hidden_sizes: Sequence[int] = (256, 128),
        num_classes: int = 10,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if in_features < 1 or num_classes < 1 or any(h < 1 for h in hidden_sizes):
            raise ValueError(
                f"MLP sizes must be positive, got in_features={in_features}, "
                f"hidden_sizes={list(hidden_sizes)}, num_classes={num_classes}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"MLP dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.GELU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (B, C, H, W) -> flattened (B, C*H*W) -> logits (B, num_classes)
        return self.layers(x)
