"""An HTTP server over a trained :class:`engine.inference.Predictor`, built on LitServe.

https://lightning.ai/docs/litserve

- ``GET /health`` answers 200 once every worker has loaded the model.
- ``POST /predict`` with ``{"inputs": [...raw examples...]}`` answers the task module's
  ``response`` (a classifier: ``{"labels": [...], "probabilities": [[...]]}``). Requests that
  arrive together are run as one batch (``max_batch_size``, ``batch_timeout``).
- A request is checked in the HTTP process, before it can join a batch: not JSON, no ``inputs``,
  too many inputs, or an input of the wrong shape, type or range gets a 4xx naming the problem
  (LitServe fails a whole batch when one request's decoding fails, so no check is left to the
  worker). Bodies over ``max_body_bytes`` get 413.

The checks come from the DataModule's ``request_schema()`` (see :func:`check_inputs`); the HTTP
processes read it from an environment variable, as they do not load the model.
"""

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import litserve as ls
import torch
from litserve.middlewares import MaxSizeMiddleware
from pydantic import BaseModel, ConfigDict, field_validator

from {{ cookiecutter.package_name }}.engine.inference import Trained, load_trained

SCHEMA_VARIABLE = "SERVE_REQUEST_SCHEMA"


def check_inputs(inputs: list[Any], schema: dict[str, Any]) -> None:
    """Raise ValueError naming the first input that does not fit ``schema``.

    ``schema`` kinds: ``{"kind": "array", "shape": [...], "min": a, "max": b}`` (nested lists of
    numbers), ``{"kind": "row", "columns": [...]}`` (objects with exactly these keys, values
    numbers, strings, booleans or null), ``{"kind": "text", "max_bytes": n}`` (non-empty strings).
    Every kind also has ``max_inputs``.
    """
    if not inputs:
        raise ValueError("inputs is empty: send at least one example")
    if len(inputs) > schema["max_inputs"]:
        raise ValueError(f"{len(inputs)} inputs in one request; send at most {schema['max_inputs']}")
    for index, example in enumerate(inputs):
        where = f"inputs[{index}]"
        if schema["kind"] == "array":
            _check_array(example, schema["shape"], schema.get("min"), schema.get("max"), where)
        elif schema["kind"] == "row":
            _check_row(example, schema["columns"], where)
        elif not isinstance(example, str) or not example:
            raise ValueError(f"{where} must be a non-empty string")
        elif len(example.encode("utf-8")) > schema["max_bytes"]:
            raise ValueError(f"{where} has {len(example.encode('utf-8'))} UTF-8 bytes; at most {schema['max_bytes']}")


def _check_array(value: Any, shape: list[int], low: float | None, high: float | None, where: str) -> None:
    if not shape:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where} must be a finite number, got {value!r}")
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{where} = {value} is outside [{low}, {high}]")
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        got = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise ValueError(f"{where} must be a list of {shape[0]} (an input has shape {shape}), got {got}")
    for position, item in enumerate(value):
        _check_array(item, shape[1:], low, high, f"{where}[{position}]")


def _check_row(value: Any, columns: list[str], where: str) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object with the columns {columns}")
    missing, unknown = [c for c in columns if c not in value], [k for k in value if k not in columns]
    if missing or unknown:
        raise ValueError(f"{where}: missing columns {missing}, unknown columns {unknown} (null for a missing value)")
    for column, item in value.items():
        if item is not None and not isinstance(item, int | float | str | bool):
            raise ValueError(f"{where}[{column!r}] must be a number, a string, a boolean or null")
        if isinstance(item, float) and not math.isfinite(item):
            raise ValueError(f"{where}[{column!r}] must be finite (null for a missing value)")


class PredictRequest(BaseModel):
    """The body of ``POST /predict``: ``{"inputs": [...]}``, checked against the served model's schema."""

    model_config = ConfigDict(extra="forbid")
    inputs: list[Any]

    @field_validator("inputs")
    @classmethod
    def _fits_the_model(cls, inputs: list[Any]) -> list[Any]:
        check_inputs(inputs, json.loads(os.environ[SCHEMA_VARIABLE]))
        return inputs


def join(parts: list[Any]) -> tuple[Any, list[int]]:
    """Requests' decoded inputs as one batch: tensors concatenated on dim 0, lists joined; and each one's size."""
    sizes = [len(part) for part in parts]
    if all(isinstance(part, torch.Tensor) for part in parts):
        return torch.cat(parts), sizes
    return [item for part in parts for item in part], sizes


def split(outputs: Any, sizes: list[int]) -> list[Any]:
    """The inverse of :func:`join` for the outputs of a batch: one slice per request."""
    if isinstance(outputs, torch.Tensor):
        return list(outputs.split(sizes))
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [outputs[start : start + size] for start, size in zip(starts, sizes, strict=True)]


class PredictorAPI(ls.LitAPI):
    """LitServe API over the :class:`engine.inference.Predictor` of a checkpoint, one per worker."""

    def __init__(self, checkpoint: Path, max_batch_size: int, batch_timeout: float, trust: Sequence[str] = ()) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.checkpoint, self.trust = checkpoint, tuple(trust)
        self.trained: Trained | None = None

    def setup(self, device: str) -> None:
        self.trained = load_trained(self.checkpoint, map_location=device, trust=self.trust)
        self.trained.predictor.to(device)
        self.device = device

    def decode_request(self, request: PredictRequest) -> Any:
        return self.trained.datamodule.inputs_from_json(request.inputs)

    def predict(self, inputs: Any) -> Any:
        """The model's answer to one request's inputs (what :meth:`decode_request` made of them)."""
        if isinstance(inputs, torch.Tensor):
            inputs = inputs.to(self.device)
        with torch.inference_mode():
            outputs = self.trained.model.infer(self.trained.predictor, inputs)
        return outputs.float().cpu() if isinstance(outputs, torch.Tensor) else outputs

    def encode_response(self, output: Any) -> dict[str, Any]:
        return self.trained.model.response(output, self.trained.class_names)


class BatchedPredictorAPI(PredictorAPI):
    """:class:`PredictorAPI` that runs concurrent requests as one batch (LitServe calls these hooks only
    when ``max_batch_size`` > 1; with 1 it hands ``predict`` one request's inputs)."""

    def batch(self, inputs: list[Any]) -> tuple[Any, list[int]]:
        return join(inputs)

    def predict(self, batch: tuple[Any, list[int]]) -> tuple[Any, list[int]]:
        inputs, sizes = batch
        return super().predict(inputs), sizes

    def unbatch(self, output: tuple[Any, list[int]]) -> list[Any]:
        return split(*output)


def build_server(
    trained: Trained,
    max_batch_size: int = 64,
    batch_timeout: float = 0.005,
    max_inputs: int = 256,
    max_body_bytes: int = 1 << 20,
    accelerator: str = "auto",
    workers_per_device: int = 1,
    timeout: float = 30.0,
    trust: Sequence[str] = (),
) -> ls.LitServer:
    """A LitServer over ``trained`` (its checkpoint is loaded again in each worker).

    Args:
        max_batch_size: most requests run as one batch; ``batch_timeout`` seconds to wait for them.
        max_inputs: most examples in one request (more: 422).
        max_body_bytes: largest request body (more: 413).
        accelerator: "auto", "cpu" or "cuda"; ``workers_per_device`` model copies per device.
        timeout: seconds a request may wait for its answer (then 504).
        trust: modules besides the project's that the checkpoint may name (engine.inference).
    """
    schema = {**trained.datamodule.request_schema(), "max_inputs": max_inputs}
    os.environ[SCHEMA_VARIABLE] = json.dumps(schema)  # read by the HTTP processes, which start after this
    api_class = BatchedPredictorAPI if max_batch_size > 1 else PredictorAPI
    api = api_class(trained.checkpoint, max_batch_size=max_batch_size, batch_timeout=batch_timeout, trust=trust)
    return ls.LitServer(
        api,
        accelerator=accelerator,
        workers_per_device=workers_per_device,
        timeout=timeout,
        middlewares=[(MaxSizeMiddleware, {"max_size": max_body_bytes})],
    )
