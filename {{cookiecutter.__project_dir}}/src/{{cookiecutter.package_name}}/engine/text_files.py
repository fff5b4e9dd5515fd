"""Reading a corpus as written: text files (checked to be UTF-8, a block at a time) and the text column of
Parquet, Arrow or JSON Lines tables (a Hugging Face dataset's shards), a file's text joined to the next by a
blank line.

A dataset's shards (tables) whose names say their split (the Hub's ``data/train-00000-of-00002.parquet``,
``save_to_disk``'s ``train/``) are that split: :func:`dataset_splits`.

A table's rows are its documents, joined by a blank line as files are; only the named column is read (a
Parquet or Arrow file a batch of rows at a time, so memory stays flat in its size), and nothing in the file
is run: pyarrow >= 14.0.1 (CVE-2023-47248) loads no Python extension type, and a dataset's loading script is
never read. Every error is one line naming the file and the fix.
"""

import codecs
import itertools
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .datamodule import data_files
from .errors import DataError, MissingFileError
from .table_files import (
    TABLE_ROWS,
    TABLE_SUFFIXES,
    named_splits,
    open_table,
    record_batches,
    split_of,
    table_errors,
)

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["checked_text_files", "cut_text", "dataset_splits", "joined", "table_records", "text_files"]


def text_files(path: str | Path, suffixes: Sequence[str] = (".txt",)) -> list[Path]:
    """``path`` itself, or the files of folder ``path`` that :func:`engine.datamodule.data_files` lists.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the folder has no such file.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise MissingFileError(f"data.path: {path} does not exist; give a file or a folder of files to read")
    if not path.is_dir():
        return [path]
    files = data_files(path, suffixes)
    if not files:
        named = ", ".join(suffixes)
        raise DataError(
            f"data.path: {path} has no files ending in {named}; put the text in such files, or name their "
            "endings in data.suffixes (e.g. [.txt, .md], or [.parquet] for a dataset's shards)"
        )
    return files


def dataset_splits(path: str | Path, files: Sequence[Path]) -> dict[str, list[Path]] | None:
    """The ``files`` of folder ``path`` by the split their names say (:func:`engine.table_files.named_splits`),
    when a table among them names one (a dataset's shards); None for a file, a folder of text files, or tables
    that name no split (one text, cut by fractions). A folder of text files named ``test.txt`` stays one text.

    Raises:
        ValueError: tables that name splits beside files that name none, or no train split.
    """
    root = Path(path).expanduser()
    if not root.is_dir() or not any(file.suffix.lower() in TABLE_SUFFIXES and split_of(file, root) for file in files):
        return None
    return named_splits(files, root)


def utf8_boundary(text: bytes, position: int) -> int:
    """The first position at or after ``position`` that starts a UTF-8 character (or the end)."""
    while position < len(text) and text[position] & 0xC0 == 0x80:  # a continuation byte 10xxxxxx
        position += 1
    return position


def cut_text(text: bytes, val_fraction: float, test_fraction: float) -> dict[str, bytes]:
    """``text`` cut in order into train, val and test stretches: the last ``test_fraction`` of its bytes is
    test, the ``val_fraction`` before it val (each cut moved forward to a character start)."""
    ends = (
        utf8_boundary(text, int(len(text) * (1 - val_fraction - test_fraction))),
        utf8_boundary(text, int(len(text) * (1 - test_fraction))),
    )
    return {"train": text[: ends[0]], "val": text[ends[0] : ends[1]], "test": text[ends[1] :]}


def file_pieces(file: Path, column: str, block: int = 1 << 24) -> Iterator[bytes]:
    """The text of ``file`` in pieces: a text file's bytes ``block`` at a time, a table's rows of ``column``
    (empty and missing ones left out) a batch at a time, joined by blank lines, as UTF-8.

    Raises:
        ValueError: a table that is not readable, has no ``column`` or whose ``column`` is not text.
    """
    if file.suffix.lower() not in TABLE_SUFFIXES:
        with open(file, "rb") as stream:
            while raw := stream.read(block):
                yield raw
        return
    first = True
    for rows in table_rows(file, column):
        text = "\n\n".join(row for row in rows if row)
        if text:
            yield text.encode("utf-8") if first else b"\n\n" + text.encode("utf-8")
            first = False


def table_rows(file: Path, column: str) -> Iterator[list[str | None]]:
    """The values of ``column`` of a Parquet, Arrow (file or stream: a Hugging Face dataset's ``.arrow``
    shards) or JSON Lines table, in row order, a batch of rows at a time.

    Raises:
        ValueError: not a readable table of its kind; no ``column`` (names the columns and
            ``data.text_column``); a ``column`` that does not hold text.
    """
    import pyarrow as pa

    if file.suffix.lower() == ".jsonl":
        yield from jsonl_rows(file, column)
        return
    with table_errors(file):
        kind, table, schema = open_table(file)
        if column not in schema.names:
            raise DataError(
                f"data.path: {file} has no column {column!r} (its columns: {', '.join(schema.names[:12])}); "
                "name the text column in data.text_column"
            )
        kind_of = schema.field(column).type
        kind_of = kind_of.value_type if pa.types.is_dictionary(kind_of) else kind_of
        if not (pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of)):
            raise DataError(
                f"data.path: {file}: column {column!r} holds {kind_of}, not text; name a text column in "
                "data.text_column (chat messages: configs/experiments/chat.yaml)"
            )
        for batch in record_batches(kind, table, [column]):
            yield batch.column(0).to_pylist()


def jsonl_rows(file: Path, column: str) -> Iterator[list[str | None]]:
    """The ``column`` of a JSON Lines file's objects, ``TABLE_ROWS`` at a time, read a line at a time (memory
    stays flat in the file's size; pyarrow's reader holds the whole file); an object without it gives None.

    Raises:
        ValueError: a line that is not a JSON object, a value that is not text, no object with ``column``
            (each names the file and line, and the fix); a file that is not UTF-8.
    """
    rows: list[str | None] = []
    seen = False
    with table_errors(file), file.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line) if line.strip() else {}
            except json.JSONDecodeError as error:
                where = f"data.path: {file} line {number}"
                raise DataError(f"{where} is not JSON ({error.msg}); write one object a line") from None
            if not isinstance(record, dict):
                raise DataError(f"data.path: {file} line {number} is not a JSON object; write one object a line")
            value = record.get(column)
            if value is not None and not isinstance(value, str):
                raise DataError(
                    f"data.path: {file} line {number}: {column!r} holds {type(value).__name__}, not text; name a text "
                    "column in data.text_column (chat messages: configs/experiments/chat.yaml)"
                )
            seen |= column in record
            if line.strip():
                rows.append(value)
            if len(rows) == TABLE_ROWS:
                yield rows
                rows = []
    if rows:
        yield rows
    if not seen:
        raise DataError(f"data.path: {file} has no object with {column!r}; name the text column in data.text_column")


def table_records(file: Path) -> Iterator[dict[str, Any]]:
    """The rows of a Parquet or Arrow table as ``{column: value}`` (lists and structs as Python lists and
    dicts: a chat's ``messages``), in row order, a batch at a time.

    Raises:
        ValueError: not a readable table of its kind.
    """
    with table_errors(file):
        kind, table, schema = open_table(file)
        for batch in record_batches(kind, table, schema.names):
            yield from batch.to_pylist()


def joined(files: Sequence[Path], column: str) -> bytes:
    """The text of ``files`` (:func:`file_pieces`) in order, separated by a blank line."""
    return b"\n\n".join(b"".join(file_pieces(file, column)) for file in files)


def checked_text_files(
    path: str | Path, suffixes: Sequence[str] = (".txt",), column: str = "text", block: int = 1 << 24
) -> list[Path]:
    """:func:`text_files` that hold text: each read once, ``block`` bytes at a time (memory stays flat),
    checked to be UTF-8 (a table's ``column``: to be text); empty or blank files are left out.

    Raises:
        FileNotFoundError, ValueError: see :func:`text_files` and :func:`table_rows`; a file that is not
            UTF-8 (names the file and the byte offset, and how to convert it); no file holds text.
    """
    kept = []
    for file in text_files(path, suffixes):
        decoder, offset, blank = codecs.getincrementaldecoder("utf-8")(), 0, True
        for raw in itertools.chain(file_pieces(file, column, block), [b""]):  # b"": the end
            pending = decoder.getstate()[0]  # the start of a character cut by the previous block
            try:
                decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as error:
                at, bad = offset - len(pending) + error.start, error.object[error.start : error.start + 4]
                raise DataError(
                    f"data.path: {file} is not UTF-8 text (byte {at}: {bad!r}); "
                    f"convert it, e.g. `iconv -f latin1 -t utf-8 {file.name} > {file.stem}.utf8.txt`"
                ) from None
            blank, offset = blank and not raw.strip(), offset + len(raw)
        if not blank:
            kept.append(file)
    if not kept:
        raise DataError(f"data.path: {path} holds no text (every file is empty or blank)")
    return kept
