"""scikit-learn's handwritten digits, served as normalised (B, 1, 8, 8) image batches.

The data set (1,797 grey-scale 8x8 images of the digits 0-9, pixel values 0-16) is the test set
of the UCI "Optical Recognition of Handwritten Digits" data (Alpaydin & Kaynak, 1998). It ships
inside scikit-learn, so training works offline with nothing to download.
"""

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.image_transforms import Standardize
from {{ cookiecutter.package_name }}.engine import (
    DataError,
    MissingFileError,
    ResumableDataModule,
    check_folds,
    check_fractions,
    split_indices,
)

_PIXEL_MAX = 16.0  # digits pixels are integer counts in [0, 16]


class DigitsDataModule(ResumableDataModule):
    """Seeded, stratified train/val/test split of the digits, normalised with train statistics only.

    After :meth:`setup`, ``split_indices`` maps "train", "val" and "test" to the row indices
    (into ``sklearn.datasets.load_digits``) of each split.

    Batches are ``(images, labels)`` with images (B, 1, 8, 8) float32 and labels (B,) int64 in [0, 10).
    Pixels are scaled to [0, 1], then standardised with the mean and standard deviation of the
    training split (a scalar each, so no statistic leaks from validation or test data). The
    statistics are saved in checkpoints, so inference can apply the same transform.

    Args:
        batch_size: samples per batch on each device (under DDP the global batch is
            ``batch_size * world_size``).
        val_fraction: share of all samples held out for validation.
        test_fraction: share of all samples held out for testing.
        split_seed: seed of the split, independent of ``seed_everything`` so that changing the
            training seed never changes which samples are test samples.
        num_folds, fold: k-fold cross-validation{{ " (``make cv``)" if cookiecutter.use_sweeps == "yes" and cookiecutter.task != "language-model" else "" }}: validate on fold ``fold`` (from 0) of ``num_folds``
            of what the test split leaves (:func:`engine.datamodule.split_indices`); None: ``val_fraction``.
        num_workers: DataLoader worker processes. 0 (the default) serves batches from the main
            process: the whole set is a tensor in memory, and workers would only add start-up
            and inter-process copies.
        pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`, which also
            provides the loaders and their exact resume.

    Raises:
        ValueError: if a fraction is outside (0, 1), the fractions leave no training data, or
            ``batch_size`` / ``num_workers`` / ``num_folds`` / ``fold`` is out of range.
    """

    num_classes = 10
    num_channels = 1
    image_shape = (1, 8, 8)
    class_names = tuple(str(digit) for digit in range(10))

    def __init__(
        self,
        batch_size: int = 128,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_folds: int | None = None,
        fold: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers)
        check_fractions(val_fraction, test_fraction)
        check_folds(num_folds, fold)
        self.save_hyperparameters()
        self.mean: float | None = None
        self.std: float | None = None
        self.split_indices: dict[str, torch.Tensor] = {}

    def setup(self, stage: str | None = None) -> None:
        """Load, split and normalise the data (every process, every stage; idempotent)."""
        if self.train_set is not None:
            return
        hp = self.hparams
        images, labels = load_digits(return_X_y=True)
        images = torch.as_tensor(images, dtype=torch.float32).reshape(-1, *self.image_shape) / _PIXEL_MAX
        labels = torch.as_tensor(labels, dtype=torch.int64)

        splits = split_indices(
            labels.numpy(), len(labels), hp.val_fraction, hp.test_fraction, hp.split_seed, hp.num_folds, hp.fold
        )
        self.split_indices = {name: torch.as_tensor(rows) for name, rows in splits.items()}
        train_images = images[self.split_indices["train"]]
        self.mean = train_images.mean().item()
        self.std = train_images.std().item()

        self.train_set, self.val_set, self.test_set = (
            TensorDataset(self.normalize(images[idx]), labels[idx]) for idx in self.split_indices.values()
        )
        self.check_batch_size()

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Standardise images (B, 1, 8, 8) scaled to [0, 1] with the training split's statistics.

        Raises:
            RuntimeError: if called before :meth:`setup` (or loading a checkpoint) set the statistics.
        """
        if self.mean is None or self.std is None:
            raise RuntimeError("DigitsDataModule.normalize needs the train statistics: call setup() first")
        return (images - self.mean) / self.std

    # ---- inference: raw pixel values 0-16, as load_digits gives them --------------------------------
    def inference_transform(self) -> Standardize:
        """Raw images (B, 1, 8, 8), pixel values 0-16 -> the normalised images the net trained on.

        Raises:
            RuntimeError: before :meth:`setup` (or loading a checkpoint) set the statistics.
        """
        self.normalize(torch.zeros(()))  # the same check, the same message
        return Standardize(self.mean, self.std, scale=1.0 / _PIXEL_MAX)
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Raw images (N, 1, 8, 8) float32 0-16 and labels (N,) of ``split`` ("all" for the whole set)."""
        images, labels = load_digits(return_X_y=True)
        rows = slice(None) if split == "all" else self.split_indices[split]
        images = torch.as_tensor(images, dtype=torch.float32).reshape(-1, *self.image_shape)
        return images[rows], torch.as_tensor(labels, dtype=torch.int64)[rows]

    def raw_description(self) -> str:
        return "8x8 grey-scale digit images, float pixel values 0 (white) to 16 (black), as sklearn's load_digits"

    def request_schema(self) -> dict[str, Any]:
        return {"kind": "array", "shape": list(self.image_shape), "min": 0.0, "max": _PIXEL_MAX}
{%- endif %}

    def test_ids(self) -> list[int]:
        """Row numbers of the test images in ``sklearn.datasets.load_digits()``."""
        return self.split_indices["test"].tolist()

    def read_inputs(self, path: str) -> tuple[list[str], torch.Tensor]:
        """Images from a ``.npy`` array (N, 8, 8) or (N, 64), or a CSV of 64 pixel values (0-16) per row, no header.

        Ids are the row numbers (0-based).

        Raises:
            FileNotFoundError: no such file.
            ValueError: another suffix, or rows that are not 64 values in [0, 16].
        """
        file = Path(path)
        if not file.is_file():
            raise MissingFileError(
                f"INPUTS={path}: no such file; give a .npy array or a CSV of 64 pixel values per row"
            )
        if file.suffix not in (".npy", ".csv"):
            raise DataError(f"INPUTS={path}: digits are read from .npy or .csv files, not {file.suffix or 'no suffix'}")
        try:
            if file.suffix == ".npy":
                values = np.asarray(np.load(file, allow_pickle=False), dtype=np.float32)
            else:  # utf-8-sig: a byte-order mark (Excel's CSV export) is not a value
                values = np.loadtxt(file, delimiter=",", ndmin=2, dtype=np.float32, encoding="utf-8-sig")
        except (ValueError, TypeError, OSError, EOFError) as error:
            expected = "a numeric .npy array" if file.suffix == ".npy" else "comma-separated numbers, no header row"
            raise DataError(f"INPUTS={path}: not readable as {expected} ({str(error).splitlines()[0]})") from None
        if values.size == 0 or values.size % 64 or values.reshape(len(values), -1).shape[1] != 64:
            raise DataError(f"INPUTS={path}: each row must hold 64 pixel values (8x8), got shape {list(values.shape)}")
        if not np.isfinite(values).all():
            row = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))[0])
            raise DataError(f"INPUTS={path}: row {row} holds NaN or infinite pixel values; pixels are in [0, 16]")
        if values.min() < 0 or values.max() > _PIXEL_MAX:
            raise DataError(
                f"INPUTS={path}: pixel values must be in [0, 16] (as sklearn's digits), got "
                f"{values.min()} to {values.max()}"
            )
        images = torch.from_numpy(values.reshape(-1, *self.image_shape).copy())
        return [str(i) for i in range(len(images))], images

    def state_dict(self) -> dict[str, Any]:
        """Normalisation statistics (for inference) and, from the base, where a resumed run's data starts."""
        return {**super().state_dict(), "mean": self.mean, "std": self.std}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.mean = state_dict["mean"]
        self.std = state_dict["std"]
