"""Supervised fine-tuning data: JSONL, a ``{"prompt": ..., "completion": ...}`` or a chat
``{"messages": [{"role": ..., "content": ...}, ...]}`` per line (the format of TRL and most chat
data sets: https://huggingface.co/docs/trl/dataset_formats), or a Parquet or Arrow table (a Hugging
Face dataset's shard) with those columns.

A pair is the prompt's tokens, then the completion's, then the tokenizer's end-of-text token (so
the model learns where to stop). A chat is its text through the tokenizer's chat template (or the
plain one: :class:`data.tokenizer.ChatTemplate`), the very text {{ '``make serve``' if cookiecutter.use_serving == 'yes' else 'a chat model' }} prompts the model
with. The model reads every token but is scored on the completion, or the assistant's turns with
the template's end of turn, only: other positions carry the target -100, which ``cross_entropy``
ignores (the "completion-only" / "assistant-only" loss of TRL's ``SFTTrainer``). Examples of a
batch are padded on the right to the longest; with causal attention no real token ever attends to
a pad, so no attention mask is needed.

The examples are split into train/val/test by a seeded permutation (``split_seed``), which never
depends on the training seed; a Hugging Face dataset's files that name their split
(``train-*.parquet``, ``test.jsonl``, split folders) are those splits, and only a split it lacks is
cut from its training examples. Training order and exact mid-epoch resume come from
:class:`engine.ResumableDataModule`, as for every DataModule.
"""

import functools
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.data.hub_datasets import local_path
from {{ cookiecutter.package_name }}.data.text import LanguageDataModule
from {{ cookiecutter.package_name }}.data.tokenizer import ChatTemplate
from {{ cookiecutter.package_name }}.engine import DataError, check_fractions, split_indices
from {{ cookiecutter.package_name }}.engine.table_files import TABLE_SUFFIXES
from {{ cookiecutter.package_name }}.engine.text_files import dataset_splits, table_records, text_files

IGNORE = -100  # the target of a position the loss skips (torch.nn.functional.cross_entropy's ignore_index)

log = logging.getLogger(__name__)


def pad_examples(samples: list[tuple[torch.Tensor, ...]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Examples of lengths L_i -> (inputs (B, L), targets (B, L), target bytes (B, L)), right-padded to L = max L_i.

    Inputs are padded with ``pad_id``, targets with -100 (not scored), byte counts with 0.
    """
    length = max(len(sample[0]) for sample in samples)
    fills = (pad_id, IGNORE, 0)
    return tuple(
        torch.stack([F.pad(sample[i], (0, length - len(sample[i])), value=fills[i]) for sample in samples])
        for i in range(3)
    )


def records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) of each example of a JSONL file (its lines), or of a Parquet or Arrow table (its rows: a
    Hugging Face dataset's shard); ``where`` names the file and line or row for errors.

    Raises:
        ValueError: a line that is not JSON; a table that is not readable.
    """
    if path.suffix.lower() in TABLE_SUFFIXES and path.suffix.lower() != ".jsonl":
        for number, record in enumerate(table_records(path)):
            yield f"data.path: {path} row {number}", record
        return
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.strip():
                try:
                    yield f"data.path: {path} line {number}", json.loads(line)
                except json.JSONDecodeError as error:
                    where = f"data.path: {path} line {number}"
                    raise DataError(f"{where} is not JSON ({error.msg}); write one JSON object per line") from None


class PromptCompletionDataModule(LanguageDataModule):
    """Batches of (inputs (B, L), targets (B, L), target bytes (B, L)), L <= ``block_size``, from a JSONL file.

    Args:
        path: a JSONL file; each line an object with the strings ``prompt`` and ``completion``, or a
            ``messages`` list of ``{"role", "content"}`` with at least one ``assistant`` message. Or a
            Parquet or Arrow table whose rows are such objects (other columns are left out), or a folder of
            such files (a Hugging Face dataset's shards, its splits named as ``train-*``, ``test-*``).
        tokenizer: {{ 'the pretrained model whose tokenizer to use (folder or hub id); None for bytes.' if cookiecutter.use_pretrained == "yes" else 'None (or ``bytes``): UTF-8 bytes, the one tokenizer a JSONL file of examples can use.' }}
        block_size: most tokens an example may have (the context the model is trained on); a
            longer completion or chat is cut (the count is logged); a longer prompt, or a chat whose
            first assistant turn starts beyond it, is refused.
        val_fraction, test_fraction: shares of the examples held out (of the training files', for a dataset
            with split files: only for a split it lacks).
        split_seed: seed of the train/val/test split.
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.

    Raises:
        FileNotFoundError: ``path`` does not exist, or is a folder without such files.
        ValueError: a line that is not a JSON object with string ``prompt`` and ``completion`` or
            with ``messages`` (no assistant turn, an unknown role, text that is not a string), naming
            the file and line; a prompt longer than ``block_size`` tokens; too few examples for the
            splits; split files beside files of no split (:func:`engine.table_files.named_splits`); or a
            setting out of range.
    """

    def __init__(
        self,
        path: str,
        tokenizer: str | None = None,
        block_size: int = 512,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 0,
        batch_size: int = 8,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(tokenizer, block_size, batch_size, num_workers, pin_memory, persistent_workers)
        self.save_hyperparameters()
        check_fractions(val_fraction, test_fraction)
        pad_id = self.tokenizer.eos_id if self.tokenizer.eos_id is not None else 0
        self.collate_fn = functools.partial(pad_examples, pad_id=pad_id)
        self._splits: dict[str, list[tuple[torch.Tensor, ...]]] | None = None

    @property
    def vocab_size(self) -> int:
        """The tokenizer's vocabulary; asking reads and checks the file (before any run folder exists)."""
        self.splits  # noqa: B018
        return self.tokenizer.vocab_size

    @property
    def splits(self) -> dict[str, list[tuple[torch.Tensor, ...]]]:
        """{train, val, test}: examples (inputs (L,), targets (L,), target bytes (L,)), read when first asked."""
        if self._splits is None:
            hp = self.hparams
            path = local_path(hp.path)  # a file, or a dataset's folder: its split files, or one pool
            files = text_files(path, TABLE_SUFFIXES)
            named = dataset_splits(path, files) or {"train": files}
            given = {name: self._read_examples(split_files) for name, split_files in named.items()}
            pool = given.pop("train")
            cut = [name for name in ("val", "test") if name not in given]
            if len(pool) < len(cut) + 1 or not all(given.values()):
                counts = ", ".join(f"{name} {len(examples)}" for name, examples in [("train", pool), *given.items()])
                raise DataError(f"data.path: {hp.path} has too few examples ({counts}); each split needs one or more")
            order = split_indices(None, len(pool), hp.val_fraction, hp.test_fraction, hp.split_seed, cut=cut)
            self._splits = {name: [pool[i] for i in sorted(indices)] for name, indices in order.items()} | given
        return self._splits

    def _read_examples(self, files: list[Path]) -> list[tuple[torch.Tensor, ...]]:
        return [example for path in files for example in self._read_file(path)]

    def _read_file(self, path: Path) -> list[tuple[torch.Tensor, ...]]:
        examples, cut = [], 0
        for where, record in records(path):
            if isinstance(record, dict) and isinstance(record.get("messages"), list):
                example, was_cut = self._chat(record["messages"], where)
            elif isinstance(record, dict) and all(isinstance(record.get(k), str) for k in ("prompt", "completion")):
                example, was_cut = self._example(record["prompt"], record["completion"], where)
            else:
                keys = sorted(record) if isinstance(record, dict) else type(record).__name__
                raise DataError(
                    f'{where} needs the strings "prompt" and "completion", or a "messages" list (it has {keys})'
                )
            examples.append(example)
            cut += was_cut
        if cut:
            cut_to = f"cut to data.block_size={self.hparams.block_size} tokens"
            log.info(f"data.path: {path}: {cut} completion(s) or chat(s) {cut_to}")
        return examples

    def _example(self, prompt: str, completion: str, where: str) -> tuple[tuple[torch.Tensor, ...], bool]:
        """(inputs (L,), targets (L,), target bytes (L,)) of one pair, and whether the completion was cut."""
        prompt_ids, prompt_bytes = self.tokenizer.encode_with_bytes(prompt)
        completion_ids, completion_bytes = self.tokenizer.encode_with_bytes(completion)
        if self.tokenizer.eos_id is not None:
            completion_ids, completion_bytes = [*completion_ids, self.tokenizer.eos_id], [*completion_bytes, 0]
        limit = self.hparams.block_size
        if not 0 < len(prompt_ids) <= limit:
            raise DataError(
                f"{where}: the prompt has {len(prompt_ids)} tokens; with its completion it must fit in "
                f"data.block_size = {limit}: shorten it or raise data.block_size (at most the model's context)"
            )
        ids = (prompt_ids + completion_ids)[: limit + 1]
        counts = (prompt_bytes + completion_bytes)[: limit + 1]
        targets = torch.tensor(ids[1:])
        targets[: len(prompt_ids) - 1] = IGNORE  # positions that predict prompt tokens
        example = (torch.tensor(ids[:-1]), targets, torch.tensor(counts[1:]) * (targets != IGNORE))
        return example, len(prompt_ids) + len(completion_ids) > limit + 1

    def _chat(self, messages: list, where: str) -> tuple[tuple[torch.Tensor, ...], bool]:
        """(inputs (L,), targets (L,), target bytes (L,)) of one chat, scored on its assistant turns only, and
        whether it was cut."""
        template = ChatTemplate(self.tokenizer)
        try:
            turns = template.turns(messages)
        except ValueError as error:
            raise DataError(f"{where}: {error}") from None
        ids, counts, scored = [], [], []
        for text, assistant in turns:
            piece_ids, piece_bytes = self.tokenizer.encode_with_bytes(text)
            if assistant and not template.ends_turns and self.tokenizer.eos_id is not None:
                piece_ids, piece_bytes = [*piece_ids, self.tokenizer.eos_id], [*piece_bytes, 0]
            ids, counts, scored = ids + piece_ids, counts + piece_bytes, scored + [assistant] * len(piece_ids)
        limit = self.hparams.block_size
        if not any(scored[1 : limit + 1]):
            first = scored.index(True)
            raise DataError(
                f"{where}: the first assistant turn starts at token {first}, beyond data.block_size = {limit}: "
                "shorten the conversation before it or raise data.block_size (at most the model's context)"
            )
        targets = torch.tensor(ids[1 : limit + 1])
        targets[~torch.tensor(scored[1 : limit + 1])] = IGNORE  # positions that predict others' tokens
        example = (torch.tensor(ids[:limit]), targets, torch.tensor(counts[1 : limit + 1]) * (targets != IGNORE))
        return example, len(ids) > limit + 1

    def setup(self, stage: str | None = None) -> None:
        self.train_set, self.val_set, self.test_set = (self.splits[name] for name in ("train", "val", "test"))
        self.check_batch_size()
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """The first T tokens (N, T) of each example of ``split`` (T: the shortest's length) and the next token (N,)."""
        examples = self.splits[split]
        length = min(len(example[0]) for example in examples)
        full = [torch.cat([example[0], example[1][-1:]]) for example in examples]  # every token of each (L + 1,)
        return torch.stack([ids[:length] for ids in full]), torch.stack([ids[length] for ids in full])
{%- endif %}
