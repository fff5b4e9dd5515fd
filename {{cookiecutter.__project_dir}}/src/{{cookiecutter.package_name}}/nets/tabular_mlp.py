"""A multilayer perceptron over encoded table rows."""

from collections.abc import Sequence

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError


class TabularMLP(nn.Module):
    """``Linear -> LayerNorm -> GELU -> Dropout`` per hidden layer, then a linear output layer.

    LayerNorm keeps the hidden activations on one scale whatever the columns' (standardised, one-hot,
    0/1 indicator) mix; it normalises each row on its own, so results do not depend on the batch.

    Args:
        in_features: width F of an encoded row (linked from the DataModule by the CLI).
        out_features: number of classes, or 1 for a regression target (linked likewise).
        hidden_sizes: width of each hidden layer, in order.
        dropout: dropout probability after each hidden activation.

    Raises:
        ValueError: if a size is not positive or ``dropout`` is outside [0, 1).
    """

    def __init__(
        self,
        in_features: int = 30,
        out_features: int = 2,
        hidden_sizes: Sequence[int] = (128, 64),
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        if in_features < 1 or out_features < 1 or any(h < 1 for h in hidden_sizes):
            raise ConfigError(
                f"TabularMLP sizes must be positive, got in_features={in_features}, "
                f"out_features={out_features}, hidden_sizes={list(hidden_sizes)}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.init_args.net.init_args.dropout must be in [0, 1), got {dropout}")
        layers: list[nn.Module] = []
        width = in_features
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.LayerNorm(hidden), nn.GELU(), nn.Dropout(dropout)]
            width = hidden
        layers.append(nn.Linear(width, out_features))
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # (B, in_features) -> (B, out_features)
