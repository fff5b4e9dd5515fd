"""Callbacks of this project; Lightning's own (ModelCheckpoint, LearningRateMonitor, ...) are used as they are."""

from .preemption import PreemptionCheckpoint
from .random_state import RandomStateCheckpoint

__all__ = ["PreemptionCheckpoint", "RandomStateCheckpoint"]
