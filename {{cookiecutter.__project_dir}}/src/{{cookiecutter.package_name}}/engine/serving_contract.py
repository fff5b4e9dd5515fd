"""What a trained model needs from its DataModule and its task module to be exported and served: ``make export``
and ``make serve``, on top of :mod:`engine.contract`'s hooks (which inherit these; see its docstring).

**What to override, and when** (the bundled DataModules and task modules show each):

=========================  ===========================================================================
``raw_inputs``             the data sets are not ``(inputs, target)`` tensors samples
``request_schema``         requests are not arrays shaped like one raw input (rows, text)
``inputs_from_json``       a request's ``inputs`` are not nested lists of numbers
``dynamic_dims``           an export should leave more than the batch axis free (a sequence length)
``inference_files``        building an input needs a file beside the export (a trained tokenizer)
``raw_description``        the model card should say more of one input than its dtype and shape
``response`` & co.         the task is not a classifier: ``response``, ``score``, ``output_description``,
                           ``infer``
=========================  ===========================================================================

Then the raw input of an export and of a request is one ``inputs`` sample as the data set holds it, and the
preprocessing in the graph is ``transform_batch(training=False)``.
"""

from typing import Any

import torch
from torch import nn

from .errors import DataError

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["ServableData", "ServableModel"]


class ServableData:
    """The DataModule's export and serving hooks; :class:`engine.contract.ShippableData` inherits them."""

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Raw inputs (N, ...) of a split, as :meth:`inference_transform` takes them, and their targets (N, ...).

        Used to trace an export, to measure it (parity and accuracy) and to shape requests. Call
        after ``setup`` (the default calls it). Default: the split's ``(inputs, target)`` samples, stacked.

        Raises:
            ValueError: the split does not exist or its samples are not ``(inputs, target)`` tensors.
        """
        if getattr(self, f"{split}_set", None) is None:
            self.setup("predict")  # e.g. predict or the server asking for the inputs' shape
        dataset = getattr(self, f"{split}_set", None)
        if dataset is None:
            raise DataError(f"{type(self).__name__} has no {split}_set: call setup() first, or override raw_inputs")
        from .contract import stack_samples  # here: engine.contract imports this module

        try:
            inputs, targets, *_ = stack_samples(dataset)
        except (TypeError, ValueError, RuntimeError) as error:
            raise DataError(
                f"{type(self).__name__}.{split}_set samples are not (inputs, target) tensors ({error}); "
                "override raw_inputs(split) (engine/serving_contract.py)"
            ) from error
        return inputs, targets

    def dynamic_dims(self) -> dict[int, Any]:
        """The axes of a raw input that an export leaves free (``torch.export.Dim``): the batch, here."""
        return {0: torch.export.Dim("batch", min=1, max=1 << 20)}

    def raw_description(self) -> str:
        """What a raw input is, in words (units, range), for an export's model card."""
        inputs, _ = self.raw_inputs("test")
        return f"{inputs.dtype} tensors shaped (B, {', '.join(map(str, inputs.shape[1:]))}), as the data set holds them"

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


class ServableModel:
    """The task module's export and serving hooks; :class:`engine.contract.ShippableModel` inherits them."""

    def infer(self, predictor: nn.Module, inputs: Any) -> Any:
        """The server's and the export's computation on raw ``inputs``: ``predictor(inputs)`` here.

        A task whose answer takes more than one pass (a language model's generation) overrides it.
        """
        return predictor(inputs)

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
