"""An HTTP server over a trained :class:`engine.inference.Predictor`, built on LitServe.

https://lightning.ai/docs/litserve

- ``GET /health`` answers 200 once every worker has loaded the model.
- ``POST /predict`` with ``{"inputs": [...raw examples...]}`` answers the task module's
  ``response`` (a classifier: ``{"labels": [...], "probabilities": [[...]]}``). Requests that
  arrive together are run as one batch (``max_batch_size``, ``batch_timeout``).
- A request is checked in the HTTP process, before it can join a batch: not JSON, no ``inputs``,
  too many inputs, or an input of the wrong shape, type or range (NaN, infinities and numbers
  beyond float32 included) gets 422 naming the input and the problem, without echoing the input
  back. Bodies over ``max_body_bytes`` get 413.
{%- if cookiecutter.task == "image-classification" %}
  A DataModule whose schema says ``image_files`` (image folders) also takes image files as base64
  text: only their header is read here, and one of more than ``max_image_pixels`` pixels (a
  decompression bomb too), or images of more than ``max_request_pixels`` pixels in all in one
  request, gets 422.
{%- endif %}
- No answer holds a NaN: a request whose output is not finite for an input (a value of 1e30 in a
  table, finite in float32 but far beyond the training data) gets 422 naming the input, and the
  DataModule's reason (``explain_input``: the column and how far it lies from the training mean).
- A request that still fails in the worker fails alone (LitServe would fail its whole batch): each
  request is decoded on its own, and a batch that raises is run again one request at a time, so
  only the request that raises gets an error (422 for a ``ValueError`` of its decoding, naming
  it; 500 otherwise). Each failure is one line in the log; the first one of a worker also logs
  its traceback.
- The body is read as JSON whatever its ``Content-Type`` says: ``curl -d`` sends
  ``application/x-www-form-urlencoded`` unless told otherwise. A ``multipart/form-data`` upload
  (``curl -F file=@cat.png``) becomes ``{"inputs": [<each file as base64 text>, ...]}``.

The checks come from the DataModule's ``request_schema()`` (see :func:`check_inputs`); the HTTP
processes read it from an environment variable, as they do not load the model.
"""

import asyncio
import base64
import json
import logging
import math
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import litserve as ls
import torch
from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, field_validator
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException
{% if cookiecutter.task == "image-classification" %}
from {{ cookiecutter.package_name }}.data.image_files import image_file_pixels
{%- endif %}
from {{ cookiecutter.package_name }}.engine import Trained, load_trained, nonfinite_message, nonfinite_rows

SCHEMA_VARIABLE = "SERVE_REQUEST_SCHEMA"
FLOAT32_MAX = float(torch.finfo(torch.float32).max)  # inputs become float32 tensors: larger ones are inf
MAX_DETAIL_CHARS = 500  # a 422 answer names the problem; it never echoes a large input back

log = logging.getLogger(__name__)
# python-multipart logs a warning of its own for each malformed upload, which the 400 already names.
logging.getLogger("python_multipart").setLevel(logging.ERROR)


def check_inputs(inputs: list[Any], schema: dict[str, Any]) -> None:
    """Raise ValueError naming the first input that does not fit ``schema``.

    ``schema`` kinds: ``{"kind": "array", "shape": [...], "min": a, "max": b}`` (nested lists of
    finite numbers), ``{"kind": "row", "columns": [...], "numeric": [...]}`` (objects with at least
    these keys, others left out as ``make predict`` leaves out a file's other columns; values
    numbers, strings, booleans or null, and in a ``numeric`` column a finite number within float32
    or null), ``{"kind": "text", "max_bytes": n}`` (non-empty strings). Every kind also has ``max_inputs``.
{%- if cookiecutter.task == "language-model" %}
    The language model's schema also has ``new_tokens`` per prompt and ``max_request_tokens``, the
    most new tokens one request may cost in all, so prompts x ``new_tokens`` above it is refused.
{%- endif %}
{%- if cookiecutter.task == "image-classification" %}
    An array schema with ``"image_files": true`` also takes an image file as base64 text in place of
    an array; its header is read here (never the pixels) and more than ``max_image_pixels`` pixels in
    one image, or ``max_request_pixels`` in all the images of the request (what the worker would
    decode for it), is refused.
{%- endif %}
    """
    if not inputs:
        raise ValueError("inputs is empty: send at least one example")
    if len(inputs) > schema["max_inputs"]:
        raise ValueError(f"{len(inputs)} inputs in one request; send at most {schema['max_inputs']}")
{%- if cookiecutter.task == "language-model" %}
    new_tokens, budget = schema.get("new_tokens"), schema.get("max_request_tokens")
    if new_tokens and budget is not None and len(inputs) * new_tokens > budget:
        raise ValueError(
            f"{len(inputs)} prompts x {new_tokens} new tokens each = {len(inputs) * new_tokens} tokens to generate; "
            f"the server generates at most {budget} per request (--max_request_tokens): send at most "
            f"{budget // new_tokens} prompts per request"
        )
{%- endif %}
{%- if cookiecutter.task == "image-classification" %}
    pixels = 0
{%- endif %}
    for index, example in enumerate(inputs):
        where = f"inputs[{index}]"
{%- if cookiecutter.task == "image-classification" %}
        if schema["kind"] == "array" and isinstance(example, str) and schema.get("image_files"):
            pixels = image_file_pixels(example, where, schema, pixels)
            continue
{%- endif %}
        if schema["kind"] == "array":
            _check_array(example, schema["shape"], schema.get("min"), schema.get("max"), where)
        elif schema["kind"] == "row":
            _check_row(example, schema["columns"], schema.get("numeric", ()), where)
        elif not isinstance(example, str) or not example:
            raise ValueError(f"{where} must be a non-empty string")
        elif len(example.encode("utf-8")) > schema["max_bytes"]:
            raise ValueError(f"{where} has {len(example.encode('utf-8'))} UTF-8 bytes; at most {schema['max_bytes']}")


def describe_request(datamodule: Any, max_inputs: int) -> str:
    """The body ``POST /predict`` takes, in words, from the DataModule's ``request_schema()``."""
    schema = datamodule.request_schema()
    if schema["kind"] == "array":
        each = (
            f"a nested list of shape {schema['shape']} of numbers in [{schema.get('min')}, {schema.get('max')}] "
            f"({datamodule.raw_description()})"
        )
{%- if cookiecutter.task == "image-classification" %}
        if schema.get("image_files"):
            each += ", or an image file (PNG, JPEG, ...) as base64 text, decoded and resized as INPUTS= files are"
{%- endif %}
    elif schema["kind"] == "row":
        columns = schema["columns"]
        shown = ", ".join(columns[:6]) + (f", ... ({len(columns)} columns)" if len(columns) > 6 else "")
        each = "an object {column: value} with the columns " + shown + "; null for a missing value"
    else:
        each = f"a string of at most {schema['max_bytes']} UTF-8 bytes"
    return '{"inputs": [...]}' + f", 1 to {max_inputs} inputs, each {each}"


def _check_number(value: Any, where: str) -> None:
    """A JSON number that stays finite as float32 (a 400-digit integer, 1e308, NaN and Infinity do not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number, got {type(value).__name__} {_short(value)}")
    try:
        finite = math.isfinite(value) and abs(float(value)) <= FLOAT32_MAX
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"{where} must be a finite number within float32 (|x| <= 3.4e38), got {_short(value)}")


def cut(detail: str) -> str:
    """``detail`` within ``MAX_DETAIL_CHARS``, cut at a word with " ..." (never mid-word)."""
    if len(detail) <= MAX_DETAIL_CHARS:
        return detail
    return detail[: MAX_DETAIL_CHARS - 4].rsplit(" ", 1)[0] + " ..."


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _check_array(value: Any, shape: list[int], low: float | None, high: float | None, where: str) -> None:
    if not shape:
        _check_number(value, where)
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"{where} = {value} is outside [{low}, {high}]")
        return
    if not isinstance(value, list) or len(value) != shape[0]:
        got = f"a list of {len(value)}" if isinstance(value, list) else type(value).__name__
        raise ValueError(f"{where} must be a list of {shape[0]} (an input has shape {shape}), got {got}")
    for position, item in enumerate(value):
        _check_array(item, shape[1:], low, high, f"{where}[{position}]")


def _check_row(value: Any, columns: list[str], numeric: Sequence[str], where: str) -> None:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object with the columns {columns}")
    missing = [c for c in columns if c not in value]
    if missing:
        shown = missing[:8] + ["..."] * (len(missing) > 8)
        raise ValueError(
            f"{where}: missing {len(missing)} of the {len(columns)} columns: {', '.join(shown)} "
            "(null is a missing value, and is accepted)"
        )
    for column in columns:
        item = value[column]
        if item is None:
            continue
        if column in numeric:
            _check_number(item, f"{where}[{column!r}] (a numeric column; null for a missing value)")
        elif not isinstance(item, int | float | str | bool):
            raise ValueError(f"{where}[{column!r}] must be a number, a string, a boolean or null")
        elif isinstance(item, float) and not math.isfinite(item):
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


async def refuse_request(request: Request, error: RequestValidationError) -> JSONResponse:
    """422 naming each problem of a refused request in one short line, without FastAPI's echo of the input
    (78 KB for one 64x64 image, and a 500 when the input holds a NaN, which JSON cannot encode)."""
    problems = []
    for problem in error.errors()[:3]:
        if problem.get("type") == "json_invalid":
            position = problem.get("loc", ("body", "?"))[-1]
            reason = problem.get("ctx", {}).get("error", "")
            problems.append(f"body: not valid JSON at character {position} ({reason}); " + 'send {"inputs": [...]}')
            continue
        where = ".".join(str(part) for part in problem.get("loc", ())[1:]) or "body"
        problems.append(f"{where}: {str(problem.get('msg', '')).removeprefix('Value error, ')}")
    return JSONResponse({"detail": cut("; ".join(problems))}, status_code=422)


class JSONBodyMiddleware:
    """Read ``POST`` bodies as JSON whatever their ``Content-Type`` (``curl -d`` sends a form type),
    and a ``multipart/form-data`` upload as ``{"inputs": [...]}`` of its files, each as base64 text.

    A plain ASGI middleware: it rewrites the request before FastAPI parses the body. A body over
    ``max_body_bytes`` gets 413 naming the limit (LitServe's ``MaxSizeMiddleware`` says only "Payload
    too large"); a body not complete ``body_timeout`` seconds after its headers gets 408 and its
    connection is closed (uvicorn bounds neither: a client trickling a body a byte at a time would
    hold its connection, and a file descriptor, for as long as it likes). An upload is read whole
    here and parsed by Starlette's form parser.
    """

    def __init__(self, app, max_body_bytes: int = 1 << 20, max_files: int = 256, body_timeout: float = 10.0) -> None:
        self.app, self.max_body_bytes, self.max_files = app, max_body_bytes, max_files
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = [(name, value) for name, value in scope["headers"] if name.lower() != b"content-type"]
            receive = self.timed(receive)
            if dict(scope["headers"]).get(b"content-type", b"").startswith(b"multipart/form-data"):
                try:
                    body = await self.upload_as_json(scope, receive)
                except HTTPException as error:  # the body's deadline passed
                    late = JSONResponse({"detail": error.detail}, status_code=error.status_code, headers=error.headers)
                    await late(scope, receive, send)
                    return
                # No boundary, too many parts, not multipart at all (Starlette raises its 400 as an exception here).
                except (MultiPartException, StarletteHTTPException) as error:
                    reason = getattr(error, "detail", None) or getattr(error, "message", None) or str(error)
                    detail = f"body: not a readable multipart/form-data upload ({reason}); send files as curl -F does"
                    await JSONResponse({"detail": cut(detail)}, status_code=400)(scope, receive, send)
                    return
                if body is None:
                    await JSONResponse({"detail": self.too_large}, status_code=413)(scope, receive, send)
                    return
                headers = [(name, value) for name, value in headers if name.lower() != b"content-length"]
                headers.append((b"content-length", str(len(body)).encode()))
                receive = _replay(body)
            else:
                receive = self.limited(receive)
            scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        await self.app(scope, receive, send)

    @property
    def too_large(self) -> str:
        return f"the request body is over {self.max_body_bytes} bytes, the server's --max_body_bytes"

    def timed(self, receive):
        """``receive`` that raises 408 (inside FastAPI, which answers it) once the body is ``body_timeout`` late."""
        deadline, complete = time.monotonic() + self.body_timeout, False

        async def receive_in_time() -> dict[str, Any]:
            nonlocal complete
            if complete:  # after the body: waiting for a disconnect while the model works is not bounded here
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                late = f"the request body did not arrive within {self.body_timeout:g} s (the server's --body_timeout)"
                raise HTTPException(408, late, headers={"Connection": "close"}) from None  # the socket goes too
            complete = message.get("type") != "http.request" or not message.get("more_body", False)
            return message

        return receive_in_time

    def limited(self, receive):
        """``receive`` that raises 413 (inside FastAPI, which answers it) once the body passes the limit."""
        size = 0

        async def receive_within_the_limit() -> dict[str, Any]:
            nonlocal size
            message = await receive()
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                raise HTTPException(413, self.too_large)
            return message

        return receive_within_the_limit

    async def upload_as_json(self, scope, receive) -> bytes | None:
        """``{"inputs": [base64 of each uploaded file, in order]}`` as JSON bytes; None past the size limit."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return None
            more = message.get("more_body", False)
        # As many files as inputs a request may hold; other fields (ignored) up to Starlette's 1,000.
        form = await Request(scope, _replay(b"".join(chunks))).form(max_files=self.max_files)
        files = [await item.read() for _, item in form.multi_items() if isinstance(item, UploadFile)]
        return json.dumps({"inputs": [base64.b64encode(data).decode() for data in files]}).encode()


def _replay(body: bytes):
    """An ASGI ``receive`` that gives ``body`` in one message."""
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


@dataclass
class Failed:
    """The answer to one request that failed in the worker, in place of its outputs: ``status`` and ``detail``."""

    status: int
    detail: str

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": cut(self.detail)}, status_code=self.status)


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
    """LitServe API over the :class:`engine.inference.Predictor` of a checkpoint, one per worker.

    Every hook returns a :class:`Failed` for a request it cannot answer instead of raising, as
    LitServe answers 500 to every request of a batch when a hook raises.
    """

    def __init__(
        self, checkpoint: Path, max_batch_size: int, batch_timeout: float, trust: Sequence[str] = (), workers: int = 1
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout)
        self.checkpoint, self.trust, self.workers = checkpoint, tuple(trust), workers
        self.trained: Trained | None = None
        self.failures = 0

    def setup(self, device: str) -> None:
        self.trained = load_in_worker(self.checkpoint, device, self.trust, self.workers)
        self.device = device

    def decode_request(self, request: PredictRequest) -> Any:
        try:
            return self.trained.datamodule.inputs_from_json(request.inputs)
        except ValueError as error:  # the input, which the HTTP process's checks let through
            return self.failed(422, f"inputs: {error}", error)
        except Exception as error:
            return self.failed(500, "the server failed to decode this request's inputs; see its log", error)

    def predict(self, inputs: Any) -> Any:
        """The model's answer to one request's inputs (what :meth:`decode_request` made of them)."""
        if isinstance(inputs, Failed):
            return inputs
        try:
            return self.refuse_nonfinite(inputs, self.infer(inputs))
        except Exception as error:
            return self.failed(500, "the model failed on this request's inputs; see the server's log", error)

    def refuse_nonfinite(self, inputs: Any, outputs: Any) -> Any:
        """``outputs`` of one request, or a 422 naming its first input whose output holds a NaN or an infinity
        (JSON has no NaN: such an answer would read as ``null`` probabilities)."""
        rows = nonfinite_rows(outputs)
        if not rows:
            return outputs
        return Failed(422, f"inputs[{rows[0]}]: {nonfinite_message(self.trained.datamodule, inputs, rows[0])}")

    def infer(self, inputs: Any) -> Any:
        """Outputs of the model for decoded ``inputs`` (a batch of one request or several), on the CPU."""
        if isinstance(inputs, torch.Tensor):
            inputs = inputs.to(self.device)
        with torch.inference_mode():
            outputs = self.trained.model.infer(self.trained.predictor, inputs)
        return outputs.float().cpu() if isinstance(outputs, torch.Tensor) else outputs

    def encode_response(self, output: Any) -> Any:
        if isinstance(output, Failed):
            return output.response()  # FastAPI sends a Response as it is: this request's status only
        return self.trained.model.response(output, self.trained.class_names)

    def failed(self, status: int, detail: str, error: Exception) -> Failed:
        """Log one line for a request that failed here (and the traceback of a worker's first), and answer it."""
        self.failures += 1
        reason = cut(f"{type(error).__name__}: {error}")
        log.error("request failed with %d: %s", status, reason, exc_info=error if self.failures == 1 else None)
        return Failed(status, detail)


class BatchedPredictorAPI(PredictorAPI):
    """:class:`PredictorAPI` that runs concurrent requests as one batch (LitServe calls these hooks only
    when ``max_batch_size`` > 1; with 1 it hands ``predict`` one request's inputs).

    A batch whose run raises is run again request by request, so that only the request that raises
    fails (:meth:`PredictorAPI.predict`); a request whose decoding failed never joins a batch.
    """

    def batch(self, inputs: list[Any]) -> list[Any]:
        return inputs  # joined in predict, which can still split them when the batch fails

    def predict(self, parts: list[Any]) -> list[Any]:
        ready = [index for index, part in enumerate(parts) if not isinstance(part, Failed)]
        answers = list(parts)
        if not ready:
            return answers
        try:
            inputs, sizes = join([parts[index] for index in ready])
            outputs = split(self.infer(inputs), sizes)
            outputs = [self.refuse_nonfinite(parts[i], out) for i, out in zip(ready, outputs, strict=True)]
        except Exception:  # one request's inputs, most likely: find it by running each alone
            outputs = [super(BatchedPredictorAPI, self).predict(parts[index]) for index in ready]
        for index, output in zip(ready, outputs, strict=True):
            answers[index] = output
        return answers

    def unbatch(self, outputs: list[Any]) -> list[Any]:
        return outputs


def build_server(
    trained: Trained,
    max_batch_size: int = 64,
    batch_timeout: float = 0.005,
    max_inputs: int = 256,
    max_body_bytes: int = 1 << 20,
{%- if cookiecutter.task == "image-classification" %}
    max_image_pixels: int = 4096 * 4096,
    max_request_pixels: int = 4 * 4096 * 4096,
{%- endif %}
    body_timeout: float = 10.0,
    accelerator: str = "auto",
    workers_per_device: int = 1,
    timeout: float = 30.0,
    trust: Sequence[str] = (),
{%- if cookiecutter.task == "language-model" %}
    max_request_tokens: int = 1024,
{%- endif %}
) -> ls.LitServer:
    """A LitServer over ``trained`` (its checkpoint is loaded again in each worker).

    Args:
        max_batch_size: most requests run as one batch; ``batch_timeout`` seconds to wait for them.
        max_inputs: most examples in one request (more: 422).
        max_body_bytes: largest request body (more: 413).
{%- if cookiecutter.task == "image-classification" %}
        max_image_pixels: most pixels of an image file in a request, read from its header (more: 422).
        max_request_pixels: most pixels of all the image files of one request together (more: 422):
            bounds the decoding one request costs the worker, however small its body.
{%- endif %}
        body_timeout: seconds a request body may take to arrive after its headers (then 408).
        accelerator: "auto", "cpu" or "cuda"; ``workers_per_device`` model copies per device.
        timeout: seconds a request may wait for its answer (then 504).
        trust: modules besides the project's that the checkpoint may name (engine.inference).
{%- if cookiecutter.task == "language-model" %}
        max_request_tokens: a language model's most new tokens per request, prompts x its
            ``served_new_tokens`` (more: 422): bounds the time one request holds a worker.
{%- endif %}
    """
    limits: dict[str, Any] = dict(max_inputs=max_inputs)
{%- if cookiecutter.task == "image-classification" %}
    limits.update(max_image_pixels=max_image_pixels, max_request_pixels=max_request_pixels)
{%- endif %}
{%- if cookiecutter.task == "language-model" %}
    limits.update(new_tokens=trained.model.served_new_tokens, max_request_tokens=max_request_tokens)
{%- endif %}
    schema = {**trained.datamodule.request_schema(), **limits}
    os.environ[SCHEMA_VARIABLE] = json.dumps(schema)  # read by the HTTP processes, which start after this
    api_class = BatchedPredictorAPI if max_batch_size > 1 else PredictorAPI
    workers = workers_per_device  # on the CPU, the one device (cpu_threads: GPU workers keep torch's default)
    api = api_class(trained.checkpoint, max_batch_size, batch_timeout, trust, workers)
    server = ls.LitServer(
        api,
        accelerator=accelerator,
        workers_per_device=workers_per_device,
        timeout=timeout,
        middlewares=[body_limits(max_body_bytes, max_inputs, body_timeout)],
    )
    server.app.add_exception_handler(RequestValidationError, refuse_request)
    return server


def cpu_threads(workers: int, http_processes: int = 1) -> int | None:
    """torch's intra-op threads for each of ``workers`` model processes on the CPU: the cores this process may
    run on, less one for each HTTP process, shared among the workers (at least 1); None where
    ``OMP_NUM_THREADS`` is set (the user's choice, which torch reads itself).

    An op's OpenMP threads wait for one another: a worker with a thread on every core loses the ones the HTTP
    process takes, at every op. On 2 cores the byte GPT served 16 streams 1.4x faster with 1 thread than with
    2 (the template's docs/benchmarks.md)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, (cores - http_processes) // max(1, workers))


def body_limits(max_body_bytes: int, max_files: int, body_timeout: float) -> tuple[type, dict[str, Any]]:
    """The LitServe middleware that reads bodies as JSON within ``max_body_bytes`` and ``body_timeout``
    (:class:`JSONBodyMiddleware`), for ``LitServer(middlewares=[...])``."""
    return JSONBodyMiddleware, {"max_body_bytes": max_body_bytes, "max_files": max_files, "body_timeout": body_timeout}


def load_in_worker(checkpoint: Path, device: str, trust: Sequence[str], workers: int = 1) -> Trained:
    """The checkpoint's model on ``device``, in a LitServe worker (``LitAPI.setup``), one of ``workers``;
    on the CPU with torch's intra-op threads set by :func:`cpu_threads`.

    Ctrl-C reaches every process of the terminal's group: the main process stops this worker
    (SIGTERM) as it shuts down, so the worker ignores the interrupt instead of printing a
    KeyboardInterrupt traceback from inside LitServe's queue.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if device == "cpu" and (threads := cpu_threads(workers)) is not None:
        torch.set_num_threads(threads)
    trained = load_trained(checkpoint, map_location=device, trust=trust)
    trained.predictor.to(device)
    return trained
