"""LightningModules: task logic only (loss, metrics, optimizers); architectures live in ``nets``."""

from .classifier import ImageClassifier

__all__ = ["ImageClassifier"]
