"""A text's bytes streamed in pieces for ``make prepare``: counted, chunked at line ends and cut into splits
without the whole text in memory, so a prepared corpus's tokens are the in-memory text's, token for token."""

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from .table_files import TABLE_SUFFIXES
from .text_files import file_pieces, utf8_boundary

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["split_pieces", "text_bytes", "text_chunks"]


def text_bytes(files: Sequence[Path], column: str, block: int = 1 << 24) -> int:
    """The bytes of :func:`engine.text_files.joined`'s text, counted without holding it (a table's text is read
    once to count)."""
    tables = [file for file in files if file.suffix.lower() in TABLE_SUFFIXES]
    size = sum(len(piece) for file in tables for piece in file_pieces(file, column, block))
    return size + sum(file.stat().st_size for file in files if file not in tables) + 2 * (len(files) - 1)


def text_chunks(files: Sequence[Path], column: str, block: int = 1 << 24) -> Iterator[bytes]:
    """The bytes :func:`engine.text_files.joined` joins (files separated by a blank line), in pieces of about
    ``block`` bytes that end at a line end (or, in a line longer than ``block``, at a character start)."""
    for index, file in enumerate(files):
        if index:
            yield b"\n\n"
        carry = b""
        for raw in file_pieces(file, column, block):
            raw = carry + raw
            cut = raw.rfind(b"\n") + 1
            if not cut:  # a line longer than block: cut before its last character (complete or not)
                cut = len(raw) - 1
                while cut > 0 and raw[cut] & 0xC0 == 0x80:
                    cut -= 1
            yield raw[:cut]
            carry = raw[cut:]
        if carry:
            yield carry


def split_pieces(chunks: Iterable[bytes], cuts: Sequence[int]) -> Iterator[tuple[int, bytes]]:
    """``(split, piece)``: the ``chunks`` of a text, cut at the byte positions ``cuts`` (train end,
    val end, text end; moved forward to a character start) so that no piece spans two splits."""
    split, position = 0, 0  # the split being cut, and the bytes of text before ``chunk``
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            end = len(chunk)
            if split < 2 and position + end > cuts[split]:  # the cut falls in this chunk: on a character start
                end = utf8_boundary(chunk, cuts[split] - position)
            if end > start:
                yield split, chunk[start:end]
            if end < len(chunk) or (split < 2 and position + end >= cuts[split]):
                split += 1
            start = end
        position += len(chunk)
