"""Files that are data: reading one a command opens by a name it did not choose, and checking a parsed one's shape.

Such a name comes from data: a FIFO there blocks a plain ``open`` until a writer comes, and a link to
``/dev/zero`` reads forever. :func:`read_bytes` opens without blocking, admits a regular file only
(after links are followed: a link to a regular file is fine) and reads at most its bound.
"""

import json
import os
import stat
from pathlib import Path
from typing import Any

from .errors import DataError, MissingFileError


def read_bytes(path: str | Path, limit: int, field: str) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises:
        MissingFileError: no such file.
        DataError: not a regular file (a folder, FIFO, socket or device, or a link to one), or larger
            than ``limit`` bytes; the message starts with ``field`` (the option or file it came from).
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens at once, unread
    except FileNotFoundError:
        raise MissingFileError(f"{field}: no such file, {path}") from None
    except OSError as error:
        raise DataError(f"{field}: {path} cannot be opened ({error.strerror})") from None
    try:
        found = os.fstat(descriptor)
        if not stat.S_ISREG(found.st_mode):
            raise DataError(f"{field}: {path} is not a regular file (a folder, FIFO or device): refused")
        if found.st_size > limit:
            raise DataError(f"{field}: {path} is {found.st_size:,} bytes, more than the {limit:,} allowed: refused")
        with os.fdopen(os.dup(descriptor), "rb") as file:
            data = file.read(limit + 1)
    finally:
        os.close(descriptor)
    if len(data) > limit:  # it grew while read
        raise DataError(f"{field}: {path} is more than the {limit:,} bytes allowed: refused")
    return data


def read_text(path: str | Path, limit: int, field: str) -> str:
    """:func:`read_bytes` decoded as UTF-8.

    Raises:
        DataError: as :func:`read_bytes`, or not UTF-8.
    """
    try:
        return read_bytes(path, limit, field).decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataError(f"{field}: {path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def check_as_written(text: str, reference: str, free: set[str], what: str) -> None:
    """Admit the JSON ``text`` only as the project itself writes it: the keys and values of the JSON ``reference``
    everywhere but under the dotted ``free`` keys, whose values may be anything (a tokenizer's vocabulary, say).
    Admitting only the declared shape leaves no form for a hostile value to take (a Regex normalizer, a new option).

    Raises:
        DataError: ``text`` is not JSON, or differs; names ``what`` and the first key that differs.
    """
    try:
        tree = json.loads(text)
    except (ValueError, RecursionError):
        raise DataError(f"{what} is not JSON: refused") from None
    part = _first_difference(tree, json.loads(reference), free, "")
    if part is not None:
        raise DataError(f"{what}'s {part} is not as this project writes it: refused")


def _first_difference(tree: Any, reference: Any, free: set[str], where: str) -> str | None:
    if where in free:
        return None
    if isinstance(reference, dict):
        if not isinstance(tree, dict) or tree.keys() != reference.keys():
            return where or "top level"
        found = (_first_difference(tree[key], reference[key], free, f"{where}.{key}".lstrip(".")) for key in reference)
        return next((key for key in found if key is not None), None)
    return None if type(tree) is type(reference) and tree == reference else where or "top level"
