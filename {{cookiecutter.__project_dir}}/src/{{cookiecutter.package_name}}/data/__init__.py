"""LightningDataModules: every data decision (source, split, normalisation, loaders) lives here."""

from .digits import DigitsDataModule

__all__ = ["DigitsDataModule"]
