"""What a trained model needs from its DataModule and its task module to ship: ``make predict`` and the rest.

This file is the whole inference contract. :class:`engine.ResumableDataModule` inherits
:class:`ShippableData` and :class:`engine.TrainingModule` inherits :class:`ShippableModel`, so an
own DataModule or task module gets every hook with a default, and overrides only what differs.

**Nothing to add** for the README's recipe: a DataModule whose ``setup`` makes map-style data sets
of ``(inputs, target)`` samples of tensors and whose batches are normalised (if at all) by
``transform_batch``, and a classifier on ``TrainingModule``. Then the raw input of a prediction is
one ``inputs`` sample as the data set holds it, the preprocessing is
``transform_batch(training=False)``, and the answer is class probabilities.

**What to override, and when** (the bundled DataModules and task modules show each):

=========================  ===========================================================================
``inference_transform``    the preprocessing does more than ``transform_batch`` (e.g. ``setup`` scaled
                           the data): a module from raw input to the net's input, from saved statistics
``read_inputs``            ``make predict INPUTS=...`` should read files (default: refused, one line)
``test_ids``               predictions files should name test samples by more than their position
``truth``                  predictions files should hold the true label or value of more than a test
                           split of ``(inputs, class index)`` tensors (a user's file with its targets)
``output_head`` & co.      the task is not a classifier: ``output_head``, ``describe``, ``prediction_format``
=========================  ===========================================================================

A bake whose models also ship to other programs (an export, a server) has a second module of hooks beside
this one, which these classes then inherit (imported below); a bake without those commands has no such module,
and this contract is whole without it.

Everything these hooks read must come from the checkpoint (``state_dict`` / ``load_state_dict`` of
the DataModule, hyperparameters of both): a trained model never re-reads its training data to
answer (class names, channel modes, sizes, statistics, encoders, vocabularies).
"""

from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

try:
    from .serving_contract import ServableData, ServableModel
except ModuleNotFoundError as missing:  # the file is pruned whole by a bake without those commands
    if missing.name != f"{__package__}.serving_contract":
        raise
    ServableData = ServableModel = object

from .errors import DataError


class BatchTransform(nn.Module):
    """Raw inputs (B, ...) -> ``datamodule.transform_batch((inputs,), training=False)[0]``: eval preprocessing."""

    def __init__(self, datamodule: "ShippableData") -> None:
        super().__init__()
        self._transform = datamodule.transform_batch  # a bound method, not a submodule

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._transform((inputs,), training=False)[0]


def stack_samples(dataset: Dataset) -> tuple[torch.Tensor, ...]:
    """Every sample of a map-style ``dataset`` of tuples of tensors, stacked: ``(inputs (N, ...), targets (N, ...))``.

    Raises:
        TypeError, RuntimeError: samples that are not tuples of same-shaped tensors.
    """
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors)
    return tuple(default_collate([dataset[index] for index in range(len(dataset))]))


class ShippableData(ServableData):
    """The DataModule's half of the contract (see the module docstring). Mixed into ``ResumableDataModule``."""

    predict_set: Dataset | None
    predict_ids: list[str]
    predict_raw: Any = None
    test_set: Dataset | None
    _predicting_transformed_inputs: bool

    def inference_transform(self) -> nn.Module:
        """Raw inputs (B, ...) -> the net's inputs, as a module exported inside the model graph.

        Default: :meth:`transform_batch` with ``training=False`` (augmentation off), which must then
        be plain tensor operations. Override when ``setup`` preprocesses the data too: the module
        must do both, from statistics saved in the checkpoint.
        """
        return BatchTransform(self)

    def explain_input(self, raw: torch.Tensor) -> str:
        """Why the model's output may not be finite for one raw input (one row of the inputs), e.g. a value far
        outside the training data; said when a command refuses such an input. Default: nothing to add."""
        return ""

    def read_inputs(self, path: str) -> tuple[list[str], torch.Tensor]:
        """Ids and raw inputs (N, ...) read from a user's file or folder (``make predict INPUTS=...``).

        Raises:
            ValueError: this DataModule reads no input files, or the file is not what it reads.
        """
        raise DataError(f"{type(self).__name__} reads no input files; predict over the test split (no INPUTS=)")

    def use_inputs(self, path: str | None) -> None:
        """Predict over ``path`` (see :meth:`read_inputs`), or over the test split when None. Call after setup."""
        if path is None:
            self.predict_set, self.predict_ids = None, [str(i) for i in self.test_ids()]
            self.predict_raw, self.predict_truth = None, self.truth(None)
            self._predicting_transformed_inputs = False
            return
        ids, raw = self.read_inputs(path)  # first: a missing or unreadable file is named here
        self.predict_truth = self.truth(path)
        with torch.no_grad():
            self.predict_set = TensorDataset(self.inference_transform()(raw))
        self.predict_ids, self.predict_raw = ids, raw  # raw: for explain_input when an output is not finite
        self._predicting_transformed_inputs = True  # transform_batch is part of inference_transform

    def test_ids(self) -> list[Any]:
        """An id for each test sample, in order (default: its position in the test split)."""
        return list(range(len(self.test_set))) if self.test_set is not None else []

    def truth(self, path: str | None) -> list[Any] | None:
        """The true label (or value) of each sample ``make predict`` predicts, as a user reads it, when
        known: the predictions file's ``true_label`` (``true_value``) column. None: not known.

        ``path`` None is the test split. The default: the class names of a test split of
        ``(inputs, target)`` tensor samples whose targets are (N,) class indices; None for anything
        else, a user's file included (override where such a file may hold its targets).
        """
        names = list(getattr(self, "class_names", None) or [])
        test = self.test_set
        if path is not None or not names or not isinstance(test, TensorDataset) or len(test.tensors) != 2:
            return None
        targets = test.tensors[1]
        if targets.ndim != 1 or targets.is_floating_point():
            return None
        return [names[index] for index in targets.tolist()]


class ShippableModel(ServableModel):
    """The task module's half of the contract: what a user reads of the net's output (defaults: a classifier's)."""

    prediction_format = "csv"  # of make predict's file: "csv" or "jsonl" (for text)

    def output_head(self) -> nn.Module:
        """The net's output -> what a user reads, exported inside the model graph.

        Default: class probabilities, a softmax over the last dimension (B, num_classes).
        """
        return nn.Softmax(dim=-1)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """The :meth:`output_head` of the net's output for the inputs ``batch[0]`` (default: probabilities)."""
        return self.output_head()(self(batch[0]))

    def describe(self, outputs: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
        """One readable record per row of ``outputs`` (B, num_classes): the likeliest class and its probability."""
        probability, index = outputs.max(dim=-1)
        names = class_names or [str(i) for i in range(outputs.shape[-1])]
        return [
            {"label": names[i], "probability": round(p, 6)}
            for i, p in zip(index.tolist(), probability.tolist(), strict=True)
        ]
