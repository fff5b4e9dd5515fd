"""Callbacks of this project; Lightning's own (ModelCheckpoint, LearningRateMonitor, ...) are used as they are."""

from .preemption import PreemptionCheckpoint

__all__ = ["PreemptionCheckpoint"]
