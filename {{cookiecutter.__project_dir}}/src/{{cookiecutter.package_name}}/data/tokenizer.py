"""The language model's tokenizers: UTF-8 bytes, or a pretrained model's own (Hugging Face).

Both turn text into token ids and say, for each token, how many UTF-8 bytes of the text it
stands for. Summed over a split, those counts turn a loss in nats per token into bits per byte
(total nats / total bytes / ln 2), the unit in which models with different tokenizers compare
(Gao et al., "The Pile", 2020, section 4; nanoGPT's byte-level runs report the same).

:func:`load_tokenizer` is the one entry: ``None`` gives bytes, anything else a folder or hub id
of a pretrained model (:func:`engine.pretrained.locate`), whose tokenizer files are read offline.
"""

from functools import cache
from typing import Protocol

import numpy as np

from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.pretrained import locate


class Tokenizer(Protocol):
    source: str | None  # None for bytes; else the folder or hub id it was read from
    vocab_size: int
    eos_id: int | None  # the end-of-text token appended after a completion, None for bytes

    def encode(self, text: str) -> list[int]: ...

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    """Token ids are the UTF-8 bytes of the text: a vocabulary of 256, nothing to train or download."""

    source = None
    vocab_size = 256
    eos_id = None

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]:
        ids = self.encode(text)
        return ids, [1] * len(ids)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``; a multi-byte character cut in half shows as U+FFFD."""
        return bytes(ids).decode("utf-8", errors="replace")


class PretrainedTokenizer:
    """A pretrained model's tokenizer (``transformers.AutoTokenizer``, a fast one), read from local files only.

    Raises:
        engine.errors.MissingFileError, ConfigError: see :func:`engine.pretrained.locate`; or the
            folder has no fast (Rust) tokenizer, whose offsets the byte counts need.
    """

    def __init__(self, source: str, key: str = "data.tokenizer") -> None:
        from transformers import AutoTokenizer

        found = locate(source, key=key)
        try:
            backend = AutoTokenizer.from_pretrained(found.folder, local_files_only=True)
        except (OSError, ValueError) as error:
            raise ConfigError(f"{key}: {found.folder} holds no tokenizer transformers can read ({error})") from None
        if not backend.is_fast:
            raise ConfigError(f"{key}: {found.folder} has no fast tokenizer (tokenizer.json); convert it or use bytes")
        self.source, self.backend = source, backend
        self.vocab_size = len(backend)
        self.eos_id = backend.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.backend(text, add_special_tokens=False)["input_ids"]

    def encode_with_bytes(self, text: str) -> tuple[list[int], list[int]]:
        """Token ids of ``text`` and the UTF-8 bytes each stands for: up to its end, from the previous token's end."""
        encoded = self.backend(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = np.array([end for _, end in encoded["offset_mapping"]], dtype=np.int64)  # character offsets
        # UTF-8 bytes before each character: 1 to 4 bytes per code point.
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
        byte_ends = np.concatenate([[0], np.cumsum(widths)])[ends]
        counts = np.diff(np.concatenate([[0], byte_ends]))
        return encoded["input_ids"], counts.tolist()

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)


@cache
def load_tokenizer(source: str | None) -> Tokenizer:
    """Bytes for None, else the tokenizer of the pretrained model ``source`` (read once per process)."""
    return ByteTokenizer() if source is None else PretrainedTokenizer(source)
