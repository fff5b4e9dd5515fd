"""The OpenAI API of ``make serve`` for language models (serving/openai_api.py), called with the official
``openai`` client and with curl, against a trained byte GPT{{ " (the LoRA fine-tune: tests/test_finetune.py)" if cookiecutter.use_pretrained == "yes" else "" }}.

Answers are checked against the model run in this process (``stream_chat``), token for token.
"""

import asyncio
import json
import os
import queue
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, documentation, free_port, readme_commands, serving, shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data.tokenizer import ByteTokenizer, ChatTemplate
from {{ cookiecutter.package_name }}.engine.inference import Predictor, Trained, load_trained
from {{ cookiecutter.package_name }}.models import LanguageModel
from {{ cookiecutter.package_name }}.models.language_model import decode, sampler
from {{ cookiecutter.package_name }}.models.language_model import greedy as greedy_choice
from {{ cookiecutter.package_name }}.nets import GPT
from {{ cookiecutter.package_name }}.serving.batching import DecodeBatch

openai = pytest.importorskip("openai", reason="the dev extra (make install installs it)")
pytest.importorskip("litserve", reason="the serve extra (make install installs it)")

NAME = "{{ cookiecutter.project_slug }}"
CHAT = [{"role": "system", "content": "Answer as Ishmael."}, {"role": "user", "content": "Call me Ishmael."}]
AT_ONCE = 4  # the test server's --max_batch_size


def answer_in_process(trained: Trained, messages: list[dict[str, str]], **settings: Any) -> tuple[str, str, int, int]:
    """``(text, finish_reason, completion tokens, prompt tokens)`` of the model run here, as the server runs it."""
    ids = trained.model.chat_template().ids(messages)
    pieces = list(trained.model.stream_chat(trained.predictor, ids, **settings))
    return "".join(piece.text for piece in pieces), pieces[-1].finish_reason, pieces[-1].tokens, len(ids)


def served_as_run_here(trained: Trained, question: list[dict], max_tokens: int, folder: Path) -> tuple[str, str]:
    """``(text, finish_reason)`` of the greedy answer to ``question``, after checking that the OpenAI API of
    ``make serve`` over the checkpoint gives it whole and streamed, as the model run in this process does."""
    text, reason, tokens, prompt = answer_in_process(trained, question, max_new_tokens=max_tokens, temperature=0)
    settings = {"model": NAME, "messages": question, "max_tokens": max_tokens, "temperature": 0}
    ids = trained.model.tokenizer.encode(question[-1]["content"])
    with serving(trained.checkpoint, folder, api="openai") as (port, _, _), client(port) as api:
        whole = api.chat.completions.create(**settings)
        chunks = list(api.chat.completions.create(**settings, stream=True))
        # What lm-evaluation-harness asks for a log-likelihood: the prompt scored, and one token after it.
        scored = api.completions.create(model=NAME, prompt=ids, max_tokens=1, temperature=0, echo=True, logprobs=1)
    logprobs = scored.choices[0].logprobs
    expected = scored_alone(trained.predictor.net, ids)
    assert logprobs.token_logprobs[1 : len(ids)] == pytest.approx([logprob for logprob, _ in expected], abs=1e-4)
    last = torch.log_softmax(trained.predictor.net(torch.tensor([ids]))[0, -1].float(), dim=-1).max().item()
    assert len(logprobs.tokens) == len(ids) + 1 and logprobs.token_logprobs[-1] == pytest.approx(last, abs=1e-4)
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (text, reason)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt, tokens)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == text
    assert chunks[-1].choices[0].finish_reason == reason
    return text, reason


# ---- the worker's scheduling, no model -----------------------------------------------------------


class Places:
    """A LitAPI's side of the continuous loop: ``places`` answers at once, the uids started in order."""

    def __init__(self, places: int, running: list[str]) -> None:
        self.places, self.running, self.started = places, running, []
        self.arrived = threading.Event()

    def has_capacity(self) -> bool:
        return len(self.running) < self.places

    def add_request(self, uid: str, request: Any) -> None:
        self.running.append(uid)
        self.started.append(uid)


class Arrivals:
    """A request queue whose next request arrives just as the running answer ends (frees its place)."""

    def __init__(self, places: Places, uids: list[str]) -> None:
        self.places, self.uids = places, uids

    def get(self, block: bool = True, timeout: float | None = None) -> tuple:
        if not self.uids:
            raise queue.Empty
        self.places.running.clear()
        return (0, self.uids.pop(0), time.monotonic(), {"uid": "request"})


def test_a_free_place_goes_to_the_request_that_waited_longest() -> None:
    """LitServe's own prefill gave it to the request arriving as it freed up: a client resubmitting long
    requests back to back kept a short one waiting through dozens of answers."""
    from {{ cookiecutter.package_name }}.serving.openai_api import StepLoop

    loop, api = StepLoop(), Places(places=1, running=["long-1"])
    waiting = [(0, "short", {})]  # arrived while long-1 held the one place
    waiting = asyncio.run(loop.prefill(waiting, api, None, Arrivals(api, ["long-2"]), None))
    assert api.started == ["short"] and [uid for _, uid, _ in waiting] == ["long-2"]


def test_the_worker_takes_every_queued_request_in_one_turn_and_signals_the_steps() -> None:
    """The steps run in the worker's own thread, so the prefill task reads the queue between them: all that
    wait, in one turn, with ``arrived`` set (it ends a step's gathering, so they join within a step)."""
    from {{ cookiecutter.package_name }}.serving.openai_api import StepLoop

    api, arrived = Places(places=4, running=[]), threading.Event()
    items = StepLoop().take_requests(Arrivals(api, ["a", "b", "c"]), 0.0, arrived)
    assert [uid for _, uid, _, _ in items] == ["a", "b", "c"] and arrived.is_set()
    assert StepLoop().take_requests(Arrivals(api, []), 0.0, threading.Event()) == []
    api.arrived.set()
    waiting = asyncio.run(StepLoop().prefill([], api, None, Arrivals(api, ["d", "e"]), None))
    assert api.started == ["d", "e"] and waiting == [] and not api.arrived.is_set()


class Incoming:
    """A request queue that holds one request until ``ready`` is set (it arrives), then none."""

    def __init__(self, uid: str) -> None:
        self.uids, self.ready = [uid], threading.Event()

    def get(self, block: bool = True, timeout: float | None = None) -> tuple:
        if self.ready.wait(timeout if block else 0) and self.uids:
            self.ready.clear()
            return (0, self.uids.pop(0), time.monotonic(), {"uid": "request"})
        raise queue.Empty


class Stepping(Places):
    """A LitAPI whose ``step`` records the answers in it, and during which ``requests``' request arrives and is
    taken by the worker's reader thread (``arrived``), as one arrives while a step of the model runs."""

    def __init__(self, requests: Incoming) -> None:
        super().__init__(places=4, running=["old"])
        self.requests, self.batches = requests, []

    def step(self, previous: Any) -> list:
        self.batches.append(list(self.running))
        if self.requests.uids:
            self.requests.ready.set()
            assert self.arrived.wait(10), "the reader thread did not take the request"
        return []


def test_a_request_taken_during_a_step_is_in_the_next_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefill task waits on the reader thread's future, which reaches the event loop a turn or two after
    the step that saw the request taken: ``StepLoop.step`` waits for it to put the request in, so a new
    answer's first token waits for the step in progress only, not for one or two more of every answer's."""
    from {{ cookiecutter.package_name }}.serving import openai_api

    monkeypatch.setattr(openai_api, "TAKE_WAIT_S", 10.0)  # a loaded machine's thread switch is not the test
    requests = Incoming("new")
    api, loop = Stepping(requests), openai_api.StepLoop()

    async def serve() -> None:
        loop.added, loop.taken = asyncio.Event(), asyncio.Event()

        async def read_requests() -> None:
            pending: list = []
            while True:
                pending = await loop.prefill(pending, api, None, requests, None)

        reader = asyncio.create_task(read_requests())
        await asyncio.sleep(0.05)  # the reader thread waits on the queue
        await loop.step(None, api, None)  # the request arrives during it
        await loop.step(None, api, None)
        reader.cancel()

    asyncio.run(serve())
    assert api.batches == [["old"], ["old", "new"]]


class Stepped:
    """``ChatAPI.step_once`` of a running answer: an output from step ``first`` on (None: never), a request
    arriving at step ``arrives``; more than ``most`` steps fail the test rather than hang it."""

    def __init__(self, api: Any, first: int | None, arrives: int, most: int = 50) -> None:
        self.api, self.first, self.arrives, self.most, self.steps = api, first, arrives, most, 0

    def __call__(self) -> list:
        from litserve.loops.continuous_batching_loop import Output
        from litserve.utils import LitAPIStatus

        self.steps += 1
        assert self.steps <= self.most, "the step went on gathering after a request arrived"
        if self.steps == self.arrives:
            self.api.arrived.set()  # as the thread that reads the queue sets it
        if self.first is None or self.steps < self.first:
            return []  # the tokens only held text back (a character's first bytes)
        return [Output("a", {"content": "x"}, LitAPIStatus.OK)]


@pytest.mark.parametrize("first", [None, 1], ids=["while-text-is-held-back", "while-pieces-gather"])
def test_a_request_that_arrives_ends_the_steps_gathering_so_it_joins_within_a_step(first: int | None) -> None:
    """``ChatAPI.step`` steps on until it has output, then gathers ``stream_interval`` seconds of pieces; a
    request that arrives meanwhile ends both, so the prefill task puts it in the batch at the next step."""
    from {{ cookiecutter.package_name }}.serving.openai_api import ChatAPI

    api = ChatAPI.__new__(ChatAPI)  # the scheduling alone: no model, no server
    api.answers, api.arrived, api.stream_interval = {"a": object()}, threading.Event(), 60.0
    api.step_once = Stepped(api, first, arrives=3)
    started = time.monotonic()
    outputs = api.step(None)
    assert api.step_once.steps == 3 and time.monotonic() - started < 30  # not the 60 s of gathering
    assert [output.output for output in outputs] == ([] if first is None else [{"content": "xxx"}])
    api.arrived.clear()  # the prefill task took the request; with none arriving, a step gathers its interval
    api.stream_interval, api.step_once = 1.0, Stepped(api, first=1, arrives=0, most=10**9)
    api.step(None)
    assert api.step_once.steps > 1


class Sent(list):
    """A transport that keeps what the worker sends: ``(consumer_id, message)``."""

    def send(self, item: Any, consumer_id: int) -> None:
        self.append((consumer_id, item))


class Received:
    """A transport whose consumer receives ``messages``, then is cancelled (LitServe's consumer then stops)."""

    def __init__(self, messages: list) -> None:
        self.messages = messages

    async def areceive(self, consumer_id: int, timeout: float | None = None, block: bool = True) -> Any:
        if not self.messages:
            raise asyncio.CancelledError
        return self.messages.pop(0)


def test_a_step_is_one_message_per_http_process_and_litserve_hands_each_output_to_its_answer() -> None:
    """Through LitServe's manager queue each message is a round trip from the worker and another to the HTTP
    process: a step's outputs go as one, and LitServe's own consumer hands each to its answer's stream."""
    from collections import deque
    from types import SimpleNamespace

    from litserve.loops.continuous_batching_loop import Output
    from litserve.server import response_queue_to_buffer
    from litserve.utils import LitAPIStatus, ResponseBufferItem

    from {{ cookiecutter.package_name }}.serving.openai_api import STEP_UID, StepLoop, StepOutputs

    ok, end = LitAPIStatus.OK, LitAPIStatus.FINISH_STREAMING
    loop, sent = StepLoop(), Sent()
    loop.response_queue_ids = {"a": 0, "b": 0, "c": 1, "d": 0}
    loop.active_sequences = {uid: {} for uid in "abcd"}
    encoded = {"encode_response": lambda output: output, "format_encoded_response": lambda data: json.dumps(data)}
    api = SimpleNamespace(**encoded)
    outputs = [Output("a", {"content": "x"}, ok), Output("b", {"content": "y"}, ok), Output("b", "", end)]
    outputs += [Output("c", {"content": "z"}, ok), Output("d", {"content": "w"}, ok)]
    loop.send_step(sent, api, outputs)
    assert [consumer for consumer, _ in sent] == [0, 1]  # one message for each HTTP process
    assert loop.response_queue_ids == {"a": 0, "c": 1, "d": 0}  # b ended: no longer the worker's

    async def consume() -> dict:
        answers = {uid: ResponseBufferItem(response_queue=deque(), event=asyncio.Event()) for uid in "ab"}
        buffer: dict = dict(answers)  # no "d": a request LitServe has let go, whose output is dropped
        buffer[STEP_UID] = ResponseBufferItem(response_queue=StepOutputs(buffer), event=asyncio.Event())
        connector = SimpleNamespace(lit_apis=[api], any_stream=lambda: True)
        await response_queue_to_buffer(Received([message for _, message in sent[:1]]), buffer, 0, connector)
        return answers

    answers = asyncio.run(consume())
    assert list(answers["a"].response_queue) == [('{"content": "x"}', ok)] and answers["a"].event.is_set()
    assert list(answers["b"].response_queue) == [('{"content": "y"}', ok), ('""', end)]


def streamed(outputs: list[tuple[Any, Any]], cancelled: list | None = None) -> list[dict | str]:
    """The events ``ChatSpec.streaming_completion`` writes when ``outputs`` (``(piece or None, status)``) are
    all waiting in the answer's queue at once, each event's JSON decoded."""
    from collections import deque
    from types import SimpleNamespace

    from {{ cookiecutter.package_name }}.serving.openai_api import REQUEST_ID, ChatSpec, Pieces

    queue_ = deque((json.dumps(piece) if piece is not None else "", status) for piece, status in outputs)
    event = asyncio.Event()
    event.set()
    spec = SimpleNamespace(cancelled=SimpleNamespace(add=(cancelled if cancelled is not None else []).append))
    request = SimpleNamespace(metadata={REQUEST_ID: "r1"}, model=NAME)

    async def events() -> list[str]:
        return [event async for event in ChatSpec.streaming_completion(spec, request, [Pieces(queue_, event)])]

    return [e if e == "data: [DONE]\n\n" else json.loads(e.removeprefix("data: ")) for e in asyncio.run(events())]


def test_a_streams_waiting_pieces_go_as_one_event_with_the_answers_id_finish_reason_and_usage() -> None:
    """An HTTP process behind its streams writes what gathered as one server-sent event (LitServe's spec wrote
    one per piece, each built through four pydantic models); the events are the OpenAI API's chunks."""
    from litserve.utils import LitAPIStatus

    ok, end, error = LitAPIStatus.OK, LitAPIStatus.FINISH_STREAMING, LitAPIStatus.ERROR
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    pieces = [({"role": "assistant", "content": "Ca"}, ok), ({"role": "assistant", "content": "ll"}, ok)]
    pieces += [({"role": "assistant", "content": " me", "finish_reason": "length", **usage}, ok), (None, end)]
    text, last, done = streamed(pieces)
    delta = {"role": "assistant", "content": "Call me"}
    assert text["choices"] == [{"index": 0, "delta": delta, "finish_reason": None}]
    assert last["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}] and last["usage"] == usage
    assert {text["id"], last["id"]} == {"chatcmpl-r1"} and text["object"] == "chat.completion.chunk"
    assert done == "data: [DONE]\n\n"
    # A failure in the model is the stream's last event, in the OpenAI error shape; the worker has ended it.
    cancelled: list = []
    text, failed, done = streamed([({"role": "assistant", "content": "Ca"}, ok), (None, error)], cancelled)
    assert failed["error"]["type"] == "server_error" and "model failed" in failed["error"]["message"]
    assert text["choices"][0]["delta"]["content"] == "Ca" and cancelled == []


def test_pieces_give_every_waiting_output_at_once_and_end_with_the_answer() -> None:
    from collections import deque

    from litserve.utils import LitAPIStatus

    from {{ cookiecutter.package_name }}.serving.openai_api import Pieces

    ok, end = LitAPIStatus.OK, LitAPIStatus.FINISH_STREAMING

    async def consume() -> tuple[list, list]:
        outputs, event = deque([("a", ok), ("b", ok)]), asyncio.Event()
        pieces = Pieces(outputs, event)
        event.set()
        batches = pieces.batches()
        first = await anext(batches)
        outputs.extend([("c", ok), ("", end), ("after the end", ok)])  # the worker's next step
        event.set()
        rest = [batch async for batch in batches]
        one_by_one = Pieces(deque([("x", ok), ("", end)]), asyncio.Event())
        one_by_one.event.set()
        return [first, *rest], [item async for item in one_by_one]

    batches, items = asyncio.run(consume())
    assert batches == [[("a", ok), ("b", ok)], [("c", ok)]]
    assert items == [("x", ok)]  # LitServe's data_streamer's items, for the whole answer's path


class CountedDict(dict):
    """A manager's dictionary that counts its reads (each a round trip to the manager's process)."""

    reads = 0

    def keys(self) -> Any:
        self.reads += 1
        return super().keys()


def test_a_worker_reads_the_cancellations_only_after_one_is_added_or_an_answer_joins() -> None:
    from types import SimpleNamespace

    from {{ cookiecutter.package_name }}.serving.openai_api import Cancellations

    cancelled = Cancellations(SimpleNamespace(dict=CountedDict))
    assert cancelled.new() == set() and cancelled.ids.reads == 1
    assert cancelled.new() == set() and cancelled.ids.reads == 1  # nothing added: no round trip a step
    cancelled.add("r1")
    assert cancelled.new() == {"r1"} and cancelled.new() == set() and cancelled.ids.reads == 2
    cancelled.read_again()  # an answer joined: it may have been cancelled while it waited
    assert cancelled.new() == {"r1"} and cancelled.ids.reads == 3
    cancelled.forget("r1")
    cancelled.add("r2")
    assert cancelled.new() == {"r2"}


# ---- the model side, no server -------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_gpt() -> tuple[LanguageModel, Predictor]:
    """An untrained byte GPT: its greedy bytes are often not UTF-8, the hard case for streaming text."""
    torch.manual_seed(0)
    model = LanguageModel(GPT(vocab_size=256, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)).eval()
    return model, Predictor(torch.nn.Identity(), model.net, model.output_head())


def test_extreme_sampling_settings_inside_their_ranges_sample_the_likeliest_token() -> None:
    # A temperature of 1e-40 once made the logits inf and softmax NaN; a top_p of 1e-300 (0 in
    # float32) dropped every token: both were 500s at the server.
    logits = torch.randn(4, 256) * 10
    for choose in (sampler(1e-40), sampler(1.0, top_p=1e-300), sampler(1e-40, top_k=5, top_p=1e-300)):
        assert torch.equal(choose(logits), greedy_choice(logits))


def test_streamed_pieces_join_into_the_whole_answer_and_stop_strings_cut_it(random_gpt) -> None:
    model, predictor = random_gpt
    ids = list(b"user: hi\nassistant: ")
    pieces = list(model.stream_chat(predictor, ids, max_new_tokens=200, temperature=0))
    text = "".join(piece.text for piece in pieces)
    greedy = decode(model.net, torch.tensor([ids]), 200, greedy_choice)[0].tolist()
    # Each piece is final: the pieces join into the decoded answer, whatever bytes split a character.
    assert text == ByteTokenizer().decode(greedy)
    assert [piece.finish_reason for piece in pieces] == [None] * (len(pieces) - 1) + ["length"]
    assert pieces[-1].tokens == 200 and all(piece.text or piece is pieces[-1] for piece in pieces)
    stop = text[40:43]
    cut = list(model.stream_chat(predictor, ids, max_new_tokens=200, temperature=0, stop=[stop]))
    assert "".join(piece.text for piece in cut) == text[: text.index(stop)]
    assert cut[-1].finish_reason == "stop"
    sampled = [list(model.stream_chat(predictor, ids, 50, temperature=1.0, top_p=0.9, seed=7)) for _ in range(2)]
    assert [p.text for p in sampled[0]] == [p.text for p in sampled[1]]  # a seed repeats the answer


class Scripted(torch.nn.Module):
    """A stand-in net that writes ``script`` a byte per step: tokens (B, T) -> logits (B, T, 256)."""

    block_size = 1024

    def __init__(self, script: bytes, prompt_length: int) -> None:
        super().__init__()
        self.script, self.prompt_length = script, prompt_length
        self.unused = torch.nn.Parameter(torch.zeros(()))  # a device to run on

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], 256)
        logits[:, -1, self.script[tokens.shape[1] - self.prompt_length]] = 1.0
        return logits


def test_characters_split_across_tokens_and_stop_strings_are_never_sent_in_part(random_gpt) -> None:
    model, _ = random_gpt
    ids = list(b"user: hi\nassistant: ")
    # "é" and "€" are 2 and 3 bytes, one token each; "\nuser:" starts the next turn of the plain template.
    net = Scripted("Ahoy, café! €5\nuser: more".encode(), len(ids))
    predictor = Predictor(torch.nn.Identity(), net, torch.nn.Identity())
    pieces = list(model.stream_chat(predictor, ids, max_new_tokens=100, temperature=0))
    assert all("\ufffd" not in piece.text and "\n" not in piece.text for piece in pieces), pieces
    assert "".join(piece.text for piece in pieces) == "Ahoy, café! €5" and pieces[-1].finish_reason == "stop"
    assert len(pieces) > 5  # sent as it came, not at the end
    cut = list(model.stream_chat(predictor, ids, max_new_tokens=100, temperature=0, stop=["fé!"]))
    assert "".join(piece.text for piece in cut) == "Ahoy, ca" and cut[-1].finish_reason == "stop"
    short = list(model.stream_chat(predictor, ids, max_new_tokens=10, temperature=0))  # a byte of "é"
    assert "".join(piece.text for piece in short) == "Ahoy, caf\ufffd" and short[-1].finish_reason == "length"


def alone(net: torch.nn.Module, prompt: list[int], count: int, choose=greedy_choice) -> list[int]:
    """The ``count`` tokens ``choose`` picks after ``prompt``, the answer decoded by itself (``decode``)."""
    return decode(net, torch.tensor([prompt]), count, choose)[0].tolist()


def context_dependent_gpt() -> GPT:
    """A small GPT whose greedy tokens depend on the context: weights larger than a fresh net's, whose
    greedy tokens mostly repeat the last one, attention or not (any two decoders would agree)."""
    torch.manual_seed(0)
    net = GPT(vocab_size=256, block_size=24, n_layer=2, n_head=2, n_embd=32, dropout=0.0).eval()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.normal_(0.0, 0.3)
    return net


@pytest.mark.parametrize("prefill_tokens", [4, 64])
def test_answers_decoded_together_equal_each_decoded_alone_as_they_join_and_leave(prefill_tokens: int) -> None:
    shared_steps, prefilled_together = assert_decoded_together_equal_alone(context_dependent_gpt(), prefill_tokens)
    assert shared_steps >= 15 and prefilled_together == (2 if prefill_tokens == 64 else 0)  # "b" with "c", "d" with "e"


def test_answers_that_end_in_one_step_leave_the_shared_cache_in_one_copy() -> None:
    """Each leave copies the rows kept (the cache is one tensor): answers ending together copy it once, at the
    next step, where they copied it once each (16 answers of one length, started together, 16 copies)."""
    batch = DecodeBatch(context_dependent_gpt())
    for key in "abcd":
        batch.add(key, [5, 9, 200], greedy_choice)
    assert set(batch.step()) == set("abcd") and len(batch.rows) == 4  # prefilled together, then shared rows
    copies, select = [], batch.cache.select
    batch.cache.select = lambda rows: (copies.append(rows), select(rows))
    for key in "abc":
        batch.remove(key)
    assert len(batch) == 1 and copies == []
    assert list(batch.step()) == ["d"] and copies == [[3]]
    batch.remove("d")
    batch.add("d", [7, 7], greedy_choice)  # the key again, before a step: the row that left is gone first
    assert len(batch) == 1 and copies == [[3], []]


def test_prefill_and_decode_are_steps_of_their_own_and_a_step_is_both() -> None:
    """``prefill`` reads the waiting prompts only (the answers decoding keep their tokens), ``decode`` the
    prefilled answers only; ``step`` both, as before."""
    batch = DecodeBatch(context_dependent_gpt())
    batch.add("a", [5, 9, 200], greedy_choice)
    assert batch.decode() == {} and list(batch.prefill()) == ["a"]
    batch.add("b", [7, 7], greedy_choice)
    assert list(batch.decode()) == ["a"] and [sequence.key for sequence in batch.waiting] == ["b"]
    assert list(batch.prefill()) == ["b"] and len(batch.rows[0].ids) == 5  # a's prompt and two tokens
    assert set(batch.step()) == {"a", "b"} and batch.waiting == []


class Steps:
    """A worker's ``DecodeBatch`` that records which of its steps ran."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def prefill(self) -> dict:
        self.ran.append("prefill")
        return {}

    def step(self) -> dict:
        self.ran.append("step")
        return {}


def test_a_step_that_answers_join_prefills_them_without_decoding_the_others() -> None:
    """A joining answer's first token goes out after its prefill alone, not after the others' decoding too
    (at 16 answers a decoding step is about as long as a short prompt's prefill); the next step decodes all."""
    from types import SimpleNamespace

    from {{ cookiecutter.package_name }}.serving.openai_api import Answer, ChatAPI

    api = ChatAPI.__new__(ChatAPI)  # the scheduling alone: no model, no server
    request = SimpleNamespace(metadata={"request_id": "r"})
    api.answers = {"old": Answer(request, text=object()), "new": Answer(request)}
    api.spec = SimpleNamespace(cancelled=SimpleNamespace(new=set))
    api.progress, api.slot, api.batch, api.prefilled_alone = [0.0], 0, Steps(), False
    api.start = lambda uid, answer: setattr(answer, "text", object())
    assert api.step_once() == [] and api.batch.ran == ["prefill"]
    assert api.step_once() == [] and api.batch.ran == ["prefill", "step"]
    # Answers joining at every step (one-token answers back to back): the others still decode every other step.
    for joining in ("a", "b", "c", "d"):
        api.answers[joining] = Answer(request)
        api.step_once()
    assert api.batch.ran[2:] == ["prefill", "step", "prefill", "step"]


def assert_decoded_together_equal_alone(net: torch.nn.Module, prefill_tokens: int) -> tuple[int, int]:
    """Greedy answers of the batch are token for token those of the answer alone, whatever else is in the batch:
    prompts of other lengths join mid-answer, two at a time (prefilled in chunks of ``prefill_tokens`` 4, or
    together in one forward pass, right-padded, with 64), one leaves early, one samples with its own seed, and
    two run past the context (``net.block_size`` 24: decoded alone from then on). Returns the steps in which
    the answers of the shared cache took one forward pass (the others each their own) and the prefills of
    several prompts in one pass."""
    assert net.block_size == 24
    prompts = {"a": [5, 9, 200], "b": list(range(40, 49)), "c": list(range(100, 120)), "d": [7] * 6, "e": [1]}
    joins = {"a": 0, "b": 2, "c": 2, "d": 7, "e": 7}  # the step each answer is added at
    wanted = {"a": 6, "b": 30, "c": 12, "d": 20, "e": 25}  # tokens each answer takes; "a" leaves after 6
    seeded = lambda: sampler(0.9, top_p=0.95, generator=torch.Generator().manual_seed(3))  # noqa: E731
    batch, got = DecodeBatch(net, prefill_tokens=prefill_tokens), {key: [] for key in prompts}
    calls, kept, shared_steps, prefilled_together = [], [], 0, 0
    hook = net.register_forward_hook(lambda module, inputs, output: calls.append(inputs[0].shape))
    keep = net.register_forward_hook(lambda module, inputs, output: kept.append((inputs[0].shape[1], output.shape[1])))
    for step in range(60):
        for key in [key for key, at in joins.items() if at == step]:
            batch.add(key, prompts[key], seeded() if key == "d" else greedy_choice)
        calls[:] = []
        tokens = batch.step()
        if len(tokens) > 1 and calls[0][0] > 1 and calls[0][1] == 1:  # one forward pass for the shared rows,
            assert all(shape[0] == 1 or shape[1] > 1 for shape in calls[1:])  # then each alone, or prefills
            shared_steps += 1
        prefilled_together += sum(shape[0] > 1 and shape[1] > 1 for shape in calls)
        for key, token in tokens.items():
            got[key].append(token)
            if len(got[key]) == wanted[key]:
                batch.remove(key)
    hook.remove(), keep.remove()
    assert len(batch) == 0
    # A prompt's logits only where a token is picked: its last position (prompts prefilled together, each one's).
    assert all(logits <= 2 for fed, logits in kept if fed > 1), kept
    for key, prompt in prompts.items():
        choose = seeded() if key == "d" else greedy_choice
        assert got[key] == alone(net, prompt, wanted[key], choose), key
    return shared_steps, prefilled_together


class OwnNet(torch.nn.Module):
    """A user's own language-model net: ``block_size`` and a forward, no key/value cache (no ``new_cache``)."""

    def __init__(self, net: GPT) -> None:
        super().__init__()
        self.net, self.block_size = net, net.block_size

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.net(tokens)


def test_a_net_without_a_cache_is_served_one_answer_at_a_time_over_its_window() -> None:
    """Each answer equals uncached decoding alone, past the context too (the window slides)."""
    net = OwnNet(context_dependent_gpt())
    batch, got = DecodeBatch(net), {"a": [], "b": []}
    prompts, wanted = {"a": [5, 9, 200], "b": list(range(100, 120))}, {"a": 30, "b": 10}
    for key, prompt in prompts.items():
        batch.add(key, prompt, greedy_choice)
    while len(batch):
        for key, token in batch.step().items():
            got[key].append(token)
            if len(got[key]) == wanted[key]:
                batch.remove(key)
    for key, prompt in prompts.items():
        assert got[key] == alone(net.net, prompt, wanted[key]), key  # GPT's cached decoding: the same tokens


def scored_alone(net: torch.nn.Module, ids: list[int]) -> list[tuple[float, int]]:
    """``(log-probability, likeliest token)`` of each token of ``ids`` after the first, from one forward pass."""
    logprobs = torch.log_softmax(net(torch.tensor([ids]))[0, :-1].float(), dim=-1)  # (T - 1, V)
    chosen = logprobs.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    return list(zip(chosen.tolist(), logprobs.argmax(dim=-1).tolist(), strict=True))


@pytest.mark.parametrize("prefill_tokens", [4, 64])
def test_token_scores_in_a_batch_equal_one_forward_pass_over_the_answer(prefill_tokens: int) -> None:
    """A prompt's and its answer's log-probabilities (what /v1/completions returns with echo and logprobs)
    equal those of one forward pass over the whole text, prefilled beside other answers (in chunks of 4, or
    with 64 in one pass with a longer prompt, right-padded), and each top list starts with the likeliest
    token; an answer that asked none gets none."""
    net = context_dependent_gpt()
    batch, got = DecodeBatch(net, prefill_tokens=prefill_tokens), {"scored": [], "other": [], "plain": []}
    prompts = {"scored": list(range(60, 71)), "other": [3, 1, 4, 1, 5], "plain": list(range(20, 36))}
    batch.add("other", prompts["other"], greedy_choice, top_logprobs=2)  # its answer's scores only
    got["other"] += batch.step().values()
    batch.add("scored", prompts["scored"], greedy_choice, top_logprobs=3, score_prompt=True)
    batch.add("plain", prompts["plain"], greedy_choice)
    scores = {key: [] for key in prompts}
    for _ in range(12):
        for key, token in batch.step().items():
            got[key].append(token)
        for key in prompts:
            scores[key] += batch.take_scores(key)
    ids = prompts["scored"] + got["scored"]
    assert [score.token for score in scores["scored"]] == ids and scores["scored"][0].logprob is None
    for score, (logprob, likeliest) in zip(scores["scored"][1:], scored_alone(net, ids), strict=True):
        assert score.logprob == pytest.approx(logprob, abs=1e-5) and score.top[0][0] == likeliest
        assert len(score.top) == 3 and score.top[0][1] >= score.top[1][1] >= score.top[2][1]
    other = prompts["other"] + got["other"]
    assert [score.token for score in scores["other"]] == got["other"]
    expected = scored_alone(net, other)[len(prompts["other"]) - 1 :]
    assert [score.logprob for score in scores["other"]] == pytest.approx([lp for lp, _ in expected], abs=1e-5)
    assert scores["plain"] == []
    with pytest.raises(ValueError, match="at most the context"):
        batch.add("long", list(range(net.block_size + 1)), greedy_choice, top_logprobs=0, score_prompt=True)


def test_an_answers_pieces_of_one_send_join_in_order_and_its_end_follows_them() -> None:
    """``stream_interval``: the pieces of several steps go out as one per answer, text in order, the last
    piece's finish reason and usage, a completion's scores in order, and each answer's end after its text."""
    from litserve.loops.continuous_batching_loop import Output
    from litserve.utils import LitAPIStatus

    from {{ cookiecutter.package_name }}.serving.openai_api import joined_pieces

    ok, done = LitAPIStatus.OK, LitAPIStatus.FINISH_STREAMING
    steps = [
        Output("a", {"role": "assistant", "content": "Ca"}, ok),
        Output("b", {"text": "wh", "scores": [[1, -0.5, []]]}, ok),
        Output("a", {"role": "assistant", "content": "ll", "finish_reason": "length", "completion_tokens": 4}, ok),
        Output("a", "", done),
        Output("b", {"text": "ale", "scores": [[2, -0.25, []]], "finish_reason": None}, ok),
        Output("c", RuntimeError("boom"), LitAPIStatus.ERROR),
    ]
    assert joined_pieces(steps) == [
        Output("a", {"role": "assistant", "content": "Call", "finish_reason": "length", "completion_tokens": 4}, ok),
        Output("b", {"text": "whale", "scores": [[1, -0.5, []], [2, -0.25, []]], "finish_reason": None}, ok),
        steps[3],
        steps[5],
    ]


def test_prompts_are_prepared_off_the_event_loop_and_within_a_time_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokenizing and rendering run in a thread: the HTTP process answers /health and other clients meanwhile."""
    from {{ cookiecutter.package_name }}.serving import openai_api  # after the module's check for litserve

    released = threading.Event()

    async def prepared_while_the_loop_runs() -> bool:
        work = asyncio.ensure_future(openai_api.off_the_loop(released.wait, 30))
        await asyncio.sleep(0.1)  # the work starts: on the loop itself, it would hold it for 30 s
        released.set()  # what the loop does meanwhile: here, let the work end
        return await work

    assert asyncio.run(prepared_while_the_loop_runs()) is True  # on the loop: False, after 30 s
    monkeypatch.setattr(openai_api, "PREPARE_TIMEOUT_S", 0.05)
    with pytest.raises(
        openai_api.OpenAIError, match=r"^prompt: preparing it took over 0.05 s; send a shorter one$"
    ) as late:
        asyncio.run(openai_api.off_the_loop(time.sleep, 1))
    assert (late.value.status, late.value.param) == (413, "prompt")


def test_the_plain_chat_template_renders_each_role_and_refuses_others() -> None:
    template = ChatTemplate(ByteTokenizer())
    assert template.render(CHAT) == "system: Answer as Ishmael.\nuser: Call me Ishmael.\nassistant: "
    assert template.ids(CHAT) == list(template.render(CHAT).encode())
    assert template.stops == ("\nsystem:", "\nuser:")
    with pytest.raises(ValueError, match=r"messages\[1\]\.role is 'robot'"):
        template.render([CHAT[0], {"role": "robot", "content": "beep"}])
    with pytest.raises(ValueError, match="messages is empty"):
        template.ids([])


# ---- the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Trained:
    folder = tmp_path_factory.mktemp("chat")
    cli = main(["fit", *shrunk_args(folder), "--data.init_args.block_size=64"])
    return load_trained(cli.trainer.checkpoint_callback.best_model_path)


@pytest.fixture(scope="module")
def chat_server(trained: Trained, tmp_path_factory: pytest.TempPathFactory):
    """``(trained, port, log file, process)`` of ``serve --api openai --max_tokens 4000 --max_batch_size 4`` over the
    module's checkpoint: a worker generates up to 4 answers at once, and a fifth request waits. A piece per
    token (``--stream_interval 0``), so that a stream's pieces do not depend on the machine's speed."""
    args = ("--max_tokens=4000", f"--max_batch_size={AT_ONCE}", "--stream_interval=0")
    with serving(trained.checkpoint, tmp_path_factory.mktemp("serve"), *args, api="openai") as running:
        port, process, log = running
        yield trained, port, log, process


OPENED: list["openai.OpenAI"] = []


def client(port: int) -> "openai.OpenAI":
    """An ``openai`` client of the server on ``port``, closed after the test (its pooled connections too)."""
    api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
    OPENED.append(api)
    return api


@pytest.fixture(autouse=True)
def close_clients():
    yield
    while OPENED:
        OPENED.pop().close()


@pytest.mark.slow
def test_the_openai_client_gets_whole_and_streamed_answers_equal_to_the_model(chat_server) -> None:
    trained, port, _, _ = chat_server
    api = client(port)
    assert [model.id for model in api.models.list().data] == [NAME]

    text, reason, tokens, prompt = answer_in_process(trained, CHAT, max_new_tokens=40, temperature=0)
    whole = api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=40, temperature=0)
    assert whole.choices[0].message.content == text and whole.choices[0].finish_reason == reason == "length"
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens, whole.usage.total_tokens) == (
        prompt,
        tokens,
        prompt + tokens,
    )
    assert whole.model == NAME

    chunks = list(api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=40, temperature=0, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == text
    assert len({chunk.id for chunk in chunks}) == 1 and len(chunks) > 2  # one answer, in pieces
    assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == tokens

    stop = text[10:12]  # a stop string ends the answer before it, and says so
    cut = api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=40, temperature=0, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"

    sampled = [
        api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=30, temperature=0.9, top_p=0.95, seed=3)
        for _ in range(2)
    ]
    expected, *_ = answer_in_process(trained, CHAT, max_new_tokens=30, temperature=0.9, top_p=0.95, seed=3)
    assert [answer.choices[0].message.content for answer in sampled] == [expected, expected]

    def stream(_: int) -> str:
        chunks = api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=40, temperature=0, stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in chunks)

    # Concurrent streams all complete, each whole: generated together, those beyond --max_batch_size
    # once a place is free.
    with ThreadPoolExecutor(max_workers=AT_ONCE + 2) as pool:
        assert list(pool.map(stream, range(AT_ONCE + 2))) == [text] * (AT_ONCE + 2)


@pytest.mark.slow
def test_a_short_request_is_answered_while_a_long_answer_streams(chat_server) -> None:
    """No head-of-line blocking: the short answer joins the long one's steps instead of waiting for its end."""
    trained, port, _, _ = chat_server
    api = client(port)
    long = api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=3000, temperature=0, stream=True)
    events = []

    def read_long() -> str | None:
        chunks = list(long)
        events.append("long answer ended")
        return chunks[-1].choices[0].finish_reason

    with ThreadPoolExecutor(max_workers=1) as pool:
        ended = pool.submit(read_long)
        short = api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=5, temperature=0)
        events.append("short answer received")
        assert ended.result() == "length"  # the long answer ran its 3000 tokens
    assert events == ["short answer received", "long answer ended"]
    assert short.choices[0].message.content == answer_in_process(trained, CHAT, max_new_tokens=5, temperature=0)[0]


@pytest.mark.slow
def test_answers_served_together_equal_those_decoded_alone(trained: Trained, tmp_path: Path) -> None:
    """Requests of different lengths, sent together and one after another, each answered greedily as the model
    alone answers it, token for token, while they share the worker's forward passes.

    The served net's weights are redrawn larger than trained ones (std 0.3), so that each token depends on
    its context: the short-trained model's answers are repetitive enough that a batch with wrong positions
    gave the same text (seen), where these do not."""
    checkpoint = torch.load(trained.checkpoint, map_location="cpu", weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for name, value in checkpoint["state_dict"].items():
        if name.startswith("net.") and value.is_floating_point():
            value.normal_(0.0, 0.3, generator=generator)
    sensitive = tmp_path / "sensitive.ckpt"
    torch.save(checkpoint, sensitive)
    model = load_trained(sensitive)
    questions = [
        ([{"role": "user", "content": "Call me Ishmael."}], 120),
        ([{"role": "user", "content": "The whale"}], 7),
        (CHAT, 60),
        ([{"role": "user", "content": "Queequeg, " * 2}, {"role": "assistant", "content": "Aye."}], 200),
        ([{"role": "user", "content": "Sea"}], 30),
        ([{"role": "user", "content": "Ahab"}], 90),
    ]  # six requests for four places: two join as others leave
    expected = [answer_in_process(model, asked, max_new_tokens=tokens, temperature=0)[0] for asked, tokens in questions]
    args = ("--max_tokens=4000", f"--max_batch_size={AT_ONCE}")
    with serving(sensitive, tmp_path, *args, api="openai") as (port, _, _), client(port) as api:

        def ask(index: int) -> str:
            time.sleep(0.05 * index)  # staggered: each joins answers already under way
            messages, tokens = questions[index]
            answer = api.chat.completions.create(model=NAME, messages=messages, max_tokens=tokens, temperature=0)
            return answer.choices[0].message.content

        with ThreadPoolExecutor(max_workers=len(questions)) as pool:
            served = list(pool.map(ask, range(len(questions))))
    assert served == expected


REFUSED = {  # the request's extra fields -> (status, the param named)
    "max_tokens below 1": ({"max_tokens": -1}, 400, "max_tokens"),
    "max_tokens over the server's limit": ({"max_tokens": 5000}, 422, "max_tokens"),
    "an unknown model": ({"model": "gpt-4o"}, 404, "model"),
    "temperature out of range": ({"temperature": 3}, 400, "temperature"),
    "top_p out of range": ({"top_p": 0}, 400, "top_p"),
    "a seed past 64 bits": ({"seed": 2**64}, 400, "seed"),
    "several choices": ({"n": 2}, 400, "n"),
    "tools": (
        {"tools": [{"type": "function", "function": dict(name="f", description="", parameters={})}]},
        400,
        "tools",
    ),
    "a tool without a description": ({"tools": [{"type": "function", "function": dict(name="f")}]}, 400, "tools"),
    "a penalty": ({"presence_penalty": 1.0}, 400, "presence_penalty"),
    "an unknown field": ({"best_of": 3}, 400, "best_of"),
    "too many stop strings": ({"stop": [str(n) for n in range(17)]}, 400, "stop"),
    "a stop string of 100,000 characters": ({"stop": "x" * 100_000}, 400, "stop"),
    "an unknown role": ({"messages": [{"role": "robot", "content": "beep"}]}, 400, "messages"),
    "a conversation longer than the context": (
        {"messages": [{"role": "user", "content": "x" * 5000}]},
        400,
        "messages",
    ),
    "an image": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": dict(url="data:,")}]}]},
        400,
        "messages",
    ),
    "no messages": ({"messages": []}, 400, "messages"),
}


@pytest.mark.slow
def test_refused_requests_get_the_openai_error_shape_naming_the_field(chat_server) -> None:
    _, port, _, _ = chat_server
    for case, (fields, status, param) in REFUSED.items():
        body = {"model": NAME, "messages": CHAT, **fields}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60).close()
        with refused.value:
            error = json.loads(refused.value.read())["error"]
        assert (refused.value.code, error["param"]) == (status, param), (case, error)
        assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"], case
        assert param in error["message"] or case == "an unknown role", (case, error)
    # The client raises its own exception classes for them, as it does for OpenAI's API.
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        client(port).chat.completions.create(model="gpt-4o", messages=CHAT)
    with pytest.raises(openai.BadRequestError, match="the model reads at most"):
        client(port).chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "x" * 5000}], stream=True
        )
    # And the server answers the next request (sampled: its first token may be the end of text, an empty answer).
    answer = client(port).chat.completions.create(model=NAME, messages=CHAT, max_tokens=3)
    assert answer.choices[0].finish_reason in ("stop", "length") and 1 <= answer.usage.completion_tokens <= 3
    # An unknown route is not an unknown model, and a body that is not JSON names no field.
    routes = (
        ("/v1/embeddings", b"{}", 404, "Invalid URL (POST /v1/embeddings)"),
        ("/v1/chat/completions", b"{not json", 400, "body: not valid JSON"),
    )
    for path, data, status, message in routes:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60).close()
        with refused.value:
            error = json.loads(refused.value.read())["error"]
        assert (refused.value.code, error["code"], error["param"]) == (status, None, None), (path, error)
        assert error["message"].startswith(message), (path, error)
    assert client(port).models.retrieve(NAME).id == NAME  # GET /v1/models/{id}
    with pytest.raises(openai.NotFoundError, match="is not served here"):
        client(port).models.retrieve("gpt-4o")
    # Values inside the ranges are answered, streamed or not: the greedy answer for a vanishing
    # temperature, the likeliest token for a top_p that rounds to 0 in float32.
    likeliest = client(port).chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, temperature=0)
    for extremes in ({"temperature": 1e-40}, {"temperature": 1.0, "top_p": 1e-300}):
        whole = client(port).chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, **extremes)
        assert whole.choices[0].message.content == likeliest.choices[0].message.content, extremes
        chunks = client(port).chat.completions.create(model=NAME, messages=CHAT, max_tokens=8, stream=True, **extremes)
        assert (
            "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
        )


# ---- /v1/completions and make eval ---------------------------------------------------------------


class CountingTokenizer:
    """A tokenizer's ``decode`` (``source``: None for bytes), counting the tokens it is asked to decode."""

    eos_id = None

    def __init__(self, decode: Any, source: str | None) -> None:
        self._decode, self.source, self.decoded = decode, source, 0

    def decode(self, ids: list[int]) -> str:
        self.decoded += len(ids)
        return self._decode(ids)


def metaspace_tokenizer(text: str) -> Any:
    """A SentencePiece-style BPE (Metaspace: a word's space is part of its token, dropped at the start of a
    text, as Llama 2's tokenizer decodes), trained on ``text``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    backend.train_from_iterator([text], trainers.BpeTrainer(vocab_size=200, special_tokens=["<unk>"]))
    return backend


def test_text_offsets_equal_each_prefix_decoded_whole_for_every_kind_of_tokenizer() -> None:
    """``text_offset`` of a scored answer, however its scores arrive (a token at a time, or a whole prompt), is
    the length of the text of the tokens before, decoded whole (a character cut in half not counted): for bytes
    with multi-byte characters and stray bytes, a trained byte-level BPE, and a SentencePiece-style tokenizer
    whose first space is dropped. Decoding costs tokens linear in the answer's length, not quadratic."""
    from {{ cookiecutter.package_name }}.data.tokenizer import BPETokenizer
    from {{ cookiecutter.package_name }}.serving.completions import CUT, ChoiceText

    text = " Call me Ishmael. Il était une baleine naïve, 鯨 and 🐋 — the white hump.\n\nEnd. " * 6
    byte_ids = ByteTokenizer().encode(text)
    byte_ids[40:40] = [0xC3, 0x80, 0x80, 0xE2]  # a character, a stray continuation byte, a character cut short
    bpe = BPETokenizer.train([text], vocab_size=300)
    metaspace = metaspace_tokenizer(text)
    kinds = {
        "bytes": (ByteTokenizer().decode, byte_ids, None),
        "byte-level BPE": (bpe.decode, bpe.encode(text), "bpe"),
        "SentencePiece-style": (metaspace.decode, metaspace.encode(text).ids, "hf"),
    }
    for kind, (decode_ids, ids, source) in kinds.items():
        expected = [len(decode_ids(ids[:i]).rstrip(CUT)) for i in range(len(ids))]
        assert len(set(expected)) > len(ids) // 3, kind  # the text moves on: offsets that could differ
        for chunk in (1, 3, len(ids)):
            tokenizer = CountingTokenizer(decode_ids, source)
            choice = ChoiceText(0, tokenizer, [], echo=False, logprobs=1)
            offsets = []
            for at in range(0, len(ids), chunk):
                offsets += choice.scores([[token, None, []] for token in ids[at : at + chunk]])["text_offset"]
            assert offsets == expected, (kind, chunk)
            assert tokenizer.decoded <= 16 * len(ids), (kind, chunk, tokenizer.decoded)  # all prefixes: ~n^2 / 2


@pytest.mark.slow
def test_completions_carry_the_models_own_log_probabilities(chat_server) -> None:
    """``client.completions.create`` with echo and logprobs, as lm-evaluation-harness sends it: the prompt's
    and the answer's log-probabilities equal one forward pass of the model here, the text is the greedy one,
    whole and streamed, for text and token-id prompts in one request; max_tokens 0 scores the prompt alone."""
    trained, port, _, _ = chat_server
    api, net, tokenizer = client(port), trained.predictor.net, trained.model.tokenizer
    texts = ["Call me Ishmael. Some years ago", "The whale"]
    prompts = [tokenizer.encode(texts[0]), tokenizer.encode(texts[1])]
    greedy = [alone(net, ids, 6) for ids in prompts]
    whole = api.completions.create(model=NAME, prompt=prompts, max_tokens=6, temperature=0, echo=True, logprobs=3)
    as_text = api.completions.create(model=NAME, prompt=texts, max_tokens=6, temperature=0, echo=True, logprobs=3)
    assert [choice.text for choice in as_text.choices] == [choice.text for choice in whole.choices]
    for by_text, by_ids in zip(as_text.choices, whole.choices, strict=True):  # the batch's rows may differ by 1e-7
        assert by_text.logprobs.token_logprobs[1:] == pytest.approx(by_ids.logprobs.token_logprobs[1:], abs=1e-5)
    assert [choice.index for choice in whole.choices] == [0, 1]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (sum(map(len, prompts)), 12)
    for choice, ids, answer in zip(whole.choices, prompts, greedy, strict=True):
        assert choice.text == tokenizer.decode(ids + answer) and choice.finish_reason == "length"
        logprobs = choice.logprobs
        assert len(logprobs.tokens) == len(ids) + 6 and logprobs.token_logprobs[0] is None
        assert logprobs.top_logprobs[0] is None and logprobs.text_offset[:3] == [0, 1, 2]
        expected = scored_alone(net, ids + answer)
        assert logprobs.token_logprobs[1:] == pytest.approx([logprob for logprob, _ in expected], abs=1e-4)
        for top, chosen in zip(logprobs.top_logprobs[len(ids) :], logprobs.token_logprobs[len(ids) :], strict=True):
            assert max(top.values()) == pytest.approx(chosen, abs=1e-6)  # greedy: the likeliest was taken
    settings = {"model": NAME, "prompt": texts[0], "max_tokens": 6, "temperature": 0, "echo": True, "logprobs": 1}
    chunks = list(api.completions.create(**settings, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6  # what include_usage asks
    chunks = chunks[:-1]
    assert "".join(chunk.choices[0].text for chunk in chunks) == whole.choices[0].text
    streamed = [value for chunk in chunks for value in chunk.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and chunks[-1].choices[0].finish_reason == "length"  # equal, whatever else is decoded
    assert streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:], abs=1e-5)  # in the batch
    scored = api.completions.create(model=NAME, prompt=prompts[1], max_tokens=0, echo=True, logprobs=0)
    assert scored.choices[0].text == texts[1] and scored.usage.completion_tokens == 0
    expected = whole.choices[1].logprobs.token_logprobs[1 : len(prompts[1])]
    assert scored.choices[0].logprobs.token_logprobs[1:] == pytest.approx(expected, abs=1e-5)
    assert len(scored.choices[0].logprobs.tokens) == len(prompts[1])
    plain = api.completions.create(model=NAME, prompt=texts[1], max_tokens=6, temperature=0, stop=["zzz"])
    assert plain.choices[0].text == tokenizer.decode(greedy[1]) and plain.choices[0].logprobs is None


COMPLETIONS_REFUSED = {  # the body's fields -> (status, the param named)
    "a prompt longer than the context": ({"prompt": "x" * 5000}, 400, "prompt"),
    "a token outside the vocabulary": ({"prompt": [1, 2, 1_000_000]}, 400, "prompt"),
    "an empty prompt": ({"prompt": ""}, 400, "prompt"),
    "no prompt at all": ({"prompt": []}, 400, "prompt"),
    "too many alternatives": ({"prompt": "a", "logprobs": 21}, 400, "logprobs"),
    "more than one choice": ({"prompt": "a", "n": 2}, 400, "n"),
    "best_of": ({"prompt": "a", "best_of": 3}, 400, "best_of"),
    "a suffix": ({"prompt": "a", "suffix": "b"}, 400, "suffix"),
    "negative max_tokens": ({"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    "more tokens than the server gives": ({"prompt": "a", "max_tokens": 5000}, 422, "max_tokens"),
    "an unknown model": ({"prompt": "a", "model": "gpt-4o"}, 404, "model"),
    "an unknown field": ({"prompt": "a", "guidance": 1}, 400, "guidance"),
    "text and token ids mixed": ({"prompt": ["a", [1, 2]]}, 400, "prompt"),
}


@pytest.mark.slow
def test_refused_completions_name_the_field_and_the_tokenizer_endpoints_answer(chat_server) -> None:
    _, port, _, _ = chat_server
    for case, (fields, status, param) in COMPLETIONS_REFUSED.items():
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", data=json.dumps({"model": NAME, **fields}).encode()
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60).close()
        with refused.value:
            error = json.loads(refused.value.read())["error"]
        assert (refused.value.code, error["param"]) == (status, param), (case, error)
        assert param in error["message"] and "\n" not in error["message"], (case, error)

    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.load(answer)

    tokens = post("/tokenize", {"prompt": "Ahoy, café!", "add_special_tokens": False})
    assert tokens["tokens"] == ByteTokenizer().encode("Ahoy, café!") and tokens["count"] == len(tokens["tokens"])
    assert post("/detokenize", {"tokens": tokens["tokens"]}) == {"prompt": "Ahoy, café!"}
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/tokenizer_info", timeout=60) as answer:
        info = json.load(answer)
    assert info["eos_token"] is None and info["model_max_length"] == tokens["max_model_len"] == 64  # no text is 0xFF


def test_make_eval_names_a_folder_without_tasks_a_missing_harness_and_a_server_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from {{ cookiecutter.package_name }}.commands import evaluate

    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with user_error(r"--include .*: no task YAML there"):
        evaluate.main(["--include", str(tmp_path), "--url", nowhere])
    os.mkfifo(tmp_path / "waits.yaml")  # a plain open would wait for a writer forever
    with user_error(r"--include .*waits\.yaml is not a regular file \(a folder, FIFO or device\): refused"):
        evaluate.main(["--include", str(tmp_path), "--url", nowhere])
    (tmp_path / "waits.yaml").unlink()
    with user_error(r"--url: no OpenAI API of this project answers .*/tokenizer_info .*start `make serve`"):
        evaluate.main(["--url", nowhere, "--lm_eval", "lm-eval", "--include", str(ROOT / "evals")])
    monkeypatch.setenv("PATH", str(tmp_path))  # neither lm-eval nor uv on it, nor beside this Python
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with user_error("lm-evaluation-harness is not installed and uv is not on the PATH: pip install"):
        evaluate.main(["--url", nowhere, "--include", str(ROOT / "evals")])


def harness_or_skip() -> None:
    """Skip unless lm-evaluation-harness can run: installed, or uv on the PATH to run it (CI has uv)."""
    if not (shutil.which("lm-eval") or shutil.which("uv") or (Path(sys.executable).parent / "lm-eval").exists()):
        pytest.skip("lm-evaluation-harness needs lm-eval installed or uv on the PATH (make eval runs it with uv)")


@pytest.mark.slow
def test_make_eval_scores_equal_those_computed_in_process(trained: Trained, tmp_path: Path) -> None:
    """``make eval`` (lm-evaluation-harness against the served model, the bake's own tasks) reports the
    accuracy and exact match computed here from the model itself, each log-likelihood equal to ours."""
    harness_or_skip()
    output = tmp_path / "eval"
    command = ["make", "--no-print-directory", "eval", f"PYTHON={sys.executable}", f"CKPT={trained.checkpoint}"]
    command += [f"ARGS=--output {output} --log_samples=true"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    (results,) = output.rglob("results_*.json")
    assert f"make eval: scoring {trained.checkpoint}" in done.stdout
    assert f"make eval: results in {results}" in done.stdout
    scores = json.loads(results.read_text())["results"]
    net, tokenizer = trained.predictor.net, trained.model.tokenizer

    def loglikelihood(context: str, continuation: str) -> float:
        ids = tokenizer.encode(context + continuation)
        scored_from = len(tokenizer.encode(context.rstrip()))  # the harness scores a context's trailing spaces
        return sum(logprob for logprob, _ in scored_alone(net, ids)[scored_from - 1 :])  # with the continuation

    items = [json.loads(line) for line in (ROOT / "evals/moby_dick_continuations.jsonl").read_text().splitlines()]
    likelihoods = [[loglikelihood(item["context"], choice) for choice in item["choices"]] for item in items]
    picked = [max(range(len(row)), key=row.__getitem__) for row in likelihoods]  # the likeliest choice
    accuracy = sum(choice == item["answer"] for choice, item in zip(picked, items, strict=True))
    assert scores["moby_dick_continuations"]["acc,none"] == pytest.approx(accuracy / len(items), abs=1e-9)
    (samples,) = output.rglob("samples_moby_dick_continuations_*.jsonl")
    for line in samples.read_text().splitlines():
        sample = json.loads(line)
        served = [float(response[0][0]) for response in sample["resps"]]
        assert served == pytest.approx(likelihoods[sample["doc_id"]], abs=1e-3), sample["doc_id"]

    stops = (" ", ",", ".", ";", ":", "!", "?", "\n")
    words = [json.loads(line) for line in (ROOT / "evals/moby_dick_words.jsonl").read_text().splitlines()]
    hits = 0
    for item in words:
        text = tokenizer.decode(alone(net, tokenizer.encode(item["context"]), 16))
        hits += re.split("|".join(map(re.escape, stops)), text)[0] == item["answer"]
    assert scores["moby_dick_words"]["exact_match,none"] == pytest.approx(hits / len(words), abs=1e-9)


@pytest.mark.slow
def test_a_client_that_disconnects_stops_its_generation(chat_server) -> None:
    _, port, log, _ = chat_server
    # Greedy: a sampled answer may draw the end-of-text byte (about 1 in 256 a token for a model
    # this short-trained) and end by itself before the server sees the client go, which then
    # tests nothing; the greedy answer never picks a byte the training text never held.
    request = {"model": NAME, "messages": CHAT, "max_tokens": 4000, "temperature": 0, "stream": True}
    stream = client(port).chat.completions.create(**request)
    for index, chunk in enumerate(stream):
        assert chunk.choices[0].finish_reason is None
        if index == 2:
            break
    stream.close()
    deadline = time.monotonic() + 60
    while not (stopped := re.findall(r"client disconnected after (\d+) tokens", log.read_text())):
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    assert int(stopped[-1]) < 4000  # stopped early: the worker is free for the next request
    assert client(port).chat.completions.create(model=NAME, messages=CHAT, max_tokens=5).choices[0].finish_reason
    # A streamed completion of two prompts: both stop, the one being sent and the one waiting its turn.
    before = len(stopped)
    prompts = ["Call", "Ahab"]
    texts = client(port).completions.create(model=NAME, prompt=prompts, max_tokens=4000, temperature=0, stream=True)
    for index, _ in enumerate(texts):
        if index == 2:
            break
    texts.close()
    while len(stopped := re.findall(r"client disconnected after (\d+) tokens", log.read_text())) < before + 2:
        assert time.monotonic() < deadline + 60, log.read_text()[-3000:]
        time.sleep(0.2)
    assert all(int(count) < 4000 for count in stopped[before:])
    # Whole answers, not streamed: Starlette cancels nothing when their client goes, the server must see it.
    before = len(stopped)
    chat = {"model": NAME, "messages": CHAT, "max_tokens": 4000, "temperature": 0}
    hang_up_after_sending(port, "/v1/chat/completions", chat)
    hang_up_after_sending(
        port, "/v1/completions", {"model": NAME, "prompt": prompts, "max_tokens": 4000, "temperature": 0}
    )
    while len(stopped := re.findall(r"client disconnected after (\d+) tokens", log.read_text())) < before + 3:
        assert time.monotonic() < deadline + 120, log.read_text()[-3000:]  # without the watch: 3 x 4000 tokens
        time.sleep(0.2)
    assert all(int(count) < 4000 for count in stopped[before:])
    assert client(port).completions.create(model=NAME, prompt="Call", max_tokens=5).choices[0].finish_reason


def hang_up_after_sending(port: int, path: str, body: dict[str, Any]) -> None:
    """POST ``body`` and close the connection half a second later, before the answer (a client that gave up)."""
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    with socket.create_connection(("127.0.0.1", port)) as connection:
        connection.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        time.sleep(0.5)


@pytest.mark.slow
def test_an_idle_server_leaves_the_cpu_idle(chat_server) -> None:
    """LitServe's continuous batching loop, left as it is, polls without pause: a core busy while nobody asks."""
    psutil = pytest.importorskip("psutil")
    _, port, _, process = chat_server
    with client(port) as api:  # a request first: the worker has served one and is idle again
        assert api.chat.completions.create(model=NAME, messages=CHAT, max_tokens=3).choices
    processes = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    before = [sum(process.cpu_times()[:2]) for process in processes]
    time.sleep(3)
    used = [sum(process.cpu_times()[:2]) - start for process, start in zip(processes, before, strict=True)]
    assert max(used) < 0.3, used  # CPU seconds in 3 s of wall time, per process


def readme_serving_code() -> tuple[str, str]:
    """The documentation's ``openai`` client code and its streaming ``curl`` (docs/shipping.md), as written there."""
    text = documentation()
    code = re.search(r"```python\n(from openai import OpenAI\n.*?)```", text, flags=re.DOTALL).group(1)
    code += re.search(r"```python\n(prompt = .*?)```", text, flags=re.DOTALL).group(1)  # the scored prompt, after it
    curl = next(line for line in text.splitlines() if line.startswith("curl -sN localhost:8000/v1/chat/completions"))
    return code, curl


@pytest.mark.slow
def test_the_readmes_client_code_and_curl_run_as_written(chat_server) -> None:
    _, port, _, _ = chat_server
    code, curl = readme_serving_code()
    done = subprocess.run(
        [sys.executable, "-c", code.replace("127.0.0.1:8000", f"127.0.0.1:{port}")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "CompletionUsage(completion_tokens=" in done.stdout, done.stdout
    assert float(re.search(r"(-[0-9.]+)\s*$", done.stdout).group(1)) < 0  # the prompt's log-likelihood
    events = subprocess.run(
        shlex.split(curl.replace("localhost:8000", f"localhost:{port}")),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split("\n\n")
    events = [event for event in events if event.strip()]
    assert events[-1] == "data: [DONE]" and all(event.startswith("data: {") for event in events[:-1]), events[-3:]
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] in ("stop", "length") and last["usage"]["completion_tokens"] > 0


STUCK_WORKER = """
import os, time
from {{ cookiecutter.package_name }}.models.language_model import ChatAnswer

add = ChatAnswer.add


def stuck_after_its_first_token(self, token):
    piece = add(self, token)
    if self.count == 1 and float(os.environ["STUCK_SECONDS"]):
        time.sleep(float(os.environ["STUCK_SECONDS"]))
    return piece


ChatAnswer.add = stuck_after_its_first_token
"""


@pytest.mark.slow
def test_health_answers_503_while_a_worker_is_stuck(trained: Trained, tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(STUCK_WORKER)  # the worker sleeps after its first token
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "STUCK_SECONDS": "8"}
    with serving(trained.checkpoint, tmp_path, "--timeout=2", api="openai", env=env) as (port, _, _):
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(client(port).chat.completions.create, model=NAME, messages=CHAT, max_tokens=5)
            # Polled until the answer ends, not for a fixed time: on a loaded machine the first token, and
            # the stall after it, can come late.
            deadline, statuses = time.monotonic() + 120, []
            while not answer.done() and time.monotonic() < deadline and 503 not in statuses:
                statuses.append(health(port))
                time.sleep(0.5)
            assert 503 in statuses, statuses  # the generation stalled past --timeout
            assert answer.result(timeout=120).choices[0].finish_reason  # it ends, and so does the stall
        assert health(port) == 200


def health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            return answer.status
    except urllib.error.HTTPError as error:
        error.close()
        return error.code


CAPITALS = {"France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Japan": "Tokyo", "Egypt": "Cairo", "Peru": "Lima"}
CAPITALS |= {"Kenya": "Nairobi", "Norway": "Oslo", "Cuba": "Havana", "Poland": "Warsaw", "Greece": "Athens"}


@pytest.mark.slow
def test_the_readmes_chat_finetune_of_the_byte_gpt_learns_to_stop(tmp_path: Path) -> None:
    """README "Teach the byte model to chat", its commands as written in a copy of the project: the byte
    GPT of a short `make train`, fine-tuned on chats from its checkpoint, ends its served greedy answer
    itself (the end-of-text byte: finish_reason "stop"), not at max_tokens."""
    project = tmp_path / "project"
    shutil.copytree(ROOT, project, ignore=shutil.ignore_patterns(".venv", "logs", ".git", "wandb", "__pycache__"))
    asked = [(f"What is the capital of {country}?", f"{city}.") for country, city in CAPITALS.items()]
    chats = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]} for q, a in asked]
    (project / "chats.jsonl").write_text("".join(json.dumps(chat) + "\n" for chat in chats))
    env = {**os.environ, "WANDB_MODE": "offline", "PYTHONPATH": str(project / "src")}
    env.pop("PYTEST_ADDOPTS", None)

    def make(command: str) -> None:
        done = subprocess.run(
            ["bash", "-c", f"{command} PYTHON={sys.executable}"], cwd=project, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"

    make('make train ARGS="--trainer.max_steps=20"')  # a short `make train`: the checkpoint to start from
    (pretrained,) = (project / "logs").rglob("last.ckpt")
    train, serve = readme_commands("Chat fine-tuning")
    assert serve == "make serve" and "CKPT" in train
    make(train.replace("CKPT", str(pretrained)))
    (tuned,) = (path for path in (project / "logs").rglob("last.ckpt") if path != pretrained)
    trained = load_trained(tuned)
    assert trained.model.hparams.init_from == str(pretrained)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    text, reason = served_as_run_here(trained, question, max_tokens=40, folder=tmp_path)
    # What it says is not the test: a GPT of 20 steps' training answers as it can (runs on one machine gave
    # "Aon\nns." and ""), but it ends the answer itself, with the end-of-text byte, well before max_tokens.
    assert reason == "stop" and len(text.encode()) < 40, (text, reason)
