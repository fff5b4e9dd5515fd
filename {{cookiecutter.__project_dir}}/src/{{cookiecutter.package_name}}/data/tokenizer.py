"""The language model's tokenizers: UTF-8 bytes{% if cookiecutter.use_pretrained == "yes" %}, a byte-level BPE trained on the training text, or a
pretrained model's own (Hugging Face).{% else %} or a byte-level BPE trained on the training text.{% endif %}

Each turns text into token ids and says, for each token, how many UTF-8 bytes of the text it
stands for. Summed over a split, those counts turn a loss in nats per token into bits per byte
(total nats / total bytes / ln 2), the unit in which models with different tokenizers compare
(Gao et al., "The Pile", 2020, section 4; nanoGPT's byte-level runs report the same).

:func:`load_tokenizer` is the entry for bytes (``None`` or ``"bytes"``){% if cookiecutter.use_pretrained == "yes" %} and pretrained models (a
folder or hub id, :func:`nets.hub.locate`, read offline){% endif %}. A BPE (``"bpe"``) is trained
on a DataModule's training split (:meth:`BPETokenizer.train`) and travels as JSON:
in the checkpoint{% if cookiecutter.use_prepared == "yes" %}, in the prepared data set{% endif %}{% if cookiecutter.use_serving == "yes" %}, beside an export (``tokenizer.json``){% endif %}.

Text is tokenized in pieces cut only where the tokenizer's pre-tokenizer cuts anyway
(:func:`safe_cut`), so a corpus tokenized a block at a time{{ " (``make prepare``)" if cookiecutter.use_prepared == "yes" else "" }}, or in parallel
pieces, gives exactly the ids of the whole text tokenized at once.
"""

import re
{%- if cookiecutter.use_pretrained == "yes" %}
import sys
{%- endif %}
from collections.abc import {% if cookiecutter.use_pretrained == "yes" %}Callable, {% endif %}Iterable, Iterator
from functools import cache
{%- if cookiecutter.use_pretrained == "yes" %}
from types import FrameType
{%- endif %}
from typing import Protocol

import numpy as np

from {{ cookiecutter.package_name }}.engine import ConfigError, DataError, check_as_written
{%- if cookiecutter.use_pretrained == "yes" %}
from {{ cookiecutter.package_name }}.nets.hub import locate
{%- endif %}

BYTES, BPE = "bytes", "bpe"
EOS = "<|endoftext|>"  # the BPE's one special token (GPT-2's name for it)
PIECE = 1 << 16  # characters per piece tokenized in parallel
{%- if cookiecutter.use_pretrained == "yes" %}
# Lines of a chat template's compiled code one rendering may run: a real template runs tens per message.
TEMPLATE_STEPS = 1_000_000
{%- endif %}
# Positions where pre-tokenizers that split words at spaces (GPT-2's byte-level regex, GPT-4's and
# Llama 3's) always cut: before a space between two letters ("a| b"), and after a line end between
# two non-spaces ("end\n|Next"). A run of blank lines or spaces is never cut: "\n\n" is one token at
# the end of a piece but two in the whole text.
SAFE = re.compile(r"(?<=[^\W\d_])(?= [^\W\d_])|(?<=\S\n)(?=\S)")


def last_safe_cut(text: str, stop: int, start: int = 0) -> int | None:
    """The last safe cut position (:data:`SAFE`) in ``text[start:stop]``, judged from those characters
    alone; None if there is none. Searched backwards from ``stop`` in growing windows."""
    width = PIECE // 2
    while True:
        low = max(start, stop - width)
        cuts = [match.start() for match in SAFE.finditer(text, low, stop)]
        if cuts and cuts[-1] > start:
            return cuts[-1]
        if low == start:
            return None
        width *= 8


def safe_pieces(text: str, size: int = PIECE) -> list[str]:
    """``text`` cut at safe positions into pieces of about ``size`` characters (joined: ``text``).

    Text with no safe position in a long stretch (no spaces between letters, no single line ends)
    is cut there anyway every ``size`` characters; its tokens at those cuts may differ from the
    whole text's.
    """
    pieces, start = [], 0
    while start < len(text):
        end = len(text)
        if start + size < len(text):
            end = last_safe_cut(text, start + size, start) or start + size
        pieces.append(text[start:end])
        start = end
    return pieces


def safe_stream(texts: Iterable[str], size: int = 1 << 24) -> Iterator[str]:
    """Consecutive ``texts`` regrouped into pieces of about ``size`` characters or more that end at
    safe positions (the last piece at the end), so that tokenizing the pieces one by one gives the
    ids of the whole. A tail with no safe position waits for the next text (up to 4 ``size``)."""
    carry = ""
    for text in texts:
        carry += text
        if len(carry) >= size:
            cut = last_safe_cut(carry, len(carry)) or (len(carry) if len(carry) >= 4 * size else None)
            if cut is not None:
                yield carry[:cut]
                carry = carry[cut:]
    if carry:
        yield carry


def check_bpe_vocab_size(size: int) -> None:
    """Refuse a BPE vocabulary below 258: 256 bytes, the end token, one merge.

    Raises:
        ValueError: names ``data.bpe_vocab_size``.
    """
    if size < 258:
        raise ConfigError(f"data.bpe_vocab_size must be at least 258 (256 bytes, an end token, a merge), got {size}")


class Tokenizer(Protocol):
    source: str | None  # None for bytes; "bpe" for a trained BPE{{ '; else the folder or hub id it was read from' if cookiecutter.use_pretrained == "yes" else '' }}
    vocab_size: int
    eos_id: int | None  # the end-of-text token appended after a completion (None: the tokenizer has none)

    def encode(self, text: str) -> list[int]: ...

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


BYTE_EOS = 0xFF  # never a byte of UTF-8 text (RFC 3629, section 1): free to mean "end of text"


class ByteTokenizer:
    """Token ids are the UTF-8 bytes of the text: a vocabulary of 256, nothing to train or download.

    The byte 0xFF, which no UTF-8 text contains, is the end-of-text token (:data:`BYTE_EOS`): appended
    after a completion or an assistant's turn in fine-tuning, so a chat model learns to stop, and
    where generation{{ ' and serving' if cookiecutter.use_serving == 'yes' else '' }} stop{{ '' if cookiecutter.use_serving == 'yes' else 's' }}. Encoding text never gives it; decoding leaves it out.
    """

    source = None
    vocab_size = 256
    eos_id = BYTE_EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]:
        ids = self.encode(text)
        return ids, [1] * len(ids)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids`` without end-of-text bytes; a multi-byte character cut in half shows as U+FFFD."""
        return bytes(i for i in ids if i != BYTE_EOS).decode("utf-8", errors="replace")
{%- if cookiecutter.use_pretrained == "yes" %}


class PretrainedTokenizer:
    """A pretrained model's tokenizer (``transformers.AutoTokenizer``, a fast one), read from local files only.

    Raises:
        engine.errors.MissingFileError, ConfigError: see :func:`nets.hub.locate`; or the
            folder has no fast (Rust) tokenizer, whose offsets the byte counts need.
    """

    def __init__(self, source: str, key: str = "data.tokenizer") -> None:
        from transformers import AutoTokenizer

        found = locate(source, key=key)
        try:
            backend = AutoTokenizer.from_pretrained(found.folder, local_files_only=True, trust_remote_code=False)
        except Exception as error:  # data: every failure of the loader on it is the folder's (nets.hf.from_files)
            said = " ".join(f"{type(error).__name__}: {error}".split())[:300]
            raise ConfigError(f"{key}: {found.folder} holds no tokenizer transformers can read ({said})") from None
        if not backend.is_fast:
            raise ConfigError(f"{key}: {found.folder} has no fast tokenizer (tokenizer.json); convert it or use bytes")
        self.source, self.backend = source, backend
        self.vocab_size = len(backend)
        self.eos_id = backend.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.encode_with_bytes(text)[0]

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` and the UTF-8 bytes each stands for: up to its end, from the previous token's end."""
        pieces = safe_pieces(text)
        encoded = self.backend(pieces, add_special_tokens=False, return_offsets_mapping=True)  # in parallel
        ids, counts = [], []
        for piece, piece_ids, offsets in zip(pieces, encoded["input_ids"], encoded["offset_mapping"], strict=True):
            ends = np.array([end for _, end in offsets], dtype=np.int64)  # character offsets
            # UTF-8 bytes before each character: 1 to 4 bytes per code point.
            points = np.frombuffer(piece.encode("utf-32-le"), dtype=np.uint32)
            widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
            byte_ends = np.concatenate([[0], np.cumsum(widths)])[ends]
            ids += piece_ids
            counts += np.diff(np.concatenate([[0], byte_ends])).tolist()
        return ids, counts

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)
{%- endif %}


class BPETokenizer:
    """A byte-level BPE (Sennrich et al., "Neural Machine Translation of Rare Words with Subword Units",
    2016; bytes as the base alphabet as in GPT-2, Radford et al. 2019) trained with Hugging Face
    ``tokenizers`` (https://huggingface.co/docs/tokenizers/pipeline).

    Every byte is in the vocabulary, so any text encodes (no unknown token) and decoding gives the
    text back exactly; each token stands for a fixed byte string, whose length is its byte count.
    ``<|endoftext|>`` is the one special token (id 0, never produced by encoding text).
    """

    source = BPE

    def __init__(self, backend) -> None:  # a tokenizers.Tokenizer
        self.backend = backend
        self.vocab_size = backend.get_vocab_size()
        self.eos_id = backend.token_to_id(EOS)
        # Byte-level tokens spell each byte as one character: a token's length is its bytes.
        self.token_bytes = np.zeros(self.vocab_size, dtype=np.int64)
        for token, index in backend.get_vocab().items():
            self.token_bytes[index] = 0 if token == EOS else len(token)

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int) -> "BPETokenizer":
        """Learn ``vocab_size`` tokens (256 bytes, the end token, then merges) from ``texts`` (each cut at
        safe positions, e.g. by :func:`safe_stream`). Deterministic: the same texts give the same
        tokenizer on every DDP rank. A text too small for ``vocab_size`` gives fewer.

        Raises:
            ValueError: ``vocab_size`` below 258 (names ``data.bpe_vocab_size``).
        """
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        check_bpe_vocab_size(vocab_size)
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        backend.train_from_iterator((piece for text in texts for piece in safe_pieces(text)), trainer=trainer)
        return cls(backend)

    @classmethod
    def from_json(cls, text: str, where: str = "the checkpoint") -> "BPETokenizer":
        """The tokenizer :meth:`to_json` wrote, and no other pipeline (a Regex normalizer can spin for minutes).

        Raises:
            DataError: ``text`` is not what :meth:`train` writes but for its vocabulary and merges (names ``where``).
        """
        from tokenizers import Tokenizer

        as_trained = cls.train([], 258).to_json()  # what train writes around a vocabulary and merges
        check_as_written(text, as_trained, {"model.vocab", "model.merges"}, f"{where}: the saved BPE tokenizer")
        try:
            return cls(Tokenizer.from_str(text))
        except Exception as error:  # tokenizers raises its own Exception type
            raise ConfigError(f"{where}: the saved BPE tokenizer does not read ({error})") from None

    def to_json(self) -> str:
        """The whole tokenizer (vocabulary, merges, pre-tokenizer) as ``tokenizer.json`` text, which
        ``tokenizers.Tokenizer.from_str``{{ " and ``transformers.PreTrainedTokenizerFast``" if cookiecutter.use_pretrained == "yes" else "" }} read."""
        return self.backend.to_str()

    def encode(self, text: str) -> list[int]:
        return self.encode_with_bytes(text)[0]

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` and the UTF-8 bytes each stands for (they sum to the text's bytes)."""
        encoded = self.backend.encode_batch(safe_pieces(text), add_special_tokens=False)  # in parallel
        ids = [index for piece in encoded for index in piece.ids]
        return ids, self.token_bytes[ids].tolist()

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; a multi-byte character cut in half shows as U+FFFD."""
        return self.backend.decode(ids, skip_special_tokens=False)


def saved_bpe(saved: str, current: Tokenizer | None) -> BPETokenizer:
    """The BPE a checkpoint saved (JSON ``saved``): in a resumed fit the same as ``current``, trained anew on the text.

    Raises:
        ValueError: ``current`` differs: the training text changed since the checkpoint.
    """
    tokenizer = BPETokenizer.from_json(saved)
    if current is not None and current.to_json() != saved:
        raise DataError(
            "data: the BPE trained on the text now differs from the checkpoint's (the training text changed "
            "since): resume on the same text, or start a new run"
        )
    return tokenizer


@cache
def load_tokenizer(source: str | None) -> Tokenizer:
{%- if cookiecutter.use_pretrained == "yes" %}
    """Bytes for None or ``"bytes"``, else the tokenizer of the pretrained model ``source`` (read once
    per process). A BPE is trained by its DataModule, never loaded by name.

    Raises:
        ValueError: ``source`` is ``"bpe"``.
    """
    if source == BPE:
        raise ConfigError("data.tokenizer: bpe is trained on the training text by TextDataModule, not loaded by name")
    return ByteTokenizer() if source in (None, BYTES) else PretrainedTokenizer(source)
{%- else %}
    """Bytes for None or ``"bytes"``. A BPE is trained by its DataModule, never loaded by name.

    Raises:
        ValueError: ``source`` is ``"bpe"`` or anything else, naming ``data.tokenizer``.
    """
    if source == BPE:
        raise ConfigError("data.tokenizer: bpe is trained on the training text by TextDataModule, not loaded by name")
    if source not in (None, BYTES):
        raise ConfigError(f"data.tokenizer={source}: bytes (null) or bpe; this project has no pretrained models")
    return ByteTokenizer()
{%- endif %}


# ---- chat ------------------------------------------------------------------------------------------
CHAT_ROLES = ("system", "developer", "user", "assistant")  # "developer": the newer name of "system" in chat formats


{% if cookiecutter.use_pretrained == "yes" -%}
def within_steps(render: Callable[[], str], steps: int = TEMPLATE_STEPS) -> str:
    """``render()``, a chat template's rendering, stopped after ``steps`` lines of the template's own code.

    A model folder's template is Jinja that transformers runs in Jinja's sandbox, which stops a template
    from reaching Python but not from looping: two nested ``range(99999)`` loops never return. Each
    line the compiled template runs (each loop turn included) is counted by a trace function on the
    rendering thread (``sys.settrace``, on the template's frames only), which raises past the bound.

    Raises:
        ValueError: the template ran more than ``steps`` lines.
    """
    count = 0

    def on_line(frame: FrameType, event: str, arg: object) -> Callable | None:
        nonlocal count
        count += 1
        if count > steps:
            raise TemplateTooLongError(
                f"the chat template ran over {steps} steps; use a template that loops over the messages only"
            )
        return on_line

    def on_call(frame: FrameType, event: str, arg: object) -> Callable | None:
        return on_line if frame.f_code.co_filename == "<template>" else None  # Jinja's name for compiled source

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        return render()
    except TemplateTooLongError as error:  # transformers may wrap what a template raises: the bound's message kept
        raise ValueError(str(error)) from None
    finally:
        sys.settrace(previous)


class TemplateTooLongError(Exception):
    """Raised inside a template's frame by :func:`within_steps` (a ValueError once out of it)."""


{% endif -%}
class ChatTemplate:
    """A conversation -> the token ids that prompt the model for the assistant's next turn.
{%- if cookiecutter.use_pretrained == "yes" %}

    A pretrained tokenizer with a chat template (``tokenizer_config.json``'s ``chat_template``) renders
    with it (``apply_chat_template``, https://huggingface.co/docs/transformers/chat_templating). Any
    other tokenizer (bytes, a trained BPE, a pretrained one without a template) uses the plain
    template: each message as ``"<role>: <content>\\n"``, then ``"assistant: "``; a model that goes on
{%- else %}

    Bytes and a trained BPE use the plain template: each message as ``"<role>: <content>\\n"``, then
    ``"assistant: "``; a model that goes on
{%- endif %}
    to write the next ``"\\nuser:"`` turn has ended its own{% if cookiecutter.use_serving == "yes" %}, so those are its :attr:`stops`.

    Picklable: the server's HTTP processes check prompts with it, its workers render them{% endif %}.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
{%- if cookiecutter.use_pretrained == "yes" %}
        backend = getattr(tokenizer, "backend", None)
        self.own = backend is not None and bool(getattr(backend, "chat_template", None))
{%- else %}
        self.own = False  # bytes and a BPE have no template of their own
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}
        self.stops: tuple[str, ...] = () if self.own else tuple(f"\n{role}:" for role in ("system", "user"))
{%- endif %}

    @property
    def ends_turns(self) -> bool:
        """Whether the template's text ends each assistant turn itself (else the end-of-text token must)."""
        return self.own

    def render(self, messages: list[dict[str, str]], open_turn: bool = True) -> str:
        """The text of ``messages`` (``[{"role": ..., "content": ...}, ...]``), with the assistant's turn opened
        after them (``open_turn``, the prompt of an answer) or not (a conversation to learn from).

        Raises:
            ValueError: a message without a known role or text content, naming it (``messages[i]``){% if cookiecutter.use_pretrained == "yes" %};
                a template that takes more than ``TEMPLATE_STEPS`` steps (:func:`within_steps`){% endif %}.
        """
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in CHAT_ROLES:
                role = message.get("role") if isinstance(message, dict) else None
                raise ValueError(f"messages[{index}].role is {role!r}; one of {', '.join(CHAT_ROLES)}")
            if not isinstance(message.get("content"), str):
                raise ValueError(f"messages[{index}].content must be text")
        plain = [
            {"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]} for m in messages
        ]
{%- if cookiecutter.use_pretrained == "yes" %}
        if self.own:
            backend = self.tokenizer.backend
            return within_steps(
                lambda: backend.apply_chat_template(plain, tokenize=False, add_generation_prompt=open_turn)
            )
{%- endif %}
        return "".join(f"{m['role']}: {m['content']}\n" for m in plain) + ("assistant: " if open_turn else "")

    def ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of the prompt that asks for the assistant's answer to ``messages`` (special tokens included).

        Raises:
            ValueError: no messages, or one :meth:`render` refuses.
        """
        if not messages:
            raise ValueError("messages is empty: send at least one message")
        return self.tokenizer.encode(self.render(messages))

    def turns(self, messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
        """The conversation's text in order, cut into pieces that are the assistant's (True) or not, up to
        its last assistant turn: what supervised fine-tuning on chats scores (the assistant's turns only).

        An assistant piece is what the template adds for that message: its text, and the template's
        end of turn (the plain template has none: :attr:`ends_turns`).

        Raises:
            ValueError: no assistant message, a message :meth:`render` refuses, or a template that renders
                the start of a conversation differently once the conversation goes on.
        """
        answers = [i for i, m in enumerate(messages) if isinstance(m, dict) and m.get("role") == "assistant"]
        if not answers:
            raise ValueError("no assistant message: nothing to learn from")
        self.render(messages, open_turn=False)  # every message checked, not only those up to the last answer
        pieces, done = [], ""
        for i in answers:
            before, after = self.render(messages[:i]), self.render(messages[: i + 1], open_turn=False)
            if not before.startswith(done) or not after.startswith(before):
                raise ValueError(f"messages[{i}]: the chat template renders the conversation before it differently")
            pieces += [(before[len(done) :], False), (after[len(before) :], True)]
            done = after
        return [(text, trained) for text, trained in pieces if text]
