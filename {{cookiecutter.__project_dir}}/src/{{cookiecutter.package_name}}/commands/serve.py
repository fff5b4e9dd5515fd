"""``make serve``: the trained model behind an HTTP API (LitServe) on this machine.

    python -m {{ cookiecutter.package_name }}.commands.serve --port 8000                 # 127.0.0.1 only
    python -m {{ cookiecutter.package_name }}.commands.serve --host 0.0.0.0 --port 8000  # every interface: put auth in front

    curl -s localhost:8000/health
{%- if cookiecutter.task == "language-model" %}
    curl -sN localhost:8000/v1/chat/completions -d '{"messages": [...], "stream": true}'
    curl -s localhost:8000/predict -d '{"inputs": [...]}'                   # --api predict

The language model speaks the OpenAI API (:mod:`serving.openai_api`) unless ``--api predict``, which
answers ``POST /predict`` (:mod:`serving.api`, the requests it takes and refuses).
{%- else %}
    curl -s localhost:8000/predict -d '{"inputs": [...]}'

The model answers ``POST /predict`` (:mod:`serving.api`, the requests it takes and refuses).
{%- endif %}
Ctrl-C stops it; from a script, start it in its own process group (``setsid``,
``start_new_session=True``) and send SIGTERM to the group: LitServe's worker processes stop with
it and the port is freed.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from jsonargparse import auto_cli

from {{ cookiecutter.package_name }}.engine import (
    ConfigError,
    LaunchError,
    best_checkpoint,
    exit_on_user_error,
    load_trained,
    silence_dependency_noise,
    trusted_modules,
)
from {{ cookiecutter.package_name }}.engine.export import require
{%- if cookiecutter.task == "language-model" %}

MAX_REQUEST_TOKENS = 1024  # 16 prompts of 64 new tokens: a request holds a worker for seconds, not minutes
{%- endif %}


def serve(
    ckpt: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 64,
    batch_timeout: float = 0.005,
    max_inputs: int = 256,
    max_body_bytes: int = 1 << 20,
{%- if cookiecutter.task == "image-classification" %}
    max_image_pixels: int = 4096 * 4096,
    max_request_pixels: int = 4 * 4096 * 4096,
{%- endif %}
    body_timeout: float = 10.0,
    header_timeout: float = 10.0,
    max_client_connections: int = 64,
    timeout: float = 30.0,
    accelerator: str = "auto",
    workers_per_device: int = 1,
    trust: str | None = None,
{%- if cookiecutter.task == "language-model" %}
    api: Literal["auto", "openai", "predict"] = "auto",
    max_tokens: int = 256,
    model_name: str | None = None,
    max_request_tokens: int = MAX_REQUEST_TOKENS,
    stream_interval: float = 0.01,
{%- else %}
    api: Literal["auto", "predict"] = "auto",
{%- endif %}
) -> None:
    """Serve checkpoint ``ckpt`` until stopped.

    Args:
        ckpt: the checkpoint; default the best of the latest run under logs/.
        host: interface to listen on; 127.0.0.1 (default) takes connections from this machine only.
        port: TCP port.
        max_batch_size: most concurrent requests run as one batch; for the OpenAI API, the most answers a
            worker generates at once, one forward pass a step for all (further requests wait for a place).
        batch_timeout: seconds a request waits for others to join its batch.
        max_inputs: most examples in one request (more: HTTP 422).
        max_body_bytes: largest request body in bytes (more: HTTP 413).
{%- if cookiecutter.task == "image-classification" %}
        max_image_pixels: most pixels of an image file in a request (image-folder models), read
            from its header before anything is decoded (more: HTTP 422).
        max_request_pixels: most pixels of all the image files of one request together, read from
            their headers (more: HTTP 422): what one request may cost the worker to decode.
{%- endif %}
        body_timeout: seconds a request's body may take to arrive after its headers (later: HTTP 408,
            connection closed), so slow clients cannot hold connections open.
        header_timeout: seconds a request's headers may take to arrive (later: HTTP 408, connection
            closed), however steadily they trickle in (:mod:`serving.connections`).
        max_client_connections: connections one client address may hold at once (more: HTTP 503 at
            once), so one client cannot spend the server's file descriptors; behind a reverse proxy,
            whose address every request has, raise it or give 0 (no bound).
        timeout: LitServe's request timeout in seconds (``LitServer(timeout=...)``); must be longer
            than ``batch_timeout``. For the OpenAI API: the seconds a generating worker may go without a
            step before ``/health`` answers 503.
        accelerator: "auto" (CUDA when available), "cpu" or "cuda".
        workers_per_device: model copies per device, each its own process.
        trust: modules besides this project's package whose classes the checkpoint may name,
            comma-separated (an own DataModule or net kept elsewhere); only for checkpoints you trust.
{%- if cookiecutter.task == "language-model" %}
        api: "openai" (``/v1/chat/completions``, ``/v1/models``), "predict" (``POST /predict`` with
            ``{"inputs": [...]}``: greedy continuations), or "auto": openai.
        max_tokens: the most new tokens one OpenAI request may ask for, and its default (more: HTTP 422).
        model_name: the ``model`` OpenAI clients name; default the project's name.
        max_request_tokens: on ``/predict``: the most new tokens one request may cost, prompts x the
            model's new tokens per prompt (64; more: HTTP 422).
        stream_interval: OpenAI API: the seconds of an answer's tokens one streamed piece may gather (0: a
            piece per token): fewer, larger pieces cost the server and its clients less CPU per token.
{%- else %}
        api: "predict" (``POST /predict`` with ``{"inputs": [...]}``), the one API of this model ("auto").
{%- endif %}

    Raises:
        FileNotFoundError: no checkpoint found or given.
{%- if cookiecutter.task == "language-model" %}
        engine.errors.ConfigError: ``timeout`` is not longer than ``batch_timeout``; ``header_timeout``
            not positive; ``max_client_connections`` negative; ``max_tokens`` below 1;
            ``max_request_tokens`` below the model's new tokens per prompt; ``stream_interval`` outside
            [0, 1].
{%- else %}
        engine.errors.ConfigError: ``timeout`` is not longer than ``batch_timeout``; ``header_timeout``
            not positive; ``max_client_connections`` negative.
{%- endif %}
        engine.errors.LaunchError: ``host:port`` is taken or not an address of this machine.
    """
    if timeout <= batch_timeout:  # LitServe raises a bare ValueError for it, after the model is loaded
        raise ConfigError(
            f"--timeout ({timeout:g} s) must be longer than --batch_timeout ({batch_timeout:g} s): "
            "a request waits that long for others to join its batch before it runs"
        )
{%- if cookiecutter.task == "language-model" %}
    if max_tokens < 1:
        raise ConfigError(f"--max_tokens must be at least 1, got {max_tokens}")
    if not 0 <= stream_interval <= 1:
        raise ConfigError(f"--stream_interval must be in [0, 1] seconds, got {stream_interval:g}")
{%- endif %}
    check_address(host, port)  # before loading anything: uvicorn would only say so after the model is up
    require("litserve")
    from {{ cookiecutter.package_name }}.serving.connections import bounded_connections

    try:
        http = bounded_connections(header_timeout, max_client_connections)
    except ValueError as error:
        raise ConfigError(f"--{error}") from None
    from {{ cookiecutter.package_name }}.serving.api import {% if cookiecutter.task == "language-model" %}body_limits, {% endif %}build_server, describe_request

    path = Path(ckpt) if ckpt is not None else best_checkpoint("logs")
    trained = load_trained(path, trust=trusted_modules(trust))  # no data read: the checkpoint is enough
{%- if cookiecutter.task == "language-model" %}
    if api != "predict":
        from {{ cookiecutter.package_name }}.serving.openai_api import build_chat_server

        name = model_name or "{{ cookiecutter.project_slug }}"
        server = build_chat_server(
            trained,
            name,
            max_tokens=max_tokens,
            accelerator=accelerator,
            workers_per_device=workers_per_device,
            timeout=timeout,
            middlewares=[body_limits(max_body_bytes, max_inputs, body_timeout)],
            trust=trusted_modules(trust),
            max_batch_size=max_batch_size,
            stream_interval=stream_interval,
        )
        print(
            f"Serving {path} as {name!r} on http://{host}:{port}: the OpenAI API, POST /v1/chat/completions and "
            f"/v1/completions (up to {max_tokens} new tokens), GET /v1/models; GET /health",
            flush=True,
        )
        server.run(host=host, port=port, generate_client_file=False, http=http)
        return
    new_tokens = trained.model.served_new_tokens  # per prompt
    if max_request_tokens < new_tokens:
        raise ConfigError(
            f"--max_request_tokens ({max_request_tokens}) is below the {new_tokens} new tokens of one prompt: "
            "every request would be refused; give at least that"
        )
{%- endif %}
    server = build_server(
        trained,
        max_batch_size=max_batch_size,
        batch_timeout=batch_timeout,
        max_inputs=max_inputs,
        max_body_bytes=max_body_bytes,
{%- if cookiecutter.task == "image-classification" %}
        max_image_pixels=max_image_pixels,
        max_request_pixels=max_request_pixels,
{%- endif %}
        body_timeout=body_timeout,
        timeout=timeout,
        accelerator=accelerator,
        workers_per_device=workers_per_device,
        trust=trusted_modules(trust),
{%- if cookiecutter.task == "language-model" %}
        max_request_tokens=max_request_tokens,
{%- endif %}
    )
{%- if cookiecutter.task == "language-model" %}
    request = describe_request(trained.datamodule, min(max_inputs, max_request_tokens // new_tokens))
{%- else %}
    request = describe_request(trained.datamodule, max_inputs)
{%- endif %}
    print(f"Serving {path} on http://{host}:{port}: POST /predict {request}; GET /health", flush=True)
    server.run(host=host, port=port, generate_client_file=False, http=http)


def check_address(host: str, port: int) -> None:
    """Raise :class:`LaunchError` unless a server can listen on ``host:port`` (bound as uvicorn binds it)."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, OverflowError) as error:  # OverflowError: a port outside 0-65535
        reason = getattr(error, "strerror", None) or str(error)
        raise LaunchError(
            f"cannot listen on {host}:{port} ({reason}): stop what listens there or choose another PORT= "
            "(HOST= must be an address of this machine)"
        ) from None


@contextlib.contextmanager
def local_server(
    checkpoint: Path, options: list[str], log: Path | None = None, start_seconds: float = 180
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``make serve`` over ``checkpoint`` (with ``options``) in a process of its own on a free loopback port:
    yields its base URL (``http://127.0.0.1:PORT``) and process once ``/health`` answers 200, then stops it
    (SIGTERM to its process group: LitServe's workers stop with it). Its output goes to ``log`` (or nowhere).

    Raises:
        engine.errors.LaunchError: the server exited before it answered (with ``log``'s last line), or was not
            healthy within ``start_seconds``.
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}.commands.serve", "--ckpt", str(checkpoint)]
    command += ["--host=127.0.0.1", f"--port={port}", *options]
    with contextlib.ExitStack() as stack:
        output: IO | int = stack.enter_context(log.open("w")) if log is not None else subprocess.DEVNULL
        server = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + start_seconds
            while not _healthy(base):
                if server.poll() is not None:
                    last = log.read_text(errors="replace").strip().splitlines()[-1:] if log is not None else []
                    said = f": {last[0]} ({log})" if last else ""
                    raise LaunchError(f"the server exited with status {server.returncode} before it answered{said}")
                if time.monotonic() > deadline:
                    raise LaunchError(f"the server at {base} was not healthy within {start_seconds:g} s")
                time.sleep(0.25)
            yield base, server
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    with exit_on_user_error("serve"):  # a missing checkpoint or package: one line, exit 2
        auto_cli(serve, args=args)


if __name__ == "__main__":
    main()
