"""Reading table files as written: CSV (separator, metadata lines above the header and decimal commas found,
never guessed silently) and Parquet / Arrow (each column as the schema types it).

The tabular DataModule reads its ``data.path`` and ``make predict``'s ``INPUTS`` here; a DataModule of your
own reads its files here too and keeps the same one-line errors. Every error is a :class:`DataError`
(``ValueError``) naming the file, the line or column, and the fix.
"""

import csv
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from .errors import DataError

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["CSV_OPTIONS", "drop_option", "file_kind", "read_columnar", "read_table"]

SEPARATORS = ",;\t|"
SAMPLE_BYTES = 1 << 16  # what the separator, the decimal mark and the field counts are read from
# A number written with a decimal comma (1,5 / -0,25), as spreadsheets export it in much of Europe.
DECIMAL_COMMA = r"[+-]?\d+,\d+"
NUMBER = r"[+-]?\d+(?:,\d+)?"  # an integer, or a number with a decimal comma


def read_table(
    path: str | Path,
    key: str,
    separator: str | None = None,
    skip_rows: int = 0,
    header: bool = True,
    encoding: str = "utf-8",
    decimal: Literal[".", ","] | None = None,
) -> pd.DataFrame:
    """A CSV file as written: every field a column, never an index pandas builds out of data.

    pandas makes the first columns of every row the index when the header has fewer fields than the
    rows (a metadata line above the data, as in scikit-learn's ``wine_data.csv``), and a model then
    trains on the remaining columns without a word; with more such lines (an export note, units) it
    fails on a row's field count. Here the lines above the data (read from the first ``SAMPLE_BYTES``)
    whose field count no row below them has are refused in one line that names them and the
    ``skip_rows`` that leaves them out.

    Args:
        path: the CSV file; ``key`` names it in errors (``data.path``, ``INPUTS``).
        separator: one character; None sniffs it among ``, ; tab |`` (csv.Sniffer).
        skip_rows: lines above the header (or above the data, without a header) to leave out.
        header: whether the first line after ``skip_rows`` names the columns; without one they are
            named ``column_0``, ``column_1``, ...
        encoding: of the file ("utf-8" also reads a byte-order mark; "latin-1", "cp1252", ...).
        decimal: the decimal mark of its numbers. None: ``.``, and when the separator is not a comma,
            a column whose every value is a number, some written with a decimal comma (``70,5``, as
            spreadsheets export in much of Europe), is read as numbers too, not as text categories.

    Raises:
        ValueError: unreadable (encoding, no rows, a row with more fields than the header), or lines
            above the header whose field count is not the rows' (``DataError``, one line).
    """
    try:
        with open(path, encoding=encoding, newline="") as file:
            sample = file.read(SAMPLE_BYTES)
    except (UnicodeDecodeError, LookupError) as error:
        raise DataError(
            f"{key}={path}: not readable as {encoding} text ({error}); set data.init_args.encoding"
        ) from None
    lines = sample.lstrip("\ufeff").splitlines()[skip_rows:]
    if len(sample) == SAMPLE_BYTES:
        lines = lines[:-1]  # the sample may end inside a line
    if separator is None:
        try:
            separator = csv.Sniffer().sniff("\n".join(lines[:50]), delimiters=SEPARATORS).delimiter
        except csv.Error:
            separator = ","
    rows = list(csv.reader(lines[:50], delimiter=separator))
    counted = [(number, len(row)) for number, row in enumerate(rows, start=skip_rows + 1) if row]
    counts = [fields for _, fields in counted]
    # Lines above the data whose field count no row below them has: metadata (a title, an export note,
    # wine_data.csv's counts line), which pandas reads as the header, an index or a row, without a word.
    data = next((k for k in range(len(counts)) if len(set(counts[k:])) == 1), 0)
    if data > 0 and len(counts) - data >= min(2, data) and counts[-1] not in counts[:data]:
        first, last = counted[0][0], counted[data - 1][0]
        named = f"line {first}, the header," if header else f"line {first}"  # header=false: a line of notes
        lines_above = f"{named} has" if first == last else f"lines {first} to {last} have"
        fields = "/".join(map(str, sorted(set(counts[:data]))))
        raise DataError(
            f"{key}={path}: {lines_above} {fields} field{'' if fields == '1' else 's'} (separator "
            f"{separator!r}) but the rows below have {counts[-1]}: not the header of these rows (metadata above "
            f"the data?). Leave {'it' if first == last else 'them'} out with data.init_args.skip_rows={last}, and "
            "if the file has no header row at all, add data.init_args.header=false (columns are then named "
            "column_0, column_1, ...)"
        )
    options = {"sep": separator, "skiprows": skip_rows, "encoding": encoding, "index_col": False}
    options["decimal"] = decimal or "."
    if not header:
        options.update(header=None, names=[f"column_{i}" for i in range(max(counts, default=0))])
    try:
        frame = pd.read_csv(path, **options)
    except pd.errors.EmptyDataError:
        raise DataError(f"{key}={path}: not a readable CSV table: it holds no rows") from None
    except pd.errors.ParserError as error:
        raise DataError(
            f"{key}={path}: not a readable CSV table ({' '.join(str(error).split())}); set data.init_args.separator "
            f"(read as {separator!r}) or leave lines above the header out with data.init_args.skip_rows"
        ) from None
    except UnicodeDecodeError as error:
        raise DataError(
            f"{key}={path}: not readable as {encoding} text ({error}); set data.init_args.encoding"
        ) from None
    if decimal is None and separator != ",":
        for name in [name for name in frame.columns if pd.api.types.is_string_dtype(frame[name])]:
            values = frame[name].dropna().astype(str).str.strip()
            if values.str.fullmatch(DECIMAL_COMMA).any() and values.str.fullmatch(NUMBER).all():
                frame[name] = pd.to_numeric(frame[name].str.replace(",", ".", regex=False))
    return frame


# Columnar files, read by their suffix: the schema gives each column's type, nothing is guessed from text.
COLUMNAR = {".parquet": "Parquet", ".pq": "Parquet", ".feather": "Arrow", ".arrow": "Arrow", ".ipc": "Arrow"}
CSV_OPTIONS = {"separator": None, "skip_rows": 0, "header": True, "encoding": "utf-8", "decimal": None}


def file_kind(path: str | Path) -> str:
    """The kind of table ``path`` holds, by suffix: "Parquet", "Arrow" (Feather v2, Arrow IPC) or "CSV" (any other)."""
    return COLUMNAR.get(Path(path).suffix.lower(), "CSV")


def read_columnar(path: str | Path, key: str, as_text: Sequence[str] = ()) -> pd.DataFrame:
    """A Parquet or Arrow table, each column as its schema types it.

    Integer and float columns are numbers (an integer column with missing values becomes float64,
    NaN where missing); decimals are numbers (float64); boolean, string and dictionary columns
    (pandas' ``category``) are categories; a column of nulls only is an empty column. Any other type
    (dates, times, durations, binary, lists, structs) is refused, naming the column and what to do,
    unless it is in ``as_text`` (dropped or id columns: read as text, never a feature). Reading runs
    no code the file names: pyarrow >= 14.0.1 (CVE-2023-47248) loads no Python extension type.

    Raises:
        DataError: not a readable Parquet / Arrow file (``key`` names the setting), a column of a
            type the model cannot take, or a Parquet table larger in memory than the memory free.
    """
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    kind = file_kind(path)
    try:
        if kind == "Parquet":
            metadata = pq.ParquetFile(path).metadata
            size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
            known = "SC_AVPHYS_PAGES" in getattr(os, "sysconf_names", {})  # Linux; not macOS or Windows
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") if known else None
            if free is not None and size > free // 2:  # pandas' copy doubles it
                raise DataError(
                    f"{key}={path}: the table takes {size / 2**30:.1f} GiB in memory, more than half of the "
                    f"{free / 2**30:.1f} GiB free; train on a sample of its rows, or on a machine with more memory"
                )
            table = pq.read_table(path)
        else:
            table = feather.read_table(path, memory_map=True)
    except (pa.ArrowException, OSError, ValueError) as error:
        problem = " ".join(str(error).split())[:300]
        raise DataError(
            f"{key}={path}: not a readable {kind} file ({problem}); check the file and its suffix"
        ) from None
    index = [name for name in (table.schema.pandas_metadata or {}).get("index_columns", []) if isinstance(name, str)]
    columns = {}
    for field in table.schema:
        if field.name in index:  # a pandas index written beside the data (to_parquet): not a column of it
            continue
        if field.name in columns:
            raise DataError(f"{key}={path}: two columns are named {field.name!r}; give each column its own name")
        kind_of = field.type.value_type if pa.types.is_dictionary(field.type) else field.type
        column = table.column(field.name)
        if field.name in as_text and not _plain_arrow_type(pa, kind_of):
            column = column.cast(pa.string()) if _castable_to_text(pa, kind_of) else pa.nulls(len(column), pa.string())
        elif pa.types.is_decimal(kind_of):
            column = column.cast(pa.float64())
        elif not _plain_arrow_type(pa, kind_of):
            dates = pa.types.is_temporal(kind_of)
            what = "dates or times" if dates else "values that are not numbers, booleans or text"
            fix = "days since a date, or year, month and day columns" if dates else "numbers"
            raise DataError(
                f"{key}={path}: column {field.name!r} holds {what} ({field.type}): a model takes numbers and "
                f"categories; convert it to {fix}, or leave it out with {drop_option([field.name])}"
            )
        columns[field.name] = column
    return pa.table(columns).to_pandas()


def _plain_arrow_type(pa, kind: Any) -> bool:
    """Whether a column of Arrow type ``kind`` is a number, a boolean, text or nulls only."""
    checks = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_null)
    text = (pa.types.is_string, pa.types.is_large_string, getattr(pa.types, "is_string_view", lambda _: False))
    return any(check(kind) for check in (*checks, *text))


def _castable_to_text(pa, kind: Any) -> bool:
    return pa.types.is_temporal(kind) or pa.types.is_decimal(kind) or pa.types.is_binary(kind)


def drop_option(names: Sequence[str]) -> str:
    """The command-line option that drops ``names``, quoted for a shell (names with spaces, quotes)."""
    return f"--data.init_args.drop_columns={shlex.quote(json.dumps(list(names)))}"
