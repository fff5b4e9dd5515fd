"""Reading Parquet, Arrow and JSON Lines tables as a Hugging Face dataset ships them (the Hub's Parquet shards,
``save_to_disk``'s Arrow streams): a batch of rows at a time, one line naming the file for any error; the splits
its file names say.

Nothing in a file is run: pyarrow >= 14.0.1 (CVE-2023-47248) loads no Python extension type, and a dataset's
loading script is never read.
"""

import contextlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import DataError

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["TABLE_SUFFIXES"]

# Files read as tables (a Hugging Face dataset's shards: the Hub's Parquet, save_to_disk's Arrow streams).
TABLE_SUFFIXES = (".parquet", ".pq", ".arrow", ".feather", ".ipc", ".jsonl")
TABLE_ROWS = 4096  # rows of a Parquet or Arrow table read at a time
# The words that name a split in a dataset's folder or file names, as the Hub reads them (datasets' data_files:
# SPLIT_KEYWORDS, between the separators "-._ 0-9"): https://huggingface.co/docs/hub/datasets-file-names-and-splits
SPLIT_WORDS = {
    **dict.fromkeys(("train", "training"), "train"),
    **dict.fromkeys(("validation", "valid", "dev", "val"), "val"),
    **dict.fromkeys(("test", "testing", "eval", "evaluation"), "test"),
}


def open_table(file: Path) -> tuple[str, Any, Any]:
    """(kind, reader, Arrow schema) of a Parquet or Arrow table file (file or stream: a Hugging Face dataset's
    ``.arrow`` shards), by its suffix (JSON Lines are read a line at a time by their readers). Call it inside
    :func:`table_errors`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if file.suffix.lower() in (".parquet", ".pq"):
        table = pq.ParquetFile(file)
        return "Parquet", table, table.schema_arrow
    mapped = pa.memory_map(str(file))
    try:
        table = pa.ipc.open_file(mapped)
    except pa.ArrowInvalid:  # a stream: what Hugging Face datasets write
        mapped.seek(0)
        table = pa.ipc.open_stream(mapped)
    return "Arrow", table, table.schema


def record_batches(kind: str, table: Any, columns: Sequence[str]) -> Iterator[Any]:
    """The record batches of ``columns`` of a table :func:`open_table` opened, in row order."""
    import pyarrow as pa

    if kind == "Parquet":
        yield from table.iter_batches(batch_size=TABLE_ROWS, columns=list(columns))
        return
    batches = table
    if isinstance(table, pa.ipc.RecordBatchFileReader):
        batches = map(table.get_batch, range(table.num_record_batches))
    for batch in batches:
        yield batch.select(list(columns))


@contextlib.contextmanager
def table_errors(file: Path, setting: str = "data.path") -> Iterator[None]:
    """What pyarrow raises on a file it cannot read, as one line naming ``setting`` and the file."""
    import pyarrow as pa

    try:
        yield
    except DataError:
        raise
    except (pa.ArrowException, OSError, ValueError) as error:
        suffix = file.suffix.lower()
        kind = "Parquet" if suffix in (".parquet", ".pq") else "JSON Lines" if suffix == ".jsonl" else "Arrow"
        problem = " ".join(str(error).split())[:300]
        raise DataError(f"{setting}: {file} is not a readable {kind} table ({problem}); check the file") from None


def split_of(file: Path, root: Path) -> str | None:
    """The split ("train", "val" or "test") that a dataset's ``file`` under folder ``root`` holds, by the Hub's
    rule: a folder below ``root`` named for it (``save_to_disk``'s ``train/``), else a word of the file's name
    between separators (``train-00000-of-00002.parquet``, ``my_validation_file.jsonl``, ``test.parquet``);
    None when neither names one."""
    relative = file.relative_to(root)
    for part in (*relative.parent.parts, relative.name):
        words = [SPLIT_WORDS.get(word.lower()) for word in re.split(r"[-._ 0-9]+", part)]
        if any(words):
            return next(word for word in words if word)
    return None


def named_splits(files: Sequence[Path], root: Path, setting: str = "data.path") -> dict[str, list[Path]] | None:
    """The ``files`` of a dataset folder ``root`` by the split their names say (:func:`split_of`), in order;
    None when no name says one (the data are one pool, split by fractions).

    Raises:
        DataError: some files name a split and others none (the Hub would leave those out: here they are named),
            or no file names the train split.
    """
    splits = {file: split_of(file, root) for file in files}
    if not any(splits.values()):
        return None
    unnamed = [str(file.relative_to(root)) for file, split in splits.items() if split is None]
    if unnamed or "train" not in splits.values():
        problem = f"{len(unnamed)} file(s) name no split ({', '.join(unnamed[:3])})" if unnamed else "no train split"
        raise DataError(
            f"{setting}: {root} is a dataset whose file names give its splits, but {problem}; name each file "
            "or folder for its split (train-*, validation-*, test-*), or move the named ones out for one pool"
        )
    return {
        split: [file for file in files if splits[file] == split]
        for split in ("train", "val", "test")
        if split in splits.values()
    }
