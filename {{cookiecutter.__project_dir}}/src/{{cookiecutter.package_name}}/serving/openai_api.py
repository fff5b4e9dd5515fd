"""The OpenAI API over a trained language model, built on LitServe's ``OpenAISpec``.

https://platform.openai.com/docs/api-reference/chat and https://lightning.ai/docs/litserve

- ``POST /v1/chat/completions``: ``messages``, ``max_tokens`` (or ``max_completion_tokens``),
  ``temperature`` (0: greedy), ``top_p``, ``stop`` (up to 16 strings), ``seed``, ``stream``
  (server-sent events, ending ``data: [DONE]``; an event holds the text the worker gathered in
  ``stream_interval`` and, when the HTTP process is behind, every piece waiting for it); the answer
  carries ``usage`` (prompt and completion tokens) and ``finish_reason`` (``"stop"`` or ``"length"``).
- ``POST /v1/completions``: ``prompt`` (text, texts, token ids), ``max_tokens`` (0: none, with ``echo``
  the prompt's scores alone), ``echo``, ``logprobs`` (each token's log-probability and the k likeliest),
  ``temperature``, ``top_p``, ``stop``, ``seed``, ``stream``; and ``POST /tokenize``, ``POST /detokenize``,
  ``GET /tokenizer_info`` (vLLM's), through which lm-evaluation-harness tokenizes with this model's
  tokenizer (``serving.completions``).
- ``GET /v1/models`` and ``GET /v1/models/{model}``: the one model served, by the name ``--model_name`` gives it.
- A request is checked in the HTTP process, before it reaches the model: an unknown model (404),
  a value out of its range or a field this server does not implement (``tools``, ``n`` above 1,
  penalties, ``logprobs``: 400), a conversation longer than the model's context (400), or more new
  tokens than the server's ``max_tokens`` (422). Each answer is in the OpenAI error shape,
  ``{"error": {"message", "type", "param", "code"} }``, its message one line naming the field.
- A client that disconnects, streaming or waiting for the whole answer, stops its generation at the
  worker's next step (the HTTP process tells the worker through a shared dictionary), so the worker
  takes the next request. Prompts are tokenized (and chat templates rendered) in a thread, within
  ``PREPARE_TIMEOUT_S``: ``/health`` and other clients are answered meanwhile.
- ``/health`` answers 503 while a worker has generated nothing for ``stuck_after`` seconds in a
  request (a stuck model, not a long answer: each token counts as progress).

A worker generates up to ``max_batch_size`` answers at once (LitServe's continuous batching loop:
iteration-level scheduling, Yu et al., "Orca", OSDI 2022), with one forward pass of the net per step
for all of them (:class:`serving.batching.DecodeBatch`: a key/value cache row per answer): a request
that arrives while others stream is prefilled and joins at the next step, so a short answer is not
held behind a long one, and a worker's tokens/s grow with its answers. Requests beyond
``max_batch_size`` wait for a free place. The work of a request is bounded by ``max_tokens`` new
tokens and the model's context. The model side is the task module's contract: ``chat_template()``
(conversation -> prompt ids, picklable), ``context_size``, and ``chat_answer(...)`` (how an answer's
tokens are chosen and become text, see ``models.LanguageModel``).
"""

import asyncio
import contextlib
import json
import logging
import multiprocessing
import pickle
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from dataclasses import field as default
from pathlib import Path
from typing import Any

import litserve as ls
import torch
from fastapi import BackgroundTasks, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from litserve.loops.continuous_batching_loop import ContinuousBatchingLoop, Output
from litserve.specs.openai import ChatCompletionRequest, ChatCompletionResponse
from litserve.utils import LitAPIStatus, LoopResponseType, ResponseBufferItem
from pydantic import ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from {{ cookiecutter.package_name }}.engine import Trained
from {{ cookiecutter.package_name }}.models.language_model import Piece
from {{ cookiecutter.package_name }}.serving.api import load_in_worker
from {{ cookiecutter.package_name }}.serving.batching import DecodeBatch
from {{ cookiecutter.package_name }}.serving.completions import (
    MAX_LOGPROBS,
    MAX_PROMPTS,
    ChoiceText,
    CompletionItem,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    end_of_text,
)

log = logging.getLogger(__name__)
REQUEST_ID = "request_id"  # the key in a request's ``metadata`` that names it to the worker
MAX_STOPS = 16  # the OpenAI API allows 4; lm-evaluation-harness tasks send more (8 punctuation marks)
MAX_STOP_CHARS = 256
MAX_MESSAGE_CHARS = 500  # an error names the problem; it never echoes a large input back
# Fields refused by name whatever their shape: a malformed one is "not implemented" too, not a schema error.
REFUSED_FIELDS = ("tools", "tool_choice", "functions", "function_call", "response_format")
IDLE_WAIT_S = 1.0  # an idle worker's wait for a request, between LitServe's own checks
PREFILL_WAIT_S = 0.02  # the longest a request waiting for a place stays out of one that is free
# The longest a step waits for the prefill task to put in a request taken from the queue during it: that takes
# a turn or two of the event loop; the bound is for a reader thread that stalls.
TAKE_WAIT_S = 0.1
# A streamed piece gathers up to this long of an answer's tokens (the template's docs/benchmarks.md).
STREAM_INTERVAL_S = 0.01
PREPARE_TIMEOUT_S = 10.0  # the longest the HTTP process tokenizes (and renders) one request's prompts
STEP_UID = "step-outputs"  # the response buffer's key of the workers' step messages (LitServe's uids are UUIDs)


class OpenAIError(Exception):
    """A refused request: ``status``, and the OpenAI error body's ``message``, ``param`` and ``type``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        code = "model_not_found" if self.status == 404 and self.param == "model" else None
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": code}
        body = {"error": error}
        return JSONResponse(body, status_code=self.status)


async def openai_error(request: Request, error: OpenAIError) -> JSONResponse:
    return error.response()


async def invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
    """FastAPI's refusal of a body that does not parse as a chat request, as one OpenAI error line."""
    problem = error.errors()[0]
    where = ".".join(str(part) for part in problem.get("loc", ())[1:]) or "body"
    if problem.get("type") == "json_invalid":  # loc holds the character offset, not a field
        message = f"body: not valid JSON ({problem.get('ctx', {}).get('error', '')})"
        return OpenAIError(400, message[:MAX_MESSAGE_CHARS], None).response()
    field = where.split(".")[0]
    if field in REFUSED_FIELDS:  # refused by name whatever its shape (a tool without a description)
        return OpenAIError(400, f"{field}: not implemented by this server; leave it out", field).response()
    elif field == "prompt":  # pydantic names the first shape of the union it tried: say them all
        message = "prompt: a string, a list of strings, a list of token ids, or a list of lists of token ids"
        return OpenAIError(400, message, field).response()
    elif problem.get("type") == "extra_forbidden":
        message = f"{where}: not a field this server implements; leave it out"
    else:
        message = f"{where}: {problem.get('msg', '')}"
    return OpenAIError(400, message[:MAX_MESSAGE_CHARS], where).response()


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """LitServe's and the body limits' HTTP errors (413, 408, 504, 500) in the OpenAI error shape; an unknown
    route is OpenAI's ``Invalid URL (METHOD /path)``, not an unknown model."""
    kind = "invalid_request_error" if error.status_code < 500 else "server_error"
    detail = str(error.detail)
    if error.status_code in (404, 405) and detail in ("Not Found", "Method Not Allowed"):
        detail = f"Invalid URL ({request.method} {request.url.path[:200]})"
    return OpenAIError(error.status_code, detail[:MAX_MESSAGE_CHARS], None, kind).response()


class ChatRequest(ChatCompletionRequest):
    """LitServe's request with the fields it leaves out (``seed``, and those refused by name), unknown ones refused."""

    model_config = ConfigDict(extra="forbid")
    seed: int | None = None
    stream_options: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    logit_bias: dict[str, float] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None


class ChatSpec(ls.OpenAISpec):
    """LitServe's ``OpenAISpec`` with the request checked before it is queued, ``/v1/models``, the true
    ``finish_reason``, and a client's disconnect passed on to the worker.

    Args:
        model_name: the name clients send as ``model`` (and ``/v1/models`` lists).
        template: the model's chat template (``chat_template()``): counts a conversation's tokens here.
        context: the most prompt tokens the model reads.
        max_tokens: the most new tokens one request may ask for (and the default when it names none).
        cancelled: the requests whose clients are gone, shared with the workers.
    """

    def __init__(
        self, model_name: str, template: Any, context: int, max_tokens: int, cancelled: "Cancellations"
    ) -> None:
        super().__init__()
        self.model_name, self.template, self.context = model_name, template, context
        self.max_tokens, self.cancelled = max_tokens, cancelled

    def pre_setup(self, lit_api: ls.LitAPI) -> None:
        super().pre_setup(lit_api)
        self.add_endpoint("/v1/models", self.list_models, ["GET"])
        self.add_endpoint("/v1/models/{model}", self.retrieve_model, ["GET"])
        self.add_endpoint("/v1/completions", self.completion, ["POST"])
        self.add_endpoint("/tokenize", self.tokenize, ["POST"])
        self.add_endpoint("/detokenize", self.detokenize, ["POST"])
        self.add_endpoint("/tokenizer_info", self.tokenizer_info, ["GET"])

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "torch-template"}

    async def list_models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.model_card()]}

    async def retrieve_model(self, model: str) -> dict[str, Any]:
        """``GET /v1/models/{model}``: the served model's card (``client.models.retrieve``), else 404."""
        self.check_model(model)
        return self.model_card()

    def check_model(self, model: str | None) -> None:
        if model and model != self.model_name:
            served = f"this server serves {self.model_name!r}"
            raise OpenAIError(404, f"model: {model[:100]!r} is not served here; {served}", "model")

    async def chat_completion(self, request: ChatRequest, background_tasks: BackgroundTasks, http: Request):
        await off_the_loop(self.check, request)
        request_id = uuid.uuid4().hex
        request.metadata = {**(request.metadata or {}), REQUEST_ID: request_id}
        request.model = self.model_name  # what every answer names
        request.max_tokens = request.max_completion_tokens or request.max_tokens or self.max_tokens
        self.listen_to_steps()
        answer = super().chat_completion(request, background_tasks)
        if request.stream:  # Starlette ends a stream whose client is gone: streaming_completion tells the worker
            return await answer
        return await unless_gone(http, answer, lambda: self.cancelled.add(request_id))

    def listen_to_steps(self) -> None:
        """Put :class:`StepOutputs` in this HTTP process's response buffer, once, before its first request is
        queued: the workers send each step's outputs there (:meth:`StepLoop.send_step`)."""
        if STEP_UID not in self.response_buffer:
            step_outputs = StepOutputs(self.response_buffer)
            self.response_buffer[STEP_UID] = ResponseBufferItem(response_queue=step_outputs, event=asyncio.Event())

    def check(self, request: ChatRequest) -> None:
        """Raise :class:`OpenAIError` naming the first field of ``request`` this server cannot honour."""
        self.check_model(request.model)
        refuse_unless_neutral(
            {
                "n": request.n not in (None, 1),
                "tools": bool(request.tools),
                "response_format": request.response_format is not None and request.response_format.type != "text",
                "presence_penalty": bool(request.presence_penalty),
                "frequency_penalty": bool(request.frequency_penalty),
                "logprobs": bool(request.logprobs or request.top_logprobs),
                "logit_bias": bool(request.logit_bias),
            }
        )
        for field in ("max_tokens", "max_completion_tokens"):
            self.check_max_tokens(field, getattr(request, field), least=1)
        self.check_sampling(request)
        try:
            count = len(self.template.ids(messages_of(request)))
        except ValueError as error:
            raise OpenAIError(400, str(error), "messages") from None
        if count > self.context:
            message = f"messages: the conversation is {count} tokens; the model reads at most {self.context}"
            raise OpenAIError(400, message + ": shorten it", "messages")

    def check_max_tokens(self, field: str, value: int | None, least: int) -> None:
        if value is not None and value < least:
            raise OpenAIError(400, f"{field} must be at least {least}, got {value}", field)
        if value is not None and value > self.max_tokens:
            limit = f"this server's limit of {self.max_tokens} new tokens (--max_tokens)"
            raise OpenAIError(422, f"{field}={value} is over {limit}", field)

    def check_sampling(self, request: ChatRequest | CompletionRequest) -> None:
        """Refuse a ``temperature``, ``top_p``, ``seed`` or ``stop`` out of its range."""
        if request.temperature is not None and not 0 <= request.temperature <= 2:
            raise OpenAIError(400, f"temperature must be in [0, 2], got {request.temperature}", "temperature")
        if request.top_p is not None and not 0 < request.top_p <= 1:
            raise OpenAIError(400, f"top_p must be in (0, 1], got {request.top_p}", "top_p")
        if request.seed is not None and not -(2**63) <= request.seed < 2**64:  # what torch.manual_seed takes
            raise OpenAIError(400, f"seed must be in [-2**63, 2**64 - 1], got {request.seed}", "seed")
        stops = stop_strings(request.stop)
        # Each token is checked against every start of every stop string: a long one is cheap to send, costly to serve.
        if len(stops) > MAX_STOPS or not all(0 < len(stop) <= MAX_STOP_CHARS for stop in stops):
            limit = f"up to {MAX_STOPS} strings of 1 to {MAX_STOP_CHARS} characters"
            raise OpenAIError(400, f"stop: {limit}, got {str(request.stop)[:80]!r}", "stop")

    async def get_from_queues(self, uids: list) -> list["Pieces"]:
        """Each answer's outputs as :class:`Pieces` (LitServe's ``chat_completion`` has just made their queues)."""
        return [Pieces(outputs, event) for outputs, event in zip(self.queues, self.events, strict=True)]

    async def streaming_completion(self, request: ChatRequest, pipe_responses: list["Pieces"]) -> AsyncIterator[str]:
        """The answer's server-sent events: a chunk of the text of every piece waiting for it, then one with the
        ``finish_reason`` and ``usage``, then [DONE]; a failure in the model as the stream's last event.

        Written here as JSON, as :meth:`streamed_completion` writes a completion's: LitServe's ``OpenAISpec``
        built four pydantic models for every chunk, and its chunks named neither the answer's id nor the true
        finish reason. An HTTP process behind its streams sends each what gathered meanwhile as one event, so
        under load there are fewer events to write and parse, and none waits when there is no load."""
        (pipe,) = pipe_responses  # n is 1 (check)
        head = {"id": f"chatcmpl-{request.metadata[REQUEST_ID]}", "object": "chat.completion.chunk"}
        head |= {"created": int(time.time()), "model": request.model}
        ended, last = False, {}
        try:
            async for batch in pipe.batches():
                pieces = [decoded(*item) for item in batch if item[1] != LitAPIStatus.ERROR]
                last = pieces[-1] if pieces else last
                text = "".join(piece["content"] or "" for piece in pieces)
                if text:
                    choice = {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": None}
                    yield sent({**head, "choices": [choice]})
                if len(pieces) < len(batch):  # the text before it sent, the model's failure
                    decoded(*batch[-1])
            usage = {key: last.get(key, 0) for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
            choice = {"index": 0, "delta": {}, "finish_reason": last.get("finish_reason") or "stop"}
            ended = True
            yield sent({**head, "choices": [choice], "usage": usage})
        except OpenAIError as error:  # the model failed: the stream has begun, so the error is its last event
            ended, failed = True, {"message": error.message, "type": error.kind}
            yield sent({"error": failed})
        finally:  # the client went away (Starlette cancels the stream): the worker stops the answer
            if not ended:
                self.cancelled.add(request.metadata[REQUEST_ID])
        yield "data: [DONE]\n\n"

    def encode_response(self, output: Any, context_kwargs: dict | None = None) -> Any:
        """One step's output of one answer (LitServe's continuous loop sends them one at a time); a
        completion's piece as the worker made it."""
        if isinstance(output, Exception) or (isinstance(output, dict) and "scores" in output):
            return output
        return self._encode_response(output)

    async def non_streaming_completion(self, request: ChatRequest, generator_list: list) -> ChatCompletionResponse:
        finish: dict[int, str] = {}
        pipes = [finish_reasons(pipe, finish, index) for index, pipe in enumerate(generator_list)]
        response = await super().non_streaming_completion(request, pipes)
        response.id = f"chatcmpl-{request.metadata[REQUEST_ID]}"
        for choice in response.choices:
            choice.finish_reason = finish.get(choice.index, choice.finish_reason)
        return response

    # ---- /v1/completions and the tokenizer (serving/completions.py) ---------------------------------
    async def completion(self, request: CompletionRequest, background_tasks: BackgroundTasks, http: Request) -> Any:
        """``POST /v1/completions``: each prompt an answer of the worker's batch, a choice of the response."""
        prompts = await off_the_loop(self.check_completion, request)
        request_id = uuid.uuid4().hex
        items = [
            CompletionItem(
                request_id=f"{request_id}-{index}",
                ids=ids,
                max_tokens=self.max_tokens if request.max_tokens is None else request.max_tokens,
                temperature=1.0 if request.temperature is None else request.temperature,
                top_p=1.0 if request.top_p is None else request.top_p,
                stop=stop_strings(request.stop),
                seed=request.seed,
                logprobs=request.logprobs,
                echo=request.echo,
            )
            for index, ids in enumerate(prompts)
        ]
        tokenizer = self.template.tokenizer
        choices = [ChoiceText(i, tokenizer, item.ids, item.echo, item.logprobs) for i, item in enumerate(items)]
        pipes = [self.enqueue(item) for item in items]
        head = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time())}
        head["model"] = self.model_name
        if request.stream:
            usage = bool((request.stream_options or {}).get("include_usage"))
            events = self.streamed_completion(head, items, choices, pipes, usage)
            return StreamingResponse(events, media_type="text/event-stream", background=background_tasks)
        return await unless_gone(http, self.whole_completion(head, items, choices, pipes), lambda: self.stop(items))

    async def whole_completion(
        self, head: dict[str, Any], items: list[CompletionItem], choices: list[ChoiceText], pipes: list
    ) -> dict[str, Any]:
        """The response of a completion not streamed: every choice whole, and the usage."""
        pieces: list[list[dict[str, Any]]] = []
        try:
            for choice, pipe in zip(choices, pipes, strict=True):
                pieces.append([choice.piece(output) async for output in worker_outputs(pipe)])
        except OpenAIError:  # a prompt failed in the model: the request's other prompts stop at the next step
            self.stop(items[len(pieces) + 1 :])
            raise
        return {**head, "choices": [ChoiceText.merged(choice) for choice in pieces], "usage": usage_of(choices)}

    def stop(self, items: list[CompletionItem]) -> None:
        """Tell the workers that nobody waits for ``items`` any more: each stops at its next step."""
        for item in items:
            self.cancelled.add(item.request_id)

    def enqueue(self, item: CompletionItem) -> AsyncIterator:
        """Put ``item`` in the workers' queue (as ``OpenAISpec.chat_completion`` does a chat request): its outputs."""
        self.listen_to_steps()
        uid, outputs, event = uuid.uuid4(), deque(), asyncio.Event()
        self.response_buffer[uid] = ResponseBufferItem(response_queue=outputs, event=event)
        self.request_queue.put((self.response_queue_id, uid, time.monotonic(), item))
        return self.data_streamer(outputs, event, send_status=True)

    async def streamed_completion(
        self, head: dict[str, Any], items: list[CompletionItem], choices: list[ChoiceText], pipes: list, usage: bool
    ) -> AsyncIterator[str]:
        """Server-sent events of each choice's pieces (choice after choice, each decoded meanwhile), the usage
        when ``stream_options.include_usage`` asked for it, then [DONE]."""
        done = 0  # choices streamed whole
        try:
            for choice, pipe in zip(choices, pipes, strict=True):
                async for output in worker_outputs(pipe):
                    yield sent({**head, "choices": [choice.piece(output)]})
                done += 1
            if usage:
                yield sent({**head, "choices": [], "usage": usage_of(choices)})
        except OpenAIError as error:  # the model failed: the stream has begun, so the error is its last event
            failed = {"message": error.message, "type": error.kind}
            yield sent({"error": failed})
            self.stop(items[done + 1 :])
            done = len(items)
        finally:  # the client went away: every prompt's answer not sent whole stops at its worker's next step
            self.stop(items[done:])
        yield "data: [DONE]\n\n"

    def check_completion(self, request: CompletionRequest) -> list[list[int]]:
        """The prompts of ``request`` as token ids, each within the context.

        Raises:
            OpenAIError: names the first field this server cannot honour.
        """
        self.check_model(request.model)
        refuse_unless_neutral(
            {
                "n": request.n not in (None, 1),
                "best_of": request.best_of not in (None, 1),
                "suffix": bool(request.suffix),
                "presence_penalty": bool(request.presence_penalty),
                "frequency_penalty": bool(request.frequency_penalty),
                "logit_bias": bool(request.logit_bias),
            }
        )
        self.check_max_tokens("max_tokens", request.max_tokens, least=0)
        if request.logprobs is not None and not 0 <= request.logprobs <= MAX_LOGPROBS:
            raise OpenAIError(400, f"logprobs must be in [0, {MAX_LOGPROBS}], got {request.logprobs}", "logprobs")
        self.check_sampling(request)
        prompt = request.prompt
        prompts = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else prompt
        if not prompts or len(prompts) > MAX_PROMPTS:
            raise OpenAIError(400, f"prompt: 1 to {MAX_PROMPTS} prompts, got {len(prompts)}", "prompt")
        tokenizer, found = self.template.tokenizer, []
        for index, given in enumerate(prompts):
            where = "prompt" if len(prompts) == 1 else f"prompt[{index}]"
            ids = tokenizer.encode(given) if isinstance(given, str) else list(given)
            if not ids:
                raise OpenAIError(400, f"{where} is empty: send at least one token", "prompt")
            if not all(0 <= token < tokenizer.vocab_size for token in ids):
                bad = next(token for token in ids if not 0 <= token < tokenizer.vocab_size)
                message = f"{where}: token id {bad} is outside the vocabulary [0, {tokenizer.vocab_size})"
                raise OpenAIError(400, message, "prompt")
            if len(ids) > self.context:
                message = f"{where} is {len(ids)} tokens; the model reads at most {self.context}: shorten it"
                raise OpenAIError(400, message, "prompt")
            found.append(ids)
        return found

    async def tokenize(self, request: TokenizeRequest) -> dict[str, Any]:
        """``POST /tokenize``: ``{"tokens", "count", "max_model_len"}`` of ``prompt`` (no special token added)."""
        self.check_model(request.model)
        tokens = await off_the_loop(self.template.tokenizer.encode, request.prompt)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": self.context}

    async def detokenize(self, request: DetokenizeRequest) -> dict[str, Any]:
        """``POST /detokenize``: ``{"prompt"}``, the text of ``tokens``."""
        self.check_model(request.model)
        size = self.template.tokenizer.vocab_size
        if not all(0 <= token < size for token in request.tokens):
            raise OpenAIError(400, f"tokens: ids must be in [0, {size})", "tokens")
        return {"prompt": self.template.tokenizer.decode(request.tokens)}

    async def tokenizer_info(self) -> dict[str, Any]:
        """``GET /tokenizer_info``: the end-of-text token's text (None when no text encodes to it), the context."""
        tokenizer = self.template.tokenizer
        kind = type(tokenizer).__name__
        info = {"eos_token": end_of_text(tokenizer), "bos_token": None, "pad_token": None}
        return {**info, "model_max_length": self.context, "vocab_size": tokenizer.vocab_size, "tokenizer_class": kind}


async def off_the_loop(work: Callable[..., Any], *args: Any) -> Any:
    """``work(*args)`` in a thread, so that the HTTP process goes on answering (``/health``, other clients)
    while it tokenizes or renders a prompt; a request whose prompt takes over ``PREPARE_TIMEOUT_S`` is
    refused (413) and the thread's work is left to end alone (bounded: ``ChatTemplate`` and the tokenizers
    admitted are linear in the prompt).

    Raises:
        OpenAIError: the prompt took too long to prepare.
    """
    try:
        return await asyncio.wait_for(asyncio.to_thread(work, *args), PREPARE_TIMEOUT_S)
    except TimeoutError:
        message = f"prompt: preparing it took over {PREPARE_TIMEOUT_S:g} s; send a shorter one"
        raise OpenAIError(413, message, "prompt") from None


async def unless_gone(http: Request, answer: Awaitable[Any], stop: Callable[[], None]) -> Any:
    """``answer``'s result, unless the client hangs up first: then ``stop()`` (tell the workers to drop the
    request at their next step) and the wait ends. Starlette cancels a stream whose client is gone, but
    not a handler that waits for a whole answer: without this, a client that gave up kept a worker
    decoding its request to the end."""
    waiting, watching = asyncio.ensure_future(answer), asyncio.ensure_future(hang_up(http))
    try:
        await asyncio.wait((waiting, watching), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watching.cancel()
    if waiting.done():
        return waiting.result()
    stop()
    waiting.cancel()
    return Response(status_code=499)  # nobody reads it: nginx's code for a request its client closed


async def hang_up(http: Request) -> None:
    """Return once ``http``'s client has closed the connection (the ASGI server's ``http.disconnect``; its
    body was read before the handler ran, so nothing else arrives)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


def sent(event: dict[str, Any]) -> str:
    """``event`` as a server-sent event."""
    return "data: " + json.dumps(event, separators=(",", ":")) + "\n\n"


def usage_of(choices: list[ChoiceText]) -> dict[str, int]:
    """A completion's ``usage``: the prompt and completion tokens of all its choices."""
    prompt_tokens = sum(choice.prompt_tokens for choice in choices)
    completion_tokens = sum(choice.completion_tokens for choice in choices)
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def refuse_unless_neutral(given: dict[str, bool]) -> None:
    """Refuse (400) the first field of ``given`` (field -> set to a value this server does not implement)."""
    for field, set_to_something in given.items():
        if set_to_something:
            raise OpenAIError(400, f"{field}: not implemented by this server; leave it out", field)


def decoded(response: Any, status: LitAPIStatus) -> dict[str, Any]:
    """A piece from the worker, decoded; a failure in the model as an :class:`OpenAIError` (500)."""
    if status == LitAPIStatus.ERROR:
        message = "the model failed on this request; the server's log has the traceback"
        raise OpenAIError(500, message, None, "server_error")
    return json.loads(response)


async def worker_outputs(pipe: AsyncIterator) -> AsyncIterator[dict[str, Any]]:
    """A completion's pieces from its worker, decoded (:func:`decoded`)."""
    async for response, status in pipe:
        yield decoded(response, status)


def stop_strings(stop: str | list[str] | None) -> list[str]:
    return [] if stop is None else [stop] if isinstance(stop, str) else list(stop)


def messages_of(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """``[{"role", "content"}]`` of a request; content given as parts becomes their text, joined.

    Raises:
        ValueError: a part that is not text (an image, audio), naming it.
    """
    messages = []
    for index, message in enumerate(request.messages):
        content = message.content
        if isinstance(content, list):
            kinds = [part.type for part in content]
            if any(kind != "text" for kind in kinds):
                raise ValueError(f"messages[{index}].content: this model reads text only, got parts {kinds}")
            content = "".join(part.text for part in content)
        messages.append({"role": message.role, "content": content})
    return messages


async def finish_reasons(pipe: AsyncIterator, finish: dict[int, str], index: int) -> AsyncIterator:
    """``pipe``'s items unchanged, noting the ``finish_reason`` that the worker's last piece carries."""
    async for response, status in pipe:
        if isinstance(response, str) and '"finish_reason"' in response:
            reason = json.loads(response).get("finish_reason")
            if reason:
                finish[index] = reason
        yield response, status


class Pieces:
    """An answer's outputs as its worker sends them, from its queue in the HTTP process's response buffer:
    one at a time (``async for``: LitServe's ``data_streamer``) or every one waiting at once (:meth:`batches`)."""

    def __init__(self, outputs: deque, event: asyncio.Event) -> None:
        self.outputs, self.event = outputs, event

    async def __aiter__(self) -> AsyncIterator[tuple[Any, LitAPIStatus]]:
        async for batch in self.batches():
            for item in batch:
                yield item

    async def batches(self) -> AsyncIterator[list[tuple[Any, LitAPIStatus]]]:
        """Lists of ``(data, status)``: every output waiting when the stream's consumer asks, in order; the
        end of the answer (FINISH_STREAMING) ends them, an ERROR is the last one given."""
        while True:
            await self.event.wait()
            self.event.clear()  # (set again by the next output: the same event loop's consumer puts them)
            batch = []
            while self.outputs:
                data, status = self.outputs.popleft()
                if status == LitAPIStatus.FINISH_STREAMING:
                    if batch:
                        yield batch
                    return
                batch.append((data, status))
                if status == LitAPIStatus.ERROR:
                    yield batch
                    return
            if batch:
                yield batch


class Cancellations:
    """The requests whose clients are gone: the HTTP processes :meth:`add` them, each worker stops those it
    generates. A manager's dictionary (request id -> True) holds them, and a stamp in shared memory beside
    it changes with each addition: a worker reads the dictionary, a round trip to the manager's process
    (which waits for a core when the server's processes share them), only after the stamp has changed or
    an answer has joined it (:meth:`read_again`), not at every step.

    Args:
        manager: a ``multiprocessing`` manager, stopped with the server's process group.
    """

    def __init__(self, manager: Any) -> None:
        self.ids = manager.dict()
        self.stamp = multiprocessing.get_context("spawn").RawValue("Q", 0)  # inherited, or pickled at spawn
        self.seen: int | None = None  # the stamp this process last read the dictionary at (None: read it)

    def add(self, request_id: str) -> None:
        self.ids[request_id] = True
        # Written after the dictionary, and new each time (two additions never leave the stamp they found).
        self.stamp.value = uuid.uuid4().int >> 64

    def new(self) -> set[str]:
        """The request ids added since this process last read them (possibly others' requests; empty without
        a change)."""
        stamp = self.stamp.value  # read before the dictionary: an addition after it changes the stamp again
        if stamp == self.seen:
            return set()
        self.seen = stamp
        return set(self.ids.keys())

    def read_again(self) -> None:
        """Have the next :meth:`new` read the dictionary (a request that joins may have been cancelled before)."""
        self.seen = None

    def forget(self, request_id: str) -> None:
        self.ids.pop(request_id, None)


class StepLoop(ContinuousBatchingLoop):
    """LitServe's continuous batching loop, first come first served and idle without spinning.

    LitServe's ``prefill`` gives a free place to whichever request its queue yields next, ahead of
    those already waiting for one (a client that resubmits as soon as its answer ends kept a short
    request waiting through dozens of long answers); here every request queues behind the ones
    that wait. And its ``run`` returns at once when there is nothing to generate, so the worker
    called it again and again, keeping a CPU core busy; here it waits for a request.

    The steps run in the worker's own thread (:meth:`step`), so the prefill task reads the queue between
    them: it takes every request waiting there at once, and the API's ``arrived`` event (set by the thread
    that reads the queue) ends a step's gathering of tokens early, so that a new request joins the batch
    within a step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.added: asyncio.Event | None = None  # made in the worker's event loop
        self.taken: asyncio.Event | None = None  # set each time the prefill task has put arrived requests in

    async def prefill(
        self,
        pending_requests: list,
        lit_api: ls.LitAPI,
        lit_spec: Any,
        request_queue: Any,
        transport: Any,
        *args: Any,
        **kwargs: Any,
    ) -> list:
        while True:
            while pending_requests and self.has_capacity(lit_api):
                response_queue_id, uid, request = pending_requests.pop(0)
                self.response_queue_ids[uid] = response_queue_id
                self.add_request(uid, request, lit_api, lit_spec, transport)
            if self.taken is not None:
                self.taken.set()
            wait = PREFILL_WAIT_S if pending_requests else IDLE_WAIT_S  # a place may free up meanwhile
            items = await asyncio.to_thread(self.take_requests, request_queue, wait, lit_api.arrived)
            if not items:
                return pending_requests
            lit_api.arrived.clear()  # every request that set it is in ``items``
            for response_queue_id, uid, _, request in items:
                status, kind = LitAPIStatus.START, LoopResponseType.STREAMING
                self.put_response(transport, response_queue_id, uid, (), status, kind)
                pending_requests.append((response_queue_id, uid, request))

    def take_requests(self, request_queue: Any, wait: float, arrived: threading.Event) -> list:
        """The requests of ``request_queue``: the first within ``wait`` seconds, then every one already there;
        ``arrived`` set as each is taken."""
        items = []
        item = self.get_request(request_queue, timeout=wait, block=True)
        while item is not None:
            items.append(item)
            arrived.set()
            item = self.get_request(request_queue, block=False)
        return items

    def add_request(self, uid: str, request: Any, lit_api: ls.LitAPI, *args: Any, **kwargs: Any) -> None:
        super().add_request(uid, request, lit_api, *args, **kwargs)
        if self.added is not None:
            self.added.set()

    async def run(
        self, lit_api: ls.LitAPI, device: str, worker_id: int, request_queue: Any, transport: Any, *args: Any
    ) -> None:
        """Steps of the answers in progress until none is left, each step's outputs sent to each HTTP process
        as one message (:meth:`send_step`); an idle worker waits for a request."""
        if self.added is None:
            self.added, self.taken = asyncio.Event(), asyncio.Event()
        if not lit_api.has_active_requests():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.added.wait(), timeout=IDLE_WAIT_S)
            self.added.clear()
            return
        outputs = None
        try:
            while lit_api.has_active_requests():
                outputs = await self.step(outputs, lit_api, lit_api.spec)
                self.send_step(transport, lit_api, outputs)
        except Exception as error:  # every answer in progress fails: their clients get the error, the worker goes on
            log.exception("the worker's step loop failed")
            for uid, response_queue_id in self.response_queue_ids.items():
                self.put_error_response(transport, response_queue_id, uid, error, LoopResponseType.STREAMING)
            self.response_queue_ids.clear()
            self.active_sequences.clear()
            for uid in list(lit_api.answers):
                lit_api.end(uid)

    async def step(self, previous: list[Output] | None, lit_api: ls.LitAPI, lit_spec: Any) -> list[Output]:
        """``lit_api.step`` in the worker's own thread, then a turn for the prefill task (the requests that
        arrived meanwhile join). LitServe runs it in a thread of asyncio's pool, where torch's intra-op threads
        (OpenMP) serve a second calling thread: the byte GPT decoded at half its speed on 2 cores there
        (the template's docs/benchmarks.md).

        A request taken from the queue during the step (``arrived``) is put in before the next step: the
        prefill task waits on the reader thread's future, which hands it over a turn or two of the event
        loop later, and each turn missed was a step of every answer in progress that the new one's first
        token waited through."""
        outputs = lit_api.step(previous)
        if lit_api.arrived.is_set() and self.taken is not None:
            self.taken.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.taken.wait(), timeout=TAKE_WAIT_S)
        else:
            await asyncio.sleep(0)
        return outputs

    def send_step(self, transport: Any, lit_api: ls.LitAPI, outputs: list[Output]) -> None:
        """A step's outputs, one message per HTTP process: ``(uid, data, status)`` of each, under the response
        buffer's key :data:`STEP_UID` (:class:`StepOutputs` hands each to its answer's stream). LitServe's own
        loop sends a message per output: through the manager's queue each is a round trip from the worker
        and another to the HTTP process, which cost more than a step of a small model."""
        messages: dict[int, list[tuple[Any, Any, LitAPIStatus]]] = {}
        for output in outputs:
            data = lit_api.format_encoded_response(lit_api.encode_response(output.output))
            if output.status == LitAPIStatus.ERROR:
                data = pickle.dumps(data)  # as LitServe's put_error_response sends an error
            messages.setdefault(self.response_queue_ids[output.uid], []).append((output.uid, data, output.status))
            if output.status != LitAPIStatus.OK:
                self.mark_completed(output.uid)
        for response_queue_id, items in messages.items():
            message = (items, LitAPIStatus.OK, LoopResponseType.STREAMING, self.worker_id)
            transport.send((STEP_UID, message), consumer_id=response_queue_id)


class StepOutputs:
    """The HTTP process's end of :meth:`StepLoop.send_step`: in the response buffer under :data:`STEP_UID`,
    LitServe's consumer appends each step's message here as it would an answer's piece; each output goes
    to its own answer's stream, as LitServe's consumer puts a message of one output."""

    def __init__(self, response_buffer: dict) -> None:
        self.response_buffer = response_buffer

    def append(self, response: tuple[list[tuple[Any, Any, LitAPIStatus]], LitAPIStatus]) -> None:
        items, _ = response
        for uid, data, status in items:
            answer = self.response_buffer.get(uid)
            if answer is not None:  # None: a request LitServe has already let go
                answer.response_queue.append((data, status))
                answer.event.set()


@dataclass
class Answer:
    """An answer in progress: its request (a chat, or a completion's prompt) and, once it is in the batch,
    how its tokens become text."""

    request: ChatRequest | CompletionItem
    text: Any = None  # the model's ChatAnswer
    prompt_tokens: int = 0
    tokens: int = 0  # generated so far
    scores: list = default(default_factory=list)  # a completion's token scores not yet sent

    @property
    def request_id(self) -> str:
        request = self.request
        return request.request_id if isinstance(request, CompletionItem) else request.metadata[REQUEST_ID]


class ChatAPI(ls.LitAPI):
    """The worker side: renders each conversation, and generates up to ``max_batch_size`` answers at
    once, one forward pass a step for all (:meth:`step`); stops an answer whose client is gone.

    ``progress`` is a shared array with a slot per worker: the ``time.monotonic()`` of its latest
    step while it generates, 0 when idle; :meth:`health` (in the HTTP process) reads it. A worker
    claims its slot under ``slots_lock`` (a manager's lock: no semaphore in the server's process, so
    none is left behind when the process group is stopped with SIGTERM).
    """

    def __init__(
        self,
        checkpoint: Path,
        trust: Sequence[str],
        spec: ChatSpec,
        progress: Any,
        slots_lock: Any,
        stuck_after: float,
        max_batch_size: int = 64,
        stream_interval: float = 0.0,
    ):
        super().__init__(spec=spec, max_batch_size=max_batch_size, loop=StepLoop())
        self.stream_interval, self.started = stream_interval, False
        self.checkpoint, self.trust = checkpoint, tuple(trust)
        self.progress, self.slots_lock, self.stuck_after = progress, slots_lock, stuck_after
        self.trained: Trained | None = None
        self.answers: dict[str, Answer] = {}  # LitServe's uid -> the answer; added by the loop's other thread
        self.prefilled_alone = False  # the last step prefilled joining answers without decoding the others

    def setup(self, device: str) -> None:
        self.arrived = threading.Event()  # a request is in the worker, waiting to join (StepLoop)
        self.trained = load_in_worker(self.checkpoint, device, self.trust, len(self.progress))
        self.template = self.trained.model.chat_template()
        self.batch = DecodeBatch(self.trained.predictor.net)
        with self.slots_lock:  # claim this worker's slot
            self.slot = next(i for i, value in enumerate(self.progress) if value == -1.0)
            self.progress[self.slot] = 0.0

    def predict(self, request: ChatRequest):  # LitServe's OpenAISpec wants a generator; :meth:`step` does the work
        yield from ()

    def add_request(self, uid: str, request: ChatRequest) -> None:
        self.answers[uid] = Answer(request)  # rendered in :meth:`step`, in the thread that runs the model
        self.spec.cancelled.read_again()  # its client may have gone while it waited in the queue

    def has_active_requests(self) -> bool:
        return bool(self.answers)

    def has_capacity(self) -> bool:
        return len(self.answers) < self.max_batch_size

    def step(self, previous: list[Output] | None) -> list[Output]:
        """Steps of every answer in progress until one has something to send (LitServe's loop sleeps 10 ms
        after a step with no output: a step whose tokens only held text back, a character's first bytes
        or the start of a stop string, a stall the answers would all wait through), then more steps for
        up to ``stream_interval`` seconds, each answer's pieces of them sent as one: every piece is a
        message from the worker, a server-sent event and a chunk the client parses, which cost more CPU
        than a token of a small model. An answer's first piece is never held: it is sent at once, with
        whatever the others have gathered (the time to the first token is what a user waits for)."""
        self.started = False
        outputs = self.step_once()
        while not outputs and self.answers and not self.arrived.is_set():
            outputs = self.step_once()
        until = time.monotonic() + self.stream_interval
        while self.answers and not (self.started or self.arrived.is_set()) and time.monotonic() < until:
            outputs += self.step_once()
        return joined_pieces(outputs)

    def step_once(self) -> list[Output]:
        """A step of every answer in progress: its next piece (an OK output), and for an answer that
        ended (its last piece given, its client gone, or an error) a FINISH_STREAMING or ERROR output."""
        outputs: list[Output] = []
        joined = False
        gone = self.spec.cancelled.new()
        self.progress[self.slot] = time.monotonic()
        for uid, answer in list(self.answers.items()):
            request_id = answer.request_id
            if request_id in gone:
                self.spec.cancelled.forget(request_id)
                gone_after = "request %s: the client disconnected after %d tokens; generation stopped"
                log.warning(gone_after, request_id, answer.tokens)
                outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))
                self.end(uid)
            elif answer.text is None:
                try:
                    self.start(uid, answer)
                    joined = True
                except Exception as error:
                    log.exception("request %s failed in the model", request_id)
                    outputs.append(Output(uid, error, LitAPIStatus.ERROR))
                    self.end(uid)
        try:
            # A step that answers join prefills them alone, so their first tokens go out without waiting for
            # the others' decoding too; those decode at the next step, the new ones with them. vLLM's V0
            # scheduler did the same ("prioritizes prefills and doesn't batch prefill and decode", its docs'
            # "Chunked Prefill"): a short time to the first token for a step's delay to the others. Never two
            # such steps in a row: requests joining at every step (one-token answers sent back to back) would
            # stop the others' decoding; at worst they now decode every other step.
            self.prefilled_alone = joined and not self.prefilled_alone
            tokens = self.batch.prefill() if self.prefilled_alone else self.batch.step()
        except Exception as error:  # one forward pass for all: all its answers fail
            log.exception("a step of %d answers failed in the model", len(self.answers))
            for uid in list(self.answers):
                outputs.append(Output(uid, error, LitAPIStatus.ERROR))
                self.end(uid)
            return outputs
        for uid, token in tokens.items():
            answer = self.answers[uid]
            completion = isinstance(answer.request, CompletionItem)
            if completion:
                answer.scores += self.batch.take_scores(uid)
            if completion and answer.request.max_tokens == 0:  # the prompt's scores alone: the token is not kept
                piece, answer.scores = Piece("", 0, "length"), answer.scores[: len(answer.request.ids)]
            else:
                piece = answer.text.add(token)
            if piece is None:
                continue
            self.started |= answer.tokens == 0  # its first piece
            answer.tokens = piece.tokens
            output = self.completion_piece(answer, piece) if completion else self.chat_piece(answer, piece)
            outputs.append(Output(uid, output, LitAPIStatus.OK))
            if piece.finish_reason is not None:
                outputs.append(Output(uid, "", LitAPIStatus.FINISH_STREAMING))
                self.end(uid)
        self.progress[self.slot] = time.monotonic() if self.answers else 0.0
        return outputs

    @staticmethod
    def chat_piece(answer: Answer, piece: Piece) -> dict[str, Any]:
        """An answer's piece as LitServe's ``OpenAISpec`` reads it: a message delta, usage on the last."""
        message = {"role": "assistant", "content": piece.text}
        if piece.finish_reason is not None:
            usage = {"prompt_tokens": answer.prompt_tokens, "completion_tokens": piece.tokens}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            message.update(finish_reason=piece.finish_reason, **usage)
        return message

    @staticmethod
    def completion_piece(answer: Answer, piece: Piece) -> dict[str, Any]:
        """A completion's piece as :class:`serving.completions.ChoiceText` reads it, with its tokens' scores."""
        scores = [[score.token, score.logprob, score.top] for score in answer.scores]
        answer.scores = []
        finish, tokens = piece.finish_reason, piece.tokens
        return {"text": piece.text, "scores": scores, "finish_reason": finish, "completion_tokens": tokens}

    def start(self, uid: str, answer: Answer) -> None:
        """Render the answer's conversation (a completion's prompt is its token ids) and put it in the batch
        (prefilled within the next steps)."""
        request = answer.request
        completion = isinstance(request, CompletionItem)
        ids = request.ids if completion else self.template.ids(messages_of(request))
        answer.prompt_tokens = len(ids)
        predictor = self.trained.predictor
        device = next(predictor.parameters()).device
        answer.text = self.trained.model.chat_answer(
            max_new_tokens=request.max_tokens,
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            stop=request.stop if completion else stop_strings(request.stop),
            seed=request.seed,
            device=device,
            chat=not completion,
        )
        prompt = predictor.transform(torch.tensor([ids], dtype=torch.long, device=device))[0].tolist()
        scored = completion and request.logprobs is not None
        top = request.logprobs if scored else None
        self.batch.add(uid, prompt, answer.text.choose, top_logprobs=top, score_prompt=scored and request.echo)

    def end(self, uid: str) -> None:
        self.answers.pop(uid)
        self.batch.remove(uid)

    def health(self) -> bool:
        now = time.monotonic()
        return not any(value > 0 and now - value > self.stuck_after for value in self.progress)


def joined_pieces(outputs: list[Output]) -> list[Output]:
    """``outputs`` with each answer's pieces (OK outputs) joined into its first: their text in order, the
    last one's finish reason and usage; the ends of answers (FINISH_STREAMING, ERROR) kept after them."""
    joined: list[Output] = []
    first: dict[str, int] = {}
    for output in outputs:
        at = first.get(output.uid)
        if output.status != LitAPIStatus.OK or not isinstance(output.output, dict):
            joined.append(output)
        elif at is None:
            first[output.uid] = len(joined)
            joined.append(output)
        else:
            before, piece = joined[at].output, output.output
            text = "text" if "scores" in piece else "content"
            merged = {**piece, text: before[text] + piece[text]}
            if "scores" in piece:
                merged["scores"] = before["scores"] + piece["scores"]
            joined[at] = Output(output.uid, merged, LitAPIStatus.OK)
    return joined


def build_chat_server(
    trained: Trained,
    model_name: str,
    max_tokens: int = 256,
    accelerator: str = "auto",
    workers_per_device: int = 1,
    timeout: float = 30.0,
    middlewares: Sequence[Any] = (),
    trust: Sequence[str] = (),
    max_batch_size: int = 64,
    stream_interval: float = STREAM_INTERVAL_S,
) -> ls.LitServer:
    """A LitServer speaking the OpenAI API over ``trained`` (its checkpoint is loaded again in each worker).

    Args:
        model_name: the ``model`` clients name.
        max_tokens: the most new tokens per request.
        timeout: the seconds without a step after which ``/health`` calls a generating worker stuck.
        max_batch_size: the most answers a worker generates at once (one forward pass a step for all).
        stream_interval: the seconds of tokens each answer's piece may gather (0: a piece per step).
        middlewares: LitServe middlewares (serving.api's body limits).

    Raises:
        ValueError: the task module has no chat contract (``chat_template``, ``stream_chat``).
    """
    if not hasattr(trained.model, "stream_chat"):
        kind = type(trained.model).__name__
        raise ValueError(f"{kind} does not generate text: the OpenAI API serves language models")
    manager = multiprocessing.get_context("spawn").Manager()  # stops with the server's process group
    cancelled = Cancellations(manager)
    spec = ChatSpec(model_name, trained.model.chat_template(), trained.model.context_size, max_tokens, cancelled)
    workers = workers_per_device * max(1, _device_count(accelerator))
    # A slot per worker, written by that worker only; claimed under the manager's lock.
    progress = multiprocessing.get_context("spawn").Array("d", [-1.0] * workers, lock=False)
    api = ChatAPI(
        trained.checkpoint,
        trust,
        spec,
        progress,
        manager.Lock(),
        stuck_after=timeout,
        max_batch_size=max_batch_size,
        stream_interval=stream_interval,
    )
    server = ls.LitServer(
        api,
        accelerator=accelerator,
        workers_per_device=workers_per_device,
        timeout=timeout,
        middlewares=list(middlewares),
    )
    server.app.add_exception_handler(OpenAIError, openai_error)
    server.app.add_exception_handler(RequestValidationError, invalid_body)
    server.app.add_exception_handler(StarletteHTTPException, http_error)
    return server


def _device_count(accelerator: str) -> int:
    import torch

    use_cuda = accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available())
    return torch.cuda.device_count() if use_cuda else 1
