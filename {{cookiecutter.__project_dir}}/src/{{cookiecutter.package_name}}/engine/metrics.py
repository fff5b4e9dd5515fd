"""Metrics for the training step's fast path: accumulated on the device, never read back on the host."""

from typing import Any

import torch
from torchmetrics import Metric


class WeightedMean(Metric):
    """Sum of ``value * weight`` over sum of ``weight``, accumulated on the device without a host sync.

    torchmetrics' ``MeanMetric`` checks each update for NaNs with ``.any()`` in Python: a host-device
    synchronisation in the middle of every training step, so the GPU sits idle while the host
    launches the backward pass. A NaN loss is caught by ``StopOnNonFinite`` instead. Subclass it and
    override ``compute`` for a transform of the mean (the language model's bits per byte, perplexity).
    """

    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor, weight: torch.Tensor) -> None:
        """Add a scalar ``value`` with its scalar ``weight`` (e.g. the tokens or bytes it averages over)."""
        self.total += value.double() * weight
        self.weight += weight

    def compute(self) -> torch.Tensor:
        return (self.total / self.weight).float()
