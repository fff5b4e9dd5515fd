"""``POST /v1/completions`` and the tokenizer endpoints: what evaluation harnesses score a served model with.

https://platform.openai.com/docs/api-reference/completions (the OpenAI completions API: text in, text
out, with each token's log-probability), and vLLM's ``/tokenize``, ``/detokenize`` and ``/tokenizer_info``
(https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html), through which EleutherAI's
lm-evaluation-harness (``--model local-completions``) counts a context's tokens with this model's own
tokenizer: a loglikelihood request sends the context and continuation as token ids, with ``echo``,
``logprobs`` and ``max_tokens`` 1, and sums the continuation's log-probabilities.

The HTTP side is :class:`serving.openai_api.ChatSpec`; the worker decodes completions in the same
batch as chat answers (:class:`serving.openai_api.ChatAPI`). Here: the request, what a worker is sent
(:class:`CompletionItem`), and how each choice's text and log-probabilities reach the client
(:class:`ChoiceText`).
"""

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

MAX_LOGPROBS = 20  # the most alternatives per token (OpenAI's limit is 5; vLLM's default 20)
MAX_PROMPTS = 256  # prompts in one request: each is an answer in the batch
END_OF_TEXT = "<|endoftext|>"  # how a log-probability names the end-of-text token that no text encodes to
CUT = "\ufffd"  # what decoding makes of a character whose bytes are not all there yet
LOOKBACK = 4  # tokens decoded again before the settled text: a tokenizer may render a token by its neighbours


class CompletionRequest(BaseModel):
    """The body of ``POST /v1/completions``; fields the OpenAI API has and this server does not honour are
    accepted only at their neutral value (checked by the spec), unknown ones refused.

    ``prompt``: a string, a list of strings, token ids (T,), or lists of token ids: one choice each.
    ``logprobs``: k (0 to :data:`MAX_LOGPROBS`) returns each token's log-probability with the k likeliest
    at its place. ``echo``: the prompt is part of each choice's text (and its tokens of its log-probabilities).
    """

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # the OpenAI API's default
    temperature: float | None = None
    top_p: float | None = None
    n: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    logprobs: int | None = None
    echo: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    best_of: int | None = None
    logit_bias: dict[str, float] | None = None
    suffix: str | None = None
    user: str | None = None


class TokenizeRequest(BaseModel):
    """``POST /tokenize``: ``{"prompt": text}`` -> its token ids (vLLM's shape)."""

    model_config = ConfigDict(extra="ignore")  # vLLM's other fields (add_special_tokens, ...) change nothing here
    prompt: str
    model: str | None = None


class DetokenizeRequest(BaseModel):
    """``POST /detokenize``: ``{"tokens": ids}`` -> their text (vLLM's shape)."""

    model_config = ConfigDict(extra="ignore")
    tokens: list[int]
    model: str | None = None


@dataclass
class CompletionItem:
    """One prompt of a completion request, as the worker gets it (picklable)."""

    request_id: str
    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None
    logprobs: int | None
    echo: bool


def end_of_text(tokenizer: Any) -> str | None:
    """The text that encodes to the end-of-text token alone, if any (a byte tokenizer's 0xFF and a trained
    BPE's ``<|endoftext|>`` come from no text: None)."""
    candidates = (getattr(getattr(tokenizer, "backend", None), "eos_token", None), END_OF_TEXT)
    for text in candidates:
        if isinstance(text, str) and tokenizer.eos_id is not None and tokenizer.encode(text) == [tokenizer.eos_id]:
            return text
    return None


def token_text(tokenizer: Any, token: int) -> str:
    """How a log-probability names ``token``: its text; a byte that is part of a character ``bytes:\\xNN``
    (as the OpenAI API spells it); the end-of-text token ``<|endoftext|>``."""
    if token == tokenizer.eos_id:
        return END_OF_TEXT
    text = tokenizer.decode([token])
    if "\ufffd" in text and tokenizer.source is None:  # a byte tokenizer: the token is that byte
        return f"bytes:\\x{token:02x}"
    return text


class ChoiceText:
    """One choice of a completion as its client gets it, piece by piece: the prompt's text first when
    echoed, then the pieces its worker sends (``{"text", "scores", "finish_reason"}``), each with its
    tokens' log-probabilities in the OpenAI shape (``tokens``, ``token_logprobs``, ``top_logprobs``,
    ``text_offset``: where each token's text starts in the choice's text, in characters).
    """

    def __init__(self, index: int, tokenizer: Any, prompt: list[int], echo: bool, logprobs: int | None) -> None:
        self.index, self.tokenizer, self.logprobs = index, tokenizer, logprobs
        self.echoed = tokenizer.decode(prompt) if echo else ""
        self.scored: list[int] = []  # the tokens whose log-probabilities were given, in order
        self.settled, self.settled_chars = 0, 0  # scored tokens whose text is whole, and its characters
        self.started = False
        self.prompt_tokens, self.completion_tokens = len(prompt), 0

    def piece(self, output: dict[str, Any]) -> dict[str, Any]:
        """A choice of a streamed chunk for the worker's ``output``; the echoed prompt comes with the first."""
        text = output["text"] if self.started else self.echoed + output["text"]
        self.started = True
        self.completion_tokens = output.get("completion_tokens", self.completion_tokens)
        logprobs = self.scores(output["scores"])
        return {"index": self.index, "text": text, "logprobs": logprobs, "finish_reason": output.get("finish_reason")}

    def scores(self, scores: list[list[Any]]) -> dict[str, list] | None:
        """``[[token, log-probability, [[token, log-probability], ...]], ...]`` in the OpenAI shape."""
        if self.logprobs is None:
            return None
        block: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, logprob, top in scores:
            block["text_offset"].append(self.offset())
            self.scored.append(token)
            block["tokens"].append(token_text(self.tokenizer, token))
            block["token_logprobs"].append(logprob)
            if logprob is None:  # a prompt's first token: nothing before it to score it by
                block["top_logprobs"].append(None)
                continue
            likeliest = {token_text(self.tokenizer, other): value for other, value in top}
            likeliest.setdefault(token_text(self.tokenizer, token), logprob)  # the chosen one, as OpenAI
            block["top_logprobs"].append(likeliest)
        return block

    def offset(self) -> int:
        """The characters of the scored tokens' text, a character cut in half not counted: where the next token's
        text starts, ``len(decode(scored).rstrip(CUT))``.

        Decoded from :data:`LOOKBACK` tokens before the last whole text on (the text before is counted
        once; the difference of two decodes of that window, so that a token rendered by its left neighbours,
        as a SentencePiece word's space, counts as in the whole): an answer's offsets cost time linear in its
        tokens, not quadratic (a 2,048-token prompt scored with ``echo`` decoded 2 million tokens).
        """
        start = max(0, self.settled - LOOKBACK)
        before = self.tokenizer.decode(self.scored[start : self.settled])
        text = self.tokenizer.decode(self.scored[start:])
        if text.endswith(CUT):
            return self.settled_chars + len(text.rstrip(CUT)) - len(before)
        self.settled, self.settled_chars = len(self.scored), self.settled_chars + len(text) - len(before)
        return self.settled_chars

    @staticmethod
    def merged(pieces: list[dict[str, Any]]) -> dict[str, Any]:
        """A whole choice from its streamed pieces (the non-streaming answer)."""
        whole = {**pieces[0], "text": "".join(piece["text"] for piece in pieces)}
        whole["finish_reason"] = next((p["finish_reason"] for p in reversed(pieces) if p["finish_reason"]), None)
        if pieces[0]["logprobs"] is not None:
            whole["logprobs"] = {key: [v for p in pieces for v in p["logprobs"][key]] for key in pieces[0]["logprobs"]}
        return whole
