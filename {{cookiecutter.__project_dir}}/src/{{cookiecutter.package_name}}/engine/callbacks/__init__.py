"""Callbacks of this project; Lightning's own (ModelCheckpoint, LearningRateMonitor, ...) are used as they are."""

from .ema import EMA
from .finite import NonFiniteError, StopOnNonFinite
from .plots import RunPlots
from .predictions import PredictionWriter
from .preemption import PreemptionCheckpoint
from .progress import ThrottledRichProgressBar
from .random_state import RandomStateCheckpoint
from .summary import ModelSummaryWithoutZeroFlops

__all__ = [
    "EMA",
    "ModelSummaryWithoutZeroFlops",
    "NonFiniteError",
    "PredictionWriter",
    "PreemptionCheckpoint",
    "RandomStateCheckpoint",
    "RunPlots",
    "StopOnNonFinite",
    "ThrottledRichProgressBar",
]
