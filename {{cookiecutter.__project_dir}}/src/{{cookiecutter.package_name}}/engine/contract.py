"""What a trained model needs from its DataModule and its task module to ship: ``make predict``{{ ', ``export``, ``serve``' if cookiecutter.use_serving == 'yes' else '' }}.

This file is the whole {{ 'serving' if cookiecutter.use_serving == 'yes' else 'inference' }} contract. :class:`engine.ResumableDataModule` inherits
:class:`ShippableData` and :class:`engine.TrainingModule` inherits :class:`ShippableModel`, so an
own DataModule or task module gets every hook with a default, and overrides only what differs.

**Nothing to add** for the README's recipe: a DataModule whose ``setup`` makes map-style data sets
of ``(inputs, target)`` samples of tensors and whose batches are normalised (if at all) by
``transform_batch``, and a classifier on ``TrainingModule``. Then the raw input of {% if cookiecutter.use_serving == "yes" %}an export and
of a request is one ``inputs`` sample as the data set holds it, the preprocessing in the graph is
{%- else %}a prediction is
one ``inputs`` sample as the data set holds it, the preprocessing is
{%- endif %}
``transform_batch(training=False)``, and the answer is class probabilities.

**What to override, and when** (the bundled DataModules and task modules show each):

=========================  ===========================================================================
``inference_transform``    the preprocessing does more than ``transform_batch`` (e.g. ``setup`` scaled
                           the data): a module from raw input to the net's input, from saved statistics
{%- if cookiecutter.use_serving == "yes" %}
``raw_inputs``             the data sets are not ``(inputs, target)`` tensors samples
{%- endif %}
``read_inputs``            ``make predict INPUTS=...`` should read files (default: refused, one line)
{%- if cookiecutter.use_serving == "yes" %}
``request_schema``         requests are not arrays shaped like one raw input (rows, text)
``inputs_from_json``       a request's ``inputs`` are not nested lists of numbers
{%- endif %}
``test_ids``               predictions files should name test samples by more than their position
``truth``                  predictions files should hold the true label or value of more than a test
                           split of ``(inputs, class index)`` tensors (a user's file with its targets)
{%- if cookiecutter.use_serving == "yes" %}
``dynamic_dims``           an export should leave more than the batch axis free (a sequence length)
``inference_files``        building an input needs a file beside the export (a trained tokenizer)
``output_head`` & co.      the task is not a classifier: ``output_head``, ``describe``, ``response``,
                           ``score``, ``output_description``, ``prediction_format``, ``infer``
{%- else %}
``output_head`` & co.      the task is not a classifier: ``output_head``, ``describe``, ``prediction_format``
{%- endif %}
=========================  ===========================================================================

Everything these hooks read must come from the checkpoint (``state_dict`` / ``load_state_dict`` of
the DataModule, hyperparameters of both): a trained model never re-reads its training data to
answer (class names, channel modes, sizes, statistics, encoders, vocabularies).
"""

from typing import Any

import torch
from torch import nn
{%- if cookiecutter.use_serving == "yes" or (cookiecutter.use_prepared == "yes" and cookiecutter.task != "language-model") %}
from torch.utils.data import Dataset, TensorDataset, default_collate
{%- else %}
from torch.utils.data import Dataset, TensorDataset
{%- endif %}

from {{ cookiecutter.package_name }}.engine.errors import DataError


class BatchTransform(nn.Module):
    """Raw inputs (B, ...) -> ``datamodule.transform_batch((inputs,), training=False)[0]``: eval preprocessing."""

    def __init__(self, datamodule: "ShippableData") -> None:
        super().__init__()
        self._transform = datamodule.transform_batch  # a bound method, not a submodule

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._transform((inputs,), training=False)[0]
{%- if cookiecutter.use_serving == "yes" or (cookiecutter.use_prepared == "yes" and cookiecutter.task != "language-model") %}


def stack_samples(dataset: Dataset) -> tuple[torch.Tensor, ...]:
    """Every sample of a map-style ``dataset`` of tuples of tensors, stacked: ``(inputs (N, ...), targets (N, ...))``.

    Raises:
        TypeError, RuntimeError: samples that are not tuples of same-shaped tensors.
    """
    if isinstance(dataset, TensorDataset):
        return tuple(dataset.tensors)
    return tuple(default_collate([dataset[index] for index in range(len(dataset))]))
{%- endif %}


class ShippableData:
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
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Raw inputs (N, ...) of a split, as :meth:`inference_transform` takes them, and their targets (N, ...).

        Used to trace an export, to measure it (parity and accuracy) and to shape requests. Call
        after ``setup`` (the default calls it). Default: the split's ``(inputs, target)`` samples, stacked.

        Raises:
            ValueError: the split does not exist or its samples are not ``(inputs, target)`` tensors.
        """
        if getattr(self, f"{split}_set", None) is None:
            self.setup("predict")  # e.g. predict{{ " or the server" if cookiecutter.use_serving == "yes" else "" }} asking for the inputs' shape
        dataset = getattr(self, f"{split}_set", None)
        if dataset is None:
            raise DataError(f"{type(self).__name__} has no {split}_set: call setup() first, or override raw_inputs")
        try:
            inputs, targets, *_ = stack_samples(dataset)
        except (TypeError, ValueError, RuntimeError) as error:
            raise DataError(
                f"{type(self).__name__}.{split}_set samples are not (inputs, target) tensors ({error}); "
                "override raw_inputs(split) (engine/contract.py)"
            ) from error
        return inputs, targets

    def dynamic_dims(self) -> dict[int, Any]:
        """The axes of a raw input that an export leaves free (``torch.export.Dim``): the batch, here."""
        return {0: torch.export.Dim("batch", min=1, max=1 << 20)}

    def raw_description(self) -> str:
        """What a raw input is, in words (units, range), for an export's model card."""
        inputs, _ = self.raw_inputs("test")
        return f"{inputs.dtype} tensors shaped (B, {', '.join(map(str, inputs.shape[1:]))}), as the data set holds them"
{%- endif %}

    def explain_input(self, raw: torch.Tensor) -> str:
        """Why the model's output may not be finite for one raw input (one row of {{ ':meth:`raw_inputs`' if cookiecutter.use_serving == 'yes' else 'the inputs' }}), e.g.
        a value far outside the training data; said when predict{{ ' or serve' if cookiecutter.use_serving == 'yes' else '' }} refuses such an input.
        Default: nothing to add."""
        return ""
{%- if cookiecutter.use_serving == "yes" %}

    def inference_metadata(self) -> dict[str, Any]:
        """Anything else a user of an export needs to build its input (written to ``export.json``)."""
        return {}

    def inference_files(self) -> dict[str, str]:
        """Text files an export writes beside the model, ``{name: text}`` (a trained tokenizer); default none."""
        return {}

    def request_schema(self) -> dict[str, Any]:
        """How ``make serve`` checks a request's inputs (see :func:`serving.api.check_inputs`).

        Default: arrays shaped like one :meth:`raw_inputs` row, any finite numbers.
        """
        return {"kind": "array", "shape": list(self.raw_inputs("test")[0].shape[1:])}

    def inputs_from_json(self, inputs: list[Any]) -> torch.Tensor:
        """Raw inputs (B, ...) from a JSON request's ``inputs`` list (``make serve``).

        The requests were checked against :meth:`request_schema` first. The default takes nested
        lists of numbers shaped like one :meth:`raw_inputs` row each, as float32. It runs in the
        server's worker, whose DataModule is rebuilt from the checkpoint but not set up: it may
        read saved state, never the data.
        """
        return torch.tensor(inputs, dtype=torch.float32)
{%- endif %}

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


class ShippableModel:
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
{%- if cookiecutter.use_serving == "yes" %}

    def infer(self, predictor: nn.Module, inputs: Any) -> Any:
        """The server's and the export's computation on raw ``inputs``: ``predictor(inputs)`` here.

        A task whose answer takes more than one pass (a language model's generation) overrides it.
        """
        return predictor(inputs)
{%- endif %}

    def describe(self, outputs: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
        """One readable record per row of ``outputs`` (B, num_classes): the likeliest class and its probability."""
        probability, index = outputs.max(dim=-1)
        names = class_names or [str(i) for i in range(outputs.shape[-1])]
        return [
            {"label": names[i], "probability": round(p, 6)}
            for i, p in zip(index.tolist(), probability.tolist(), strict=True)
        ]
{%- if cookiecutter.use_serving == "yes" %}

    def response(self, outputs: torch.Tensor, class_names: list[str]) -> dict[str, Any]:
        """The JSON answer of ``make serve`` for ``outputs`` (B, num_classes): labels and every probability."""
        return {
            "labels": [record["label"] for record in self.describe(outputs, class_names)],
            "probabilities": outputs.tolist(),
        }

    def output_description(self) -> str:
        """What :meth:`output_head` returns, in words, for an export's model card."""
        return "class probabilities (softmax), one column per class"

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Quality of outputs (B, num_classes) against targets (B,): accuracy (for export checks and int8)."""
        return {"acc": (outputs.argmax(dim=-1) == targets).float().mean().item()}
{%- endif %}
