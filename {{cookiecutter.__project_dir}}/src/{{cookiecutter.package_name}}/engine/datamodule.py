"""``ResumableDataModule``: loaders for any map-style data set that resume exactly, mid-epoch or at an epoch boundary.

A DataModule that inherits it only makes its data sets in ``setup`` (``self.train_set``,
``self.val_set``, ``self.test_set``, and optionally ``self.predict_set``: anything with
``__len__`` and ``__getitem__``); the base serves them:

- training batches in a random order that is a function of ``(seed, epoch)`` only, split across
  processes under DDP, and a checkpoint records how many batches of the current epoch were trained
  on, so a resumed run sees, on every process, exactly the batches an uninterrupted run would
  (the bake's ``tests/test_resume.py``);
- test and predict batches in which, under DDP, every sample is seen once (no padding repeats);
- loaders with their own random generator, so iterating never draws from the global RNG that the
  model's dropout uses (and that ``RandomStateCheckpoint`` restores).

The order is a pure function of (seed, epoch, world size, rank, batches done), the same for any
number of workers, so there is no iterator state to save: torch's DistributedSampler plus a skip. torchdata's
``StatefulDataLoader`` (which saves the sampler's and workers' positions instead) was measured
against it: with Lightning 2.6 it resumes in the wrong order as soon as ``configure_optimizers``
reads ``trainer.estimated_stepping_batches`` (as every schedule given the run's length does),
because Lightning builds the epoch's iterator before it restores the loader's state. It remains
the well-kept choice for iterable or streaming data, where no order function exists.
"""

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from sklearn.model_selection import KFold, StratifiedKFold, train_test_split
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset

from .checkpoints import CheckpointError
from .contract import ShippableData
from .errors import ConfigError, DataError


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """Refuse split fractions that are outside (0, 1) or leave no training data.

    Raises:
        ValueError: names ``data.val_fraction`` / ``data.test_fraction`` and the value.
    """
    for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not 0.0 < value < 1.0:
            raise ConfigError(f"data.{name} must be between 0 and 1 (exclusive), got {value}")
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError(
            f"data.val_fraction + data.test_fraction must be below 1 to leave training data, "
            f"got {val_fraction} + {test_fraction}"
        )


def check_folds(num_folds: int | None, fold: int) -> None:
    """Refuse a k-fold setting that names no fold of the folds.

    Raises:
        ValueError: names ``data.num_folds`` / ``data.fold`` and the values that work.
    """
    if num_folds is None:
        return
    if num_folds < 2:
        raise ConfigError(f"data.num_folds must be at least 2 (or null: one validation split), got {num_folds}")
    if not 0 <= fold < num_folds:
        raise ConfigError(f"data.fold must be one of 0 to {num_folds - 1} (data.num_folds={num_folds}), got {fold}")


def split_indices(
    labels: np.ndarray | None,
    size: int,
    val_fraction: float,
    test_fraction: float,
    seed: int,
    num_folds: int | None = None,
    fold: int = 0,
    cut: Sequence[str] = ("val", "test"),
) -> dict[str, np.ndarray]:
    """Seeded train/val/test row indices of ``size`` samples, stratified by ``labels`` when given.

    Two cuts (scikit-learn's ``train_test_split``): first the test set, then validation out of the
    rest, so with ``labels`` every split keeps the class proportions of the whole set. The split
    depends on ``seed`` alone, never on the training seed, so test samples stay test samples.
    Pass ``labels=None`` for a regression target (a plain random split). ``cut`` names the splits to
    cut, for data that bring some of their own (a folder's ``test/``): ``["val"]`` cuts
    ``val_fraction`` of the samples and returns train and val only.

    With ``num_folds`` (k-fold cross-validation), the test cut is the same and validation
    is fold ``fold`` of ``num_folds`` seeded folds of the rest (scikit-learn's ``StratifiedKFold``, or
    ``KFold`` without labels); ``val_fraction`` is unused. Over the folds, every sample outside the test
    set is validated on exactly once, and the test set is in no fold.
    """
    rows, rest, rest_labels = {}, np.arange(size), labels
    if "test" in cut:
        rest, rows["test"] = train_test_split(rest, test_size=test_fraction, stratify=labels, random_state=seed)
        rest_labels = None if labels is None else labels[rest]
    if "val" not in cut:
        rows["train"] = rest
    elif num_folds is not None:
        rows["train"], rows["val"] = fold_of(rest, rest_labels, num_folds, fold, seed)
    else:
        share = val_fraction / (1.0 - test_fraction) if "test" in cut else val_fraction
        rows["train"], rows["val"] = train_test_split(rest, test_size=share, stratify=rest_labels, random_state=seed)
    return {split: rows[split] for split in ("train", "val", "test") if split in rows}


def fold_of(
    indices: np.ndarray, labels: np.ndarray | None, num_folds: int, fold: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train, val)`` of ``indices``: validation is fold ``fold`` of ``num_folds`` seeded folds (stratified by
    ``labels`` when given, scikit-learn's ``StratifiedKFold``; else ``KFold``), training the other folds."""
    splitter = (KFold if labels is None else StratifiedKFold)(num_folds, shuffle=True, random_state=seed)
    train, val = list(splitter.split(indices, labels))[fold]
    return indices[train], indices[val]


# What tools write beside data, never a training example: hidden names (.DS_Store, the ._photo.jpg copies
# macOS writes on other disks, the copies in .ipynb_checkpoints) and the folders of a zip made on a Mac and of
# Python's bytecode. Names users write (a corpus's __init__.py) are data.
TOOL_FOLDERS = ("__MACOSX", "__pycache__")
# The most files and folders a data folder's walk reads: ImageNet's training set is 1.3 million, a disk many more.
MAX_DATA_ENTRIES = 5_000_000


def data_files(root: Path, suffixes: Sequence[str]) -> list[Path]:
    """The files under folder ``root`` at any depth whose names end in one of ``suffixes`` (any case), in path
    order, less what :func:`tool_files` lists: a copy or a stray file is never a training example."""
    return [path for path in _ending_in(root, suffixes) if not written_by_a_tool(path.relative_to(root))]


def left_out_note(root: Path, suffixes: Sequence[str]) -> str:
    """``", N left out as tools' files (...)"`` for the files under folder ``root`` ending in ``suffixes`` that
    :func:`data_files` leaves out (hidden, or under a hidden or ``TOOL_FOLDERS`` folder); "" for none or a file."""
    left = [str(p) for p in (path.relative_to(root) for path in _ending_in(root, suffixes)) if written_by_a_tool(p)]
    return f", {len(left)} left out as tools' files ({listed(left)})" if left else ""


def _ending_in(root: Path, suffixes: Sequence[str]) -> list[Path]:
    """The regular files under ``root`` (links followed) whose names end in ``suffixes``, in path order.

    A bounded walk: each folder is read once however many links lead to it (a link to a parent is not a
    path without end), and past ``MAX_DATA_ENTRIES`` entries the walk stops with a one-line error, so a
    ``data.path`` of ``/`` or ``~`` (in a config or in a received checkpoint) is refused, not a search
    of the whole disk.

    Raises:
        DataError: ``root`` holds more than ``MAX_DATA_ENTRIES`` files and folders.
    """
    found, folders, read, entries = [], [root], set(), 0
    while folders:
        folder = folders.pop()
        try:
            status = folder.stat()
        except OSError:  # a dangling link, or gone meanwhile
            continue
        if (status.st_dev, status.st_ino) in read:
            continue
        read.add((status.st_dev, status.st_ino))
        try:
            listing = list(os.scandir(folder))
        except OSError:  # unreadable: as rglob, nothing under it
            continue
        entries += len(listing)
        if entries > MAX_DATA_ENTRIES:
            raise DataError(
                f"data.path: {root} holds more than {MAX_DATA_ENTRIES:,} files and folders: point it at the data "
                "set's own folder, not a disk or a home folder"
            )
        for entry in listing:
            if entry.is_dir():
                folders.append(Path(entry.path))
            elif entry.name.lower().endswith(tuple(suffixes)) and entry.is_file():
                found.append(Path(entry.path))
    return sorted(found)


def written_by_a_tool(relative: Path) -> bool:
    """Whether a path (relative to a data folder) is, or lies under, a name tools write: see ``TOOL_FOLDERS``."""
    return any(part.startswith(".") or part in TOOL_FOLDERS for part in relative.parts)


def listed(names: Sequence[str], room: int = 160) -> str:
    """``names`` joined with commas, as many as fit in ``room`` characters, then "and N more": a data
    report names what it read on one readable line, whether a table has ten columns or a thousand."""
    shown: list[str] = []
    for name in names:
        if shown and len(", ".join([*shown, name])) > room:
            return f"{', '.join(shown)} and {len(names) - len(shown)} more"
        shown.append(name)
    return ", ".join(shown)


class ResumableSampler(DistributedSampler):
    """This process's share of a random order that depends on ``(seed, epoch)`` only, skipping what it trained on.

    The order and the shares are :class:`torch.utils.data.DistributedSampler`'s (one process:
    a ``randperm`` of the whole set; ``world_size`` processes: the permutation padded to a multiple
    of it, process ``rank`` taking every ``world_size``-th sample from position ``rank``).
    Lightning calls ``set_epoch`` before each epoch, and leaves a ``DistributedSampler`` in place
    under DDP instead of substituting its own. A resumed run, though, makes the iterator of the
    epoch it resumes in before that call, and Lightning then runs only that epoch's remaining
    batches: so the DataModule passes the epoch to resume in and ``skip``, the samples of that
    epoch this process already trained on (dropped from the first iterator only). The order is
    held as an int64 tensor (8 bytes a sample), not a Python list, so that it stays small beside a
    large data set read from disk.
    """

    def __init__(self, dataset: Dataset, world_size: int, rank: int, seed: int, epoch: int = 0, skip: int = 0) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.epoch, self.skip = epoch, skip

    def __iter__(self) -> Iterator[int]:
        # DistributedSampler's order, kept in an int64 tensor (8 bytes a sample) instead of its Python
        # list (about 36 bytes a sample: 250 MB for the 7 M windows of a 1 GB corpus), so that memory
        # stays flat for large data sets read from disk.
        skip, self.skip = self.skip, 0
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.dataset), generator=generator)  # (N,) int64
        if self.total_size > len(order):  # padded with its own start, to a multiple of the world size
            repeats = -(-self.total_size // len(order))
            order = order.repeat(repeats)
        own = order[: self.total_size][self.rank : self.total_size : self.num_replicas].numpy()
        return map(int, own[skip:])


class WholeBatches(Dataset):
    """A data set whose ``__getitems__(indices)`` returns the batch already collated, as default collation
    of its items would: :meth:`ResumableDataModule.loader` then gives it :func:`whole_batch` as collate
    function (unless the DataModule sets its own ``collate_fn``)."""


class TensorBatches(WholeBatches):
    """A ``TensorDataset`` served a batch at a time: one indexing op per tensor for the whole batch.

    A DataLoader fetches a batch with ``dataset.__getitems__(indices)`` when the dataset has it
    (``torch.utils.data._utils.fetch``), else sample by sample, then stacks the samples (collate): for
    a ``TensorDataset`` that is an index op per tensor per sample and a stack per tensor, host work
    that grows with the batch (305 of the 695 ops a digits step dispatched, counted by torch.profiler).
    Here the batch comes indexed and stacked at once, and :func:`whole_batch` passes it through as the
    collate function: the same values in the same order, a list of tensors as default collation gives.
    """

    def __init__(self, tensors: TensorDataset) -> None:
        self.tensors = tensors.tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(tensor[index] for tensor in self.tensors)

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        rows = torch.as_tensor(indices)
        return [tensor[rows] for tensor in self.tensors]


def whole_batch(batch: Any) -> Any:
    """The collate function of :class:`WholeBatches` data sets: their batch is already whole."""
    return batch


class ResumableDataLoader(DataLoader):
    """A DataLoader that tells Lightning it can resume mid-epoch: its position lives in the sampler.

    (Lightning warns before resuming mid-epoch with a loader lacking ``state_dict``.)
    """

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        pass


def check_resume_position(state: Any, path: Any) -> None:
    """Refuse a saved DataModule ``state`` (read from the checkpoint ``path``) whose resume position is not
    :class:`ResumableDataModule`'s: a mapping whose ``epoch`` and ``batches_done`` are whole numbers >= 0.

    A DataModule's own keys are its :meth:`ResumableDataModule.check_checkpoint_state`'s to check; these two
    the base reads whatever a subclass does (a text would fail in the middle of the resumed epoch).

    Raises:
        CheckpointError: naming the file, the key and what it holds.
    """
    fix = (
        "this is not a DataModule state a run of this project writes: resume from a checkpoint `make train` wrote, "
        "or start a new run (without --resume or --ckpt_path)"
    )
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: the DataModule's state holds {type(state).__name__}, not a mapping; {fix}")
    for key in ("epoch", "batches_done"):
        value = state.get(key, 0)
        if type(value) is not int or value < 0:
            shown = f"{type(value).__name__} {str(value)[:40]!r}"
            raise CheckpointError(f"{path}: the DataModule's {key} holds {shown}, not a whole number >= 0; {fix}")


class ResumableDataModule(ShippableData, L.LightningDataModule):
    """Base LightningDataModule: exact-resume training loader, every-sample-once test loader, loader settings.

    Its hooks for a trained model's commands (and their defaults) are :class:`engine.contract.ShippableData`'s.

    Subclasses call ``super().__init__(batch_size, num_workers, pin_memory, persistent_workers)``,
    create ``train_set``/``val_set``/``test_set`` in ``setup`` and, to save more state (say,
    normalisation statistics), extend :meth:`state_dict` and :meth:`load_state_dict` with ``super()``.

    Args:
        batch_size: samples per batch on each device (under DDP the global batch is
            ``batch_size * world_size``).
        num_workers: DataLoader worker processes (0: load in the main process).
        pin_memory: page-lock batches for faster, asynchronous host-to-GPU copies (GPU only).
        persistent_workers: keep workers alive between epochs (ignored when ``num_workers`` is 0).

    Raises:
        ValueError: ``batch_size`` below 1 or ``num_workers`` below 0; from :meth:`check_batch_size`,
            a batch larger than the training split.
    """

    def __init__(
        self, batch_size: int = 64, num_workers: int = 0, pin_memory: bool = False, persistent_workers: bool = False
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ConfigError(f"data.batch_size must be at least 1, got {batch_size}")
        if num_workers < 0:
            raise ConfigError(f"data.num_workers must be 0 or more, got {num_workers}")
        self.batch_size, self.num_workers = batch_size, num_workers
        self.pin_memory, self.persistent_workers = pin_memory, persistent_workers
        self.train_set: Dataset | None = None
        self.val_set: Dataset | None = None
        self.test_set: Dataset | None = None
        self.predict_set: Dataset | None = None
        self.predict_ids: list[str] = []  # an id per predict sample, for the predictions file
        self.predict_truth: list[Any] | None = None  # its true label or value, when known (``truth``)
        self._predicting_transformed_inputs = False
        self._resume_at = (0, 0)  # (epoch, batches of it done), from a checkpoint
        self._train_sampler: ResumableSampler | None = None  # the training loader's, once it exists
        # Makes a batch of samples (torch's default stacks them); samples of different lengths
        # need their own, e.g. one that pads. A module-level function or a functools.partial of
        # one, so that loader workers can receive it.
        self.collate_fn: Callable[[list[Any]], Any] | None = None

    def transform_batch(self, batch: Any, training: bool) -> Any:
        """Batch-level transforms on the batch's device, after the copy (identity here).

        Override for work that is cheaper per batch than per sample: augmentation and normalisation
        of whole image batches on the GPU, for instance. ``training`` is True for training batches
        only. Lightning calls it through ``on_after_batch_transfer``; a loop that measures the step calls it too,
        so both paths do the same work.
        """
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.trainer is not None and self.trainer.predicting and self._predicting_transformed_inputs:
            return batch  # use_inputs already applied inference_transform, which includes this
        return self.transform_batch(batch, training=self.trainer is not None and self.trainer.training)

    def check_batch_size(self) -> None:
        """Call at the end of ``setup``: a batch larger than the training split is refused.

        Raises:
            ValueError: names ``data.batch_size`` and the largest value that works.
        """
        size = len(self.train_set) if self.train_set is not None else None
        if size is not None and self.batch_size > size:
            raise ConfigError(
                f"data.batch_size={self.batch_size} is larger than the training split ({size} samples): "
                f"every epoch would be one short batch. Use at most {size}."
            )

    def train_dataloader(self) -> DataLoader:
        return self.loader(self.train_set, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self.loader(self.test_set, every_sample_once=True)

    def predict_dataloader(self) -> DataLoader:
        if self.predict_set is None and not self.predict_ids:  # the CLI's predict: the test split, ids for it
            self.predict_ids = [str(i) for i in self.test_ids()]
            self.predict_truth = self.truth(None)
        data = self.predict_set if self.predict_set is not None else self.test_set
        return self.loader(data, every_sample_once=True)

    def loader(self, dataset: Dataset | None, shuffle: bool = False, every_sample_once: bool = False) -> DataLoader:
        """A DataLoader over ``dataset`` with this module's settings (see the class docstring).

        Raises:
            RuntimeError: ``dataset`` is None (``setup`` has not made it).
        """
        if dataset is None:
            raise RuntimeError(f"{type(self).__name__}: call setup() before asking for a DataLoader")
        sampler = None
        world_size = self.trainer.world_size if self.trainer is not None else 1
        if every_sample_once and world_size > 1:
            # Lightning's default DistributedSampler pads the last batches with repeated samples so
            # every process gets as many; test metrics would count those twice. This sampler gives
            # each process a disjoint share instead (sizes may differ by one sample).
            sampler = UnrepeatedDistributedSampler(
                dataset, num_replicas=world_size, rank=self.trainer.global_rank, shuffle=False
            )
        if shuffle:
            epoch, batches_done = self._resume_at
            rank = self.trainer.global_rank if self.trainer is not None else 0
            skip = batches_done * self.batch_size  # of this process's share: every process ran as many batches
            sampler = ResumableSampler(dataset, world_size, rank, torch.initial_seed(), epoch, skip)
            self._train_sampler = sampler
            shuffle = False
        collate_fn = self.collate_fn
        if type(dataset) is TensorDataset and collate_fn is None:  # in memory: a batch in one op per tensor
            dataset = TensorBatches(dataset)
        if isinstance(dataset, WholeBatches) and collate_fn is None:
            collate_fn = whole_batch
        return ResumableDataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=shuffle,
            sampler=sampler,
            # A generator of its own: creating an iterator then never draws from the global RNG,
            # which is left to the model (dropout) and restored on resume.
            generator=torch.Generator().manual_seed(torch.initial_seed()),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and self.num_workers > 0,
            collate_fn=collate_fn,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where a resumed run's training data starts: the epoch and the batches of it already trained on."""
        epoch = batches = 0
        if self.trainer is not None:
            loop = self.trainer.fit_loop
            # The epoch of the iterator a resume builds first (epochs the fit loop has finished),
            # and the batches of it already trained on (none once that epoch has ended).
            epoch = loop.epoch_progress.current.processed
            batches = loop.epoch_loop.batch_progress.current.ready
            if batches >= self.trainer.num_training_batches:
                batches = 0
        return {"epoch": epoch, "batches_done": batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._resume_at = (state_dict.get("epoch", 0), state_dict.get("batches_done", 0))
        # A strategy that restores after setup (FSDP2's) has built the training loader already, to count its
        # batches for the schedule: that loader's sampler skips what was trained on (Lightning sets its epoch).
        if self._train_sampler is not None:
            self._train_sampler.skip = self._resume_at[1] * self.batch_size

    def check_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint whose saved DataModule ``state`` cannot go on with this data (e.g. a
        vocabulary trained on other text): the CLI calls it before it compares the weights' shapes, so
        the message names the data, not its effect on the net. Default: nothing to check.

        Raises:
            ValueError: (in an override) names what differs and the fix.
        """
