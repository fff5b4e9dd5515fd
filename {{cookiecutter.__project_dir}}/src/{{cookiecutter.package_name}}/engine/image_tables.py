"""A Hugging Face image dataset read from its shards: an image column of encoded files (the ``Image`` feature's
``{bytes, path}``, or binary) and a label column, its class names from the ``ClassLabel`` feature the dataset
declares, and its splits from its file names.

An image is read from the bytes the dataset holds, never from a path it names (data never chooses what is
read), and nothing in a file is run (:mod:`engine.table_files`; the ``huggingface`` metadata is read as JSON).
"""

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import DataError
from .table_files import named_splits, open_table, record_batches, table_errors

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["EncodedImage", "image_dataset", "opened", "table_files"]

IMAGE_TABLE_SUFFIXES = (".parquet", ".pq", ".arrow")


@dataclass(frozen=True)
class EncodedImage:
    """An image file's bytes held in a dataset's table; ``name`` says where (``<shard>, row <n>``)."""

    name: str
    data: bytes = field(repr=False)

    def __str__(self) -> str:
        return self.name


def opened(source: Path | EncodedImage) -> Path | IO[bytes]:
    """What ``PIL.Image.open`` reads for an image file or an :class:`EncodedImage`."""
    return io.BytesIO(source.data) if isinstance(source, EncodedImage) else source


def table_files(root: Path) -> list[Path]:
    """``root`` itself when it is a Parquet or Arrow file, else its shards (at its top or one folder down: the
    Hub's ``data/``, ``save_to_disk``'s split folders), in path order; [] for a folder of image folders."""
    if root.is_file():
        return [root] if root.suffix.lower() in IMAGE_TABLE_SUFFIXES else []
    found = [path for pattern in ("*", "*/*") for path in root.glob(pattern) if path.is_file()]
    return sorted(path for path in found if path.suffix.lower() in IMAGE_TABLE_SUFFIXES)


def image_dataset(
    root: Path, tables: list[Path], image_column: str, label_column: str
) -> tuple[dict[str, list[tuple[EncodedImage, int]]], list[str]]:
    """A Hugging Face image dataset's ``tables`` (its shards under ``root``, or ``root`` itself) as each split's
    (encoded image, class index), and the class names: the label column's ``ClassLabel`` names, else its sorted
    values. A shard's split is its file's (:func:`engine.table_files.named_splits`); shards that name none are one
    pool ("all").

    Raises:
        ValueError: see :func:`image_rows` and :func:`engine.table_files.named_splits`; a label outside the
            declared classes; fewer than two classes.
    """
    named = named_splits(tables, root, "data.root") if root.is_dir() else None
    found: dict[str, list[tuple[EncodedImage, Any]]] = {}
    declared: list[str] | None = None
    for split, files in (named or {"all": tables}).items():
        items = found.setdefault(split, [])
        for file in files:
            names, rows = image_rows(file, image_column, label_column)
            declared = declared or names
            items += [(EncodedImage(f"{file}, row {at}", data), value) for at, (data, value) in enumerate(rows)]
    values = sorted({value for items in found.values() for _, value in items}, key=lambda v: (str(type(v)), v))
    class_names = declared or [str(value) for value in values]
    index = {value: i for i, value in enumerate(range(len(class_names)) if declared else values)}
    for items in found.values():
        for at, (image, value) in enumerate(items):
            if value not in index:
                classes = f"the {len(class_names)} classes the dataset declares ({', '.join(class_names[:10])})"
                raise DataError(f"data.root: {image}: label {value!r} is not one of {classes}; fix the row")
            items[at] = (image, index[value])
    if len(class_names) < 2:
        raise DataError(f"data.root={root}: {len(class_names)} class(es) in column {label_column!r}; give two or more")
    return found, class_names


def image_rows(file: Path, column: str, label_column: str) -> tuple[list[str] | None, list[tuple[bytes, Any]]]:
    """(the class names ``label_column``'s ``ClassLabel`` feature declares, or None; each row's (encoded image,
    label)) of a dataset's shard.

    Raises:
        ValueError: a table that is not readable, lacks a column, whose ``column`` holds no encoded files, or
            a row without image bytes (a path only) or without a label; each names the file (and row).
    """
    import pyarrow as pa

    with table_errors(file, "data.root"):
        kind, table, schema = open_table(file)
        missing = [name for name in (column, label_column) if name not in schema.names]
        if missing:
            raise DataError(
                f"data.root: {file} has no column {missing[0]!r} (its columns: {', '.join(schema.names[:12])}); "
                "name the image and label columns in data.image_column and data.label_column"
            )
        kind_of = schema.field(column).type
        struct = pa.types.is_struct(kind_of) and kind_of.get_field_index("bytes") >= 0
        if not (struct or pa.types.is_binary(kind_of) or pa.types.is_large_binary(kind_of)):
            raise DataError(
                f"data.root: {file}: column {column!r} holds {kind_of}, not encoded images (a Hugging Face Image "
                "feature, or binary); name the image column in data.image_column"
            )
        rows: list[tuple[bytes, Any]] = []
        for batch in record_batches(kind, table, [column, label_column]):
            images = batch.column(0).field("bytes") if struct else batch.column(0)
            for data, label in zip(images.to_pylist(), batch.column(1).to_pylist(), strict=True):
                if not data or label is None:
                    lacks = "no label" if data else "no image bytes (a path is never read: a dataset holds its images)"
                    raise DataError(f"data.root: {file}, row {len(rows)}: {lacks}; fix or drop the row")
                rows.append((data, label))
    return class_label_names(schema, label_column), rows


def class_label_names(schema: Any, column: str) -> list[str] | None:
    """The class names a Hugging Face dataset declares for ``column`` (a ``ClassLabel`` feature in the
    schema's ``huggingface`` metadata), or None when it declares none."""
    raw = (schema.metadata or {}).get(b"huggingface")
    try:
        feature = json.loads(raw)["info"]["features"][column] if raw else None
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return [str(name) for name in names] if isinstance(names, list) and names else None
