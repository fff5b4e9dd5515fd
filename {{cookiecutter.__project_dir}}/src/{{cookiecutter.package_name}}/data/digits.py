"""scikit-learn's handwritten digits, served as normalised (B, 1, 8, 8) image batches.

The data set (1,797 grey-scale 8x8 images of the digits 0-9, pixel values 0-16) is the test set
of the UCI "Optical Recognition of Handwritten Digits" data (Alpaydin & Kaynak, 1998). It ships
inside scikit-learn, so training works offline with nothing to download.
"""

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import DataLoader, Sampler, TensorDataset

_PIXEL_MAX = 16.0  # digits pixels are integer counts in [0, 16]


class EpochShuffle(Sampler[int]):
    """A random order of ``range(size)`` that depends on ``(seed, epoch)`` only, like DistributedSampler's.

    Lightning calls ``set_epoch`` before each epoch. A resumed run, though, makes the iterator of
    the epoch it resumes in before that call, and Lightning then runs only that epoch's remaining
    batches: so the DataModule passes the epoch to resume in and ``skip``, the samples of that
    epoch already trained on (dropped from the first iterator only). A run resumed mid-epoch or at
    an epoch boundary thus sees the same batches as an uninterrupted one.
    """

    def __init__(self, size: int, seed: int = 0, epoch: int = 0, skip: int = 0) -> None:
        self.size, self.seed, self.epoch, self.skip = size, seed, epoch, skip

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        skip, self.skip = self.skip, 0
        return iter(order[skip:])

    def __len__(self) -> int:
        return self.size


class ResumableDataLoader(DataLoader):
    """A DataLoader that tells Lightning it can resume mid-epoch: its position lives in the sampler.

    The DataModule saves the epoch and the batches already trained on in every checkpoint and
    builds an :class:`EpochShuffle` that starts there, so this loader has no state of its own.
    (Lightning warns before resuming mid-epoch with a loader lacking ``state_dict``.)
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


class DigitsDataModule(L.LightningDataModule):
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
        num_workers: DataLoader worker processes. 0 (the default) serves batches from the main
            process: the whole set is a tensor in memory, and workers would only add start-up
            and inter-process copies.
        pin_memory: page-lock batches for faster, asynchronous host-to-GPU copies (GPU only).
        persistent_workers: keep workers alive between epochs (ignored when ``num_workers`` is 0).

    Raises:
        ValueError: if a fraction is outside (0, 1), the fractions leave no training data, or
            ``batch_size`` / ``num_workers`` is out of range.
    """

    num_classes = 10
    image_shape = (1, 8, 8)

    def __init__(
        self,
        batch_size: int = 128,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"data.batch_size must be at least 1, got {batch_size}")
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be 0 or more, got {num_workers}")
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0.0 < value < 1.0:
                raise ValueError(f"data.{name} must be between 0 and 1 (exclusive), got {value}")
        if val_fraction + test_fraction >= 1.0:
            raise ValueError(
                f"data.val_fraction + data.test_fraction must be below 1 to leave training data, "
                f"got {val_fraction} + {test_fraction}"
            )
        self.save_hyperparameters()
        self.mean: float | None = None
        self.std: float | None = None
        self.train_set: TensorDataset | None = None
        self.val_set: TensorDataset | None = None
        self.test_set: TensorDataset | None = None
        self.split_indices: dict[str, torch.Tensor] = {}
        self._resume_at = (0, 0)  # (epoch, batches of it done), from a checkpoint

    def setup(self, stage: str | None = None) -> None:
        """Load, split and normalise the data (every process, every stage; idempotent)."""
        if self.train_set is not None:
            return
        hp = self.hparams
        images, labels = load_digits(return_X_y=True)
        images = torch.as_tensor(images, dtype=torch.float32).reshape(-1, *self.image_shape) / _PIXEL_MAX
        labels = torch.as_tensor(labels, dtype=torch.int64)

        # Two stratified cuts: first the test set, then validation out of the rest, so every
        # split keeps the class proportions of the whole set.
        indices = torch.arange(len(labels)).numpy()
        rest, test = train_test_split(indices, test_size=hp.test_fraction, stratify=labels, random_state=hp.split_seed)
        train, val = train_test_split(
            rest,
            test_size=hp.val_fraction / (1.0 - hp.test_fraction),
            stratify=labels[rest],
            random_state=hp.split_seed,
        )
        self.split_indices = {
            "train": torch.as_tensor(train),
            "val": torch.as_tensor(val),
            "test": torch.as_tensor(test),
        }
        train_images = images[train]
        self.mean = train_images.mean().item()
        self.std = train_images.std().item()

        self.train_set, self.val_set, self.test_set = (
            TensorDataset(self.normalize(images[idx]), labels[idx]) for idx in self.split_indices.values()
        )
        if hp.batch_size > len(self.train_set):
            raise ValueError(
                f"data.batch_size={hp.batch_size} is larger than the training split ({len(self.train_set)} samples): "
                f"every epoch would be one short batch. Use at most {len(self.train_set)}."
            )

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Standardise images (B, 1, 8, 8) scaled to [0, 1] with the training split's statistics.

        Raises:
            RuntimeError: if called before :meth:`setup` (or loading a checkpoint) set the statistics.
        """
        if self.mean is None or self.std is None:
            raise RuntimeError("DigitsDataModule.normalize needs the train statistics: call setup() first")
        return (images - self.mean) / self.std

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, every_sample_once=True)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, every_sample_once=True)

    def _loader(
        self, dataset: TensorDataset | None, shuffle: bool = False, every_sample_once: bool = False
    ) -> DataLoader:
        if dataset is None:
            raise RuntimeError("DigitsDataModule: call setup() before asking for a DataLoader")
        hp = self.hparams
        sampler = None
        if every_sample_once and self.trainer is not None and self.trainer.world_size > 1:
            # Lightning's default DistributedSampler pads the last batches with repeated samples so
            # every process gets as many; test metrics would count those twice. This sampler gives
            # each process a disjoint share instead (sizes may differ by one sample).
            sampler = UnrepeatedDistributedSampler(
                dataset, num_replicas=self.trainer.world_size, rank=self.trainer.global_rank, shuffle=False
            )
        if shuffle and (self.trainer is None or self.trainer.world_size == 1):
            # Under DDP Lightning shuffles with a DistributedSampler, whose order is also a
            # function of (seed, epoch) alone.
            epoch, batches_done = self._resume_at
            sampler = EpochShuffle(len(dataset), torch.initial_seed(), epoch, skip=batches_done * hp.batch_size)
            shuffle = False
        return ResumableDataLoader(
            dataset,
            batch_size=hp.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            # A generator of its own: creating an iterator then never draws from the global RNG,
            # which is left to the model (dropout) and restored on resume.
            generator=torch.Generator().manual_seed(torch.initial_seed()),
            num_workers=hp.num_workers,
            pin_memory=hp.pin_memory,
            persistent_workers=hp.persistent_workers and hp.num_workers > 0,
        )

    def state_dict(self) -> dict[str, Any]:
        """Normalisation statistics (for inference) and where a resumed run's training data starts."""
        epoch = batches = 0
        if self.trainer is not None:
            loop = self.trainer.fit_loop
            # The epoch of the iterator a resume builds first (epochs the fit loop has finished),
            # and the batches of it already trained on (none once that epoch has ended).
            epoch = loop.epoch_progress.current.processed
            batches = loop.epoch_loop.batch_progress.current.ready
            if batches >= self.trainer.num_training_batches:
                batches = 0
        return {"mean": self.mean, "std": self.std, "epoch": epoch, "batches_done": batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.mean = state_dict["mean"]
        self.std = state_dict["std"]
        self._resume_at = (state_dict.get("epoch", 0), state_dict.get("batches_done", 0))
