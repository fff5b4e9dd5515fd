"""Tables from CSV, Parquet or Arrow files: numeric and categorical columns, missing values, a class or a number.

``--data.init_args.path=FILE --data.init_args.target=COLUMN`` is all a new table needs (``.parquet`` /
``.pq`` and ``.feather`` / ``.arrow`` / ``.ipc`` files are read with their schema's column types,
any other as CSV). Without a
path the DataModule serves a table that ships inside scikit-learn, so ``make train`` works
offline: ``bundled="breast_cancer"`` (569 rows, 30 numeric features, malignant or benign; Street,
Wolberg & Mangasarian, 1993, UCI) or ``bundled="diabetes"`` (442 rows, 10 features, a float
target: disease progression after one year; Efron et al., 2004, "Least Angle Regression").

Preprocessing is fitted on the training split only and saved in every checkpoint as plain numbers
and strings, so :meth:`TabularDataModule.encode` turns a raw row into the model's input long after
training (``TabularDataModule.from_checkpoint``):

- numeric columns: missing values imputed with the training mean, then standardised with the
  training mean and standard deviation; a 0/1 missing indicator is added for every column that
  has missing values in the training split (as scikit-learn's ``SimpleImputer(add_indicator=True)``);
- string (and boolean) columns: one-hot over the training split's categories; a category never
  seen in training, or a missing value, encodes as all zeros;
- the target: a class label (strings or integers) for classification, or a float standardised
  with training statistics for regression.

scikit-learn's encoders would do the same transforms, but a fitted encoder is a pickled Python
object, which ``torch.load(weights_only=True)`` rightly refuses; the statistics here are data.
{%- if cookiecutter.use_prepared == "yes" %}

A table encoded once (``make prepare``: :meth:`TabularDataModule.write_prepared`) is trained on with
``data.prepared=FOLDER``: encoded rows are read from disk, so training memory stays flat in the
table's size (prepare itself reads the table with pandas once: it must fit in memory then).
{%- endif %}
"""

import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from lightning.pytorch.utilities import rank_zero_info
from sklearn.datasets import load_breast_cancer, load_diabetes
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.engine import (
    CheckpointError,
    ConfigError,
    DataError,
    MissingFileError,
    ResumableDataModule,
    check_checkpoint,
    check_folds,
    check_fractions,
    checkpoint_arguments,
    listed,
    loading,
    read_checkpoint,
    split_indices,
)
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.prepared import MAPPING, ArrayRecords, PreparedWriter, fingerprint, open_prepared
{%- endif %}
from {{ cookiecutter.package_name }}.engine.tables import CSV_OPTIONS, drop_option, file_kind, read_columnar, read_table

TargetType = Literal["auto", "classification", "regression"]
# An integer target with at most this many distinct values is a class label (target_type "auto").
MAX_INTEGER_CLASSES = 50


def _numeric_column(column: pd.Series, name: str) -> np.ndarray:
    """A numeric column as float64, NaN where a value is missing.

    Raises:
        DataError: a value that is neither missing nor a number, or not finite as float32 (the
            model's input type), naming the first such row (0-based) and the column.
    """
    values = pd.to_numeric(column, errors="coerce").to_numpy(dtype=np.float64)
    given = column.notna().to_numpy()
    not_a_number = given & np.isnan(values)
    too_large = given & ~np.isnan(values) & ~(np.abs(values) <= np.finfo(np.float32).max)
    beyond = "is not finite within float32 (|x| <= 3.4e38)"
    for bad, problem in ((not_a_number, "is not a number"), (too_large, beyond)):
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            value = column.iloc[row]
            shown = repr(value) if isinstance(value, str) else str(value)
            raise DataError(
                f"row {row}, column {name!r}: {shown} {problem} "
                f"({int(bad.sum())} such value(s)); leave the cell empty for a missing value"
            )
    return values


def _is_number(text: Any) -> bool:
    """Whether a header field reads as a number (the first data row taken for the header)."""
    try:
        float(str(text))
    except ValueError:
        return False
    return True


def identifier_columns(frame: pd.DataFrame, ignore: list[str]) -> list[str]:
    """Text or integer columns with a distinct value on (nearly) every row: ids and dates, not features."""
    if len(frame) < 20:
        return []
    found = []
    for name in frame.columns:
        column = frame[name]
        if name in ignore or pd.api.types.is_float_dtype(column) or pd.api.types.is_bool_dtype(column):
            continue
        if column.nunique(dropna=True) >= 0.95 * len(frame):
            found.append(str(name))
    return found


def _column_report(prep: dict[str, Any], dropped: list[str], source: str, constant: Sequence[str] = ()) -> str:
    """How each column of the table is used, a line per use: numeric, categorical with its count of values,
    dropped, constant. A line names columns up to about 160 characters, then counts the rest (a table of a
    thousand columns is not a line of thirty thousand characters; ``export.json`` lists them all)."""
    numeric = [name + (" (+ missing indicator)" if c["indicator"] else "") for name, c in prep["numeric"].items()]
    categories = [
        f"{name} ({len(values)} value{'s' * (len(values) != 1)})" for name, values in prep["categorical"].items()
    ]
    uses = [
        ("numeric, standardised with training statistics", numeric),
        ("categorical, one-hot over training values", categories),
        ("dropped (data.drop_columns)", dropped),
        ("one value in every training row, nothing to learn from (kept; drop_columns drops them)", constant),
    ]
    lines = [f"Columns of {source} (target {prep['target']!r}, {prep['task']}):"]
    for use, names in uses:
        if names:
            lines.append(f"  {use} ({len(names)}): {listed(names, 160 - len(use))}")
    return "\n".join(lines)


def _row_report(split_rows: dict[str, np.ndarray], codes: np.ndarray | None, classes: Sequence[str]) -> str:
    """The rows of each split and, for classes (``codes``: each row's class index), of each class in each split."""
    splits = [name for name in ("train", "val", "test") if name in split_rows]
    line = f"  rows ({'/'.join(splits)}): {'/'.join(str(len(split_rows[name])) for name in splits)}"
    if codes is None:
        return line
    counts = [np.bincount(codes[split_rows[name]], minlength=len(classes)) for name in splits]
    per_class = [f"{name} {'/'.join(str(count[i]) for count in counts)}" for i, name in enumerate(classes)]
    return f"{line}\n  rows per class ({'/'.join(splits)}): {listed(per_class)}"


def column_list(columns: Sequence[Any], shown: int = 12) -> str:
    """``['a', 'b', ...]`` of the first ``shown`` column names, with the count of the rest."""
    names = [str(name) for name in columns]
    rest = f" and {len(names) - shown} more" if len(names) > shown else ""
    return f"{names[:shown]}{rest}"


class TabularDataModule(ResumableDataModule):
    """A table split (stratified for classes), encoded with training statistics, served as (B, F) batches.

    Batches are ``(features, targets)``: features (B, num_features) float32; targets (B,) int64
    class indices for classification, or (B,) float32 standardised values for regression.
    ``num_features``, ``num_outputs`` (classes, or 1), ``task``, ``class_names`` and
    ``target_scale`` are known as soon as the module exists: the CLI links them to the model.

    Args:
        path: a CSV, Parquet or Arrow file (by its suffix: :func:`file_kind`); None for the ``bundled``
            table. A CSV is read by :func:`read_table` (the header's field count must match the rows'; a
            metadata line above it is named, with the fix), the others by :func:`read_columnar` (types
            from the schema; dates refused with what to do).
        separator, skip_rows, header, encoding, decimal: how to read a CSV ``path`` (:func:`read_table`):
            the separator is sniffed among ``, ; tab |`` and the decimal mark (``.`` or ``,``) read
            from the numbers unless given.
        target: the column to predict (the bundled tables' is "target").
        drop_columns: columns the model must not see: leaks of the target, free text.
        id_column: a column that names each row (an id, a file name): the model does not see it, and
            predictions name their rows by it (the test split's, and an ``INPUTS=`` file's when it has
            the column; else row numbers).{{ " A prepared table names its test rows by row number." if cookiecutter.use_prepared == "yes" else "" }}
        drop_missing_target: leave out rows whose target is empty (counted in the log); by default
            they stop the run, naming their lines.
        bundled: the scikit-learn table served when ``path`` is None.
        target_type: "classification", "regression", or "auto": strings, booleans and integers
            with at most 50 distinct values are classes, anything else numeric is regression.
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.
        val_fraction, test_fraction: shares of the rows held out for validation and testing.
        split_seed: seed of the split, independent of the training seed.
        num_folds, fold: k-fold cross-validation{{ " (``make cv``)" if cookiecutter.use_sweeps == "yes" and cookiecutter.task != "language-model" else "" }}: validate on fold ``fold`` (from 0) of ``num_folds``
            of what the test split leaves (:func:`engine.datamodule.split_indices`); None: ``val_fraction``.
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: a folder ``make prepare`` wrote from this table: encoded rows are read from disk
            (the target, dropped columns, task and split settings must be the ones it was prepared with).
{%- endif %}

    Raises:
        ValueError: the file is missing, empty or not a table; ``target`` or a name in
            ``drop_columns`` is not a column; the target has a single value or missing values; a column
            is empty in every row; a class has too few rows to split. Each message names the file or
            field and the fix.
    """

    def __init__(
        self,
        path: str | None = None,
        target: str = "target",
        drop_columns: list[str] | None = None,
        id_column: str | None = None,
        drop_missing_target: bool = False,
        bundled: Literal["breast_cancer", "diabetes"] = "breast_cancer",
        target_type: TargetType = "auto",
        batch_size: int = 64,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_folds: int | None = None,
        fold: int = 0,
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: str | None = None,
{%- endif %}
        separator: str | None = None,
        skip_rows: int = 0,
        header: bool = True,
        encoding: str = "utf-8",
        decimal: Literal[".", ","] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers)
        check_fractions(val_fraction, test_fraction)
        check_folds(num_folds, fold)
{%- if cookiecutter.use_prepared == "yes" %}
        if prepared is not None and num_folds is not None:
            raise ConfigError("data.num_folds: a prepared table keeps the splits it was prepared with; use data.path")
{%- endif %}
        self.save_hyperparameters()
        self.preprocessing: dict[str, Any] | None = None  # fitted on the training split, see encode()
        self.frame: pd.DataFrame | None = None
        self._inputs_table: tuple[str, pd.DataFrame] | None = None  # read_inputs' file, until truth reads it
        self.split_rows: dict[str, np.ndarray] = {}

    # ---- what the CLI links to the model (reading the table the first time it is asked) -----------
    @property
    def num_features(self) -> int:
        """Width F of an encoded row: numeric columns, their missing indicators, one-hot categories."""
        prep = self._preprocessing()
        indicators = sum(1 for column in prep["numeric"].values() if column["indicator"])
        return len(prep["numeric"]) + indicators + sum(len(c) for c in prep["categorical"].values())

    @property
    def task(self) -> Literal["classification", "regression"]:
        return self._preprocessing()["task"]

    @property
    def num_outputs(self) -> int:
        """Number of classes, or 1 for regression."""
        prep = self._preprocessing()
        return len(prep["classes"]) if prep["task"] == "classification" else 1

    @property
    def class_names(self) -> list[str]:
        """Class names in label order (empty for regression)."""
        return list(self._preprocessing()["classes"])

    @property
    def target_scale(self) -> tuple[float, float]:
        """(mean, std) of a regression target in the training split ((0, 1) for classification)."""
        prep = self._preprocessing()
        return (prep["target_mean"], prep["target_std"])

    # ---- reading and fitting ---------------------------------------------------------------------
    def read(self) -> pd.DataFrame:
        """The whole table as a DataFrame (the bundled one when ``path`` is None).

        Raises:
            ValueError: the file is missing, empty, or not a readable CSV, Parquet or Arrow table.
        """
        path = self.hparams.path
        if path is None and self.hparams.bundled == "diabetes":
            return load_diabetes(as_frame=True, scaled=False).frame
        if path is None:
            table = load_breast_cancer(as_frame=True)
            frame = table.frame.copy()
            frame["target"] = pd.Categorical.from_codes(table.target, categories=list(table.target_names))
            return frame
        if not Path(path).is_file():
            raise DataError(f"data.path={path}: no such file; give a CSV, Parquet or Arrow file with a header row")
        frame = self._read_file(path, "data.path")
        if frame.empty:
            raise DataError(f"data.path={path}: the table has no rows; give a table with data below its header")
        return frame

    def _read_file(self, path: str, key: str) -> pd.DataFrame:
        """``path`` read by its kind (:func:`file_kind`): CSV with this module's reading options, or Parquet / Arrow.

        Raises:
            ConfigError: a CSV reading option set for a Parquet or Arrow file (their schema says it all).
        """
        hp = self.hparams
        if file_kind(path) == "CSV" and key == "INPUTS":  # rows to predict: a header, no lines above it
            return read_table(path, key, hp.separator, encoding=hp.encoding, decimal=hp.decimal)
        if file_kind(path) == "CSV":
            return read_table(path, key, hp.separator, hp.skip_rows, hp.header, hp.encoding, hp.decimal)
        set_options = [name for name, default in CSV_OPTIONS.items() if hp[name] != default]
        if set_options and key == "data.path":  # INPUTS's kind may differ from the training table's
            raise ConfigError(
                f"data.{set_options[0]}: a CSV reading option, and {key}={path} is a {file_kind(path)} file, whose "
                "schema gives its columns and types; leave the option out"
            )
        return read_columnar(path, key, as_text=[*(hp.drop_columns or []), *([hp.id_column] if hp.id_column else [])])

    def _preprocessing(self) -> dict[str, Any]:
{%- if cookiecutter.use_prepared == "yes" %}
        if self.preprocessing is None and self.hparams.prepared is not None:
            self.preprocessing = self._open_prepared().state["preprocessing"]
{%- endif %}
        if self.preprocessing is None:
            self.preprocessing = self._fit(self._frame())
        return self.preprocessing

    def _frame(self) -> pd.DataFrame:
        if self.frame is None:
            frame = self.read()
            target = self.hparams.target
            if self.hparams.drop_missing_target and target in frame.columns and frame[target].notna().any():
                kept = frame[target].notna()
                if not kept.all():
                    rank_zero_info(f"data.drop_missing_target: {int((~kept).sum())} row(s) without a target left out")
                    frame = frame[kept]  # the index keeps each row's place in the file
            self.frame = frame
        return self.frame

    def _rows_named(self, rows: np.ndarray) -> str:
        """Rows (0-based indices) as a person finds them: a CSV's file lines (1-based, after the skipped lines
        and the header), a Parquet or Arrow table's rows (0-based)."""
        if self.hparams.path is not None and file_kind(self.hparams.path) != "CSV":
            return f"rows {', '.join(map(str, rows[:5].tolist()))}{', ...' if len(rows) > 5 else ''}"
        first = 1 + self.hparams.skip_rows + (1 if self.hparams.header else 0)
        return f"file lines {', '.join(map(str, (rows[:5] + first).tolist()))}{', ...' if len(rows) > 5 else ''}"

    def _fit(self, frame: pd.DataFrame) -> dict[str, Any]:
        hp = self.hparams
        source = f"data.path={hp.path}" if hp.path else f"the bundled {hp.bundled} table"
        target = hp.target
        if target not in frame.columns:
            hint = ""
            if hp.path and hp.header and all(_is_number(name) for name in frame.columns):
                hint = (
                    f"; that header row reads as data: a file without one needs --data.init_args.header=false, "
                    f"and its columns are then column_0 to column_{len(frame.columns) - 1}"
                )
            raise DataError(
                f"data.target={target!r} is not a column of {source}; its columns are {column_list(frame.columns)}"
                + hint
            )
        labels = frame[target]
        if labels.isna().all():
            raise DataError(
                f"{source}: the target column {target!r} is empty in every row ({len(frame)}): is it the column "
                f"to predict? Its columns are {column_list(frame.columns)}"
            )
        if labels.isna().any():  # data.drop_missing_target=false: rows without a target stop the run
            empty_rows = np.flatnonzero(labels.isna().to_numpy())
            raise DataError(
                f"{source}: the target column {target!r} is empty in {len(empty_rows)} of {len(frame)} rows "
                f"({self._rows_named(empty_rows)}): fill them, or "
                "leave those rows out with --data.init_args.drop_missing_target=true"
            )
        if labels.nunique() < 2:
            raise DataError(
                f"{source}: the target column {target!r} has a single value ({labels.iloc[0]!r}): nothing to learn; "
                "choose another data.target"
            )
        dropped = list(hp.drop_columns or [])
        unknown = [name for name in dropped if name not in frame.columns or name == target]
        if unknown:
            raise DataError(
                f"data.drop_columns: {unknown} are not feature columns of {source} (the target cannot be dropped); "
                f"its columns are {column_list(frame.columns)}"
            )
        if hp.id_column is not None and (hp.id_column not in frame.columns or hp.id_column == target):
            raise DataError(
                f"data.id_column={hp.id_column!r} is not a column of {source} besides the target; "
                f"its columns are {column_list(frame.columns)}"
            )
        features = frame.drop(columns=[target, *{*dropped, *([hp.id_column] if hp.id_column else [])}])
        empty = [name for name in features.columns if features[name].isna().all()]
        if empty:
            raise DataError(
                f"{source}: column(s) {empty} are empty in every row; leave them out with {drop_option(empty)}"
            )
        if features.shape[1] == 0:
            raise DataError(f"{source}: no feature columns besides the target {target!r}")

        task = hp.target_type if hp.target_type != "auto" else _guess_task(labels)
        if task == "classification":
            classes = [
                str(c) for c in (labels.cat.categories if labels.dtype.name == "category" else sorted(labels.unique()))
            ]
            codes = labels.astype(str).map({name: i for i, name in enumerate(classes)}).to_numpy()
            counts = np.bincount(codes, minlength=len(classes))
            if counts.min() < 3:
                rare = [classes[i] for i in np.flatnonzero(counts < 3)]
                raise DataError(
                    f"{source}: class(es) {rare} of {target!r} have fewer than 3 rows, too few for a train/val/test "
                    "split; add rows, merge classes, or use data.target_type=regression for a numeric target"
                )
            self.split_rows = self._split(codes, len(frame))
        else:
            if not pd.api.types.is_numeric_dtype(labels):
                raise DataError(f"data.target_type=regression: the target column {target!r} of {source} is not numeric")
            classes, codes = [], None
            self.split_rows = self._split(None, len(frame))

        train = frame.iloc[self.split_rows["train"]]
        prep: dict[str, Any] = {"task": task, "target": target, "classes": classes}
        prep["numeric"], prep["categorical"] = {}, {}
        for name in features.columns:
            column = train[name]
            if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
                mean = float(column.mean()) if column.notna().any() else 0.0
                std = float(column.std()) if column.notna().sum() > 1 else 0.0
                prep["numeric"][str(name)] = {
                    "mean": mean,
                    "std": std if std > 0 else 1.0,  # a constant column stays constant (0) instead of NaN
                    "indicator": bool(column.isna().any()),
                }
            else:
                prep["categorical"][str(name)] = sorted(column.dropna().astype(str).unique().tolist())
        constant = [str(name) for name in features.columns if train[name].nunique(dropna=False) == 1]
        rows = _row_report(self.split_rows, codes, classes)
        rank_zero_info(f"{_column_report(prep, dropped, source, constant)}\n{rows}")
        for name in identifier_columns(features, []):
            rank_zero_info(
                f"data: column {name!r} has a distinct value on {features[name].nunique()} of {len(features)} rows: "
                f"it looks like an identifier (an id, a date), not a feature; leave it out with {drop_option([name])}, "
                f"or name the rows by it with --data.init_args.id_column={shlex.quote(str(name))}"
            )
        if task == "regression":
            values = train[target].astype(float)
            prep["target_mean"], prep["target_std"] = float(values.mean()), float(values.std() or 1.0)
        else:
            prep["target_mean"], prep["target_std"] = 0.0, 1.0
        return prep

    # ---- encoding -----------------------------------------------------------------------------
    def _split(self, labels: np.ndarray | None, rows: int) -> dict[str, np.ndarray]:
        """The split of ``rows`` rows by this module's settings, stratified by class indices ``labels``."""
        hp = self.hparams
        return split_indices(labels, rows, hp.val_fraction, hp.test_fraction, hp.split_seed, hp.num_folds, hp.fold)

    def encode(self, frame: pd.DataFrame) -> torch.Tensor:
        """Raw rows (a DataFrame with the training columns; the target column may be absent) -> (B, F) float32.

        The same code as an exported model's: :meth:`raw_rows`, then :class:`TableEncoder`.

        Raises:
            ValueError: a feature column of the training table is missing from ``frame``.
        """
        with torch.no_grad():
            return self.inference_transform()(self.raw_rows(frame))

    def encode_target(self, frame: pd.DataFrame) -> torch.Tensor:
        """The target column of ``frame``: (B,) int64 class indices or (B,) float32 standardised values."""
        prep = self._preprocessing()
        labels = frame[prep["target"]]
        if prep["task"] == "classification":
            index = {name: i for i, name in enumerate(prep["classes"])}
            return torch.tensor(labels.astype(str).map(index).to_numpy(dtype=np.int64))  # a copy: pandas' is read-only
        values = labels.to_numpy(dtype=np.float64)
        return torch.tensor((values - prep["target_mean"]) / prep["target_std"], dtype=torch.float32)

    # ---- inference: raw rows as numbers, the encoding inside the model graph ---------------------
    def raw_rows(self, frame: pd.DataFrame) -> torch.Tensor:
        """Rows as the exported model takes them: (B, numeric + categorical columns) float32.

        Numeric columns hold their raw values (NaN when missing); a categorical column holds the
        index of its value in the training categories (``export.json``'s ``categories``), -1 when
        missing or unseen. :meth:`inference_transform` then does what :meth:`encode` does.

        Raises:
            DataError: a feature column of the training table is missing from ``frame``, or a numeric
                column holds text, an infinity or a number beyond float32 (named by row and column).
        """
        prep = self._preprocessing()
        missing = [name for name in [*prep["numeric"], *prep["categorical"]] if name not in frame.columns]
        if missing:
            raise DataError(
                f"rows to encode lack the column(s) {missing} the model was trained with (an empty cell is a "
                "missing value, and is accepted: keep the column)"
            )
        parts = [_numeric_column(frame[name], name) for name in prep["numeric"]]
        for name, categories in prep["categorical"].items():
            index = {category: i for i, category in enumerate(categories)}
            codes = frame[name].astype(str).map(index).fillna(-1).to_numpy(dtype=np.float64)
            parts.append(np.where(frame[name].isna().to_numpy(), -1.0, codes))  # missing: no category
        return torch.as_tensor(np.stack(parts, axis=1), dtype=torch.float32)

    def explain_input(self, raw: torch.Tensor) -> str:
        """The numeric column of one raw row (:meth:`raw_rows`) furthest from its training mean, in deviations."""
        numeric = self._preprocessing()["numeric"]
        if not numeric:
            return ""
        values = raw[: len(numeric)].double()
        names = list(numeric)
        means = torch.tensor([numeric[name]["mean"] for name in names], dtype=torch.float64)
        stds = torch.tensor([numeric[name]["std"] for name in names], dtype=torch.float64)
        distance = ((values - means) / stds).abs().nan_to_num(0.0)  # a missing value (NaN) is the mean
        column = int(distance.argmax())
        return (
            f"column {names[column]!r} = {values[column].item():.4g} is {distance[column].item():.3g} training "
            "standard deviations from its mean, far outside the data the model learned from"
        )

    def inference_transform(self) -> nn.Module:
        """Raw rows (:meth:`raw_rows`) -> the encoded rows (B, F) the net trained on, as tensor operations."""
        return TableEncoder(self._preprocessing())
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Raw rows (N, columns) of ``split`` and targets (N,): class indices, or values in the target's units."""
{%- if cookiecutter.use_prepared == "yes" %}
        if self.hparams.prepared is not None:
            fields = self._open_prepared().split(split)
            return torch.from_numpy(fields["raw"][:]), torch.from_numpy(fields["raw_targets"][:])
{%- endif %}
        frame = self._frame().iloc[self.split_rows[split]]
        prep = self._preprocessing()
        if prep["task"] == "regression":
            values = frame[prep["target"]].to_numpy(dtype=np.float64)
            targets = torch.tensor(values, dtype=torch.float32)  # a copy: pandas's array is read-only
        else:
            targets = self.encode_target(frame)
        return self.raw_rows(frame), targets

    def raw_description(self) -> str:
        prep = self._preprocessing()
        return (
            f"one row per example: the numeric columns {list(prep['numeric'])} as raw numbers (NaN when missing), "
            f"then the categorical columns {list(prep['categorical'])} as the index of their value in "
            "export.json's categories (-1 when missing or unseen)"
        )

    def inference_metadata(self) -> dict[str, Any]:
        prep = self._preprocessing()
        return {"numeric_columns": list(prep["numeric"]), "categories": prep["categorical"], "task": prep["task"]}
{%- endif %}

    def test_ids(self) -> list[Any]:
        """The ``id_column`` values of the test rows, else their row numbers (0-based, header not counted)."""
{%- if cookiecutter.use_prepared == "yes" %}
        if self.hparams.prepared is not None:
            return self._open_prepared().split("test")["row"][:].tolist()
{%- endif %}
        if self.hparams.id_column is not None:
            return self._frame()[self.hparams.id_column].iloc[self.split_rows["test"]].astype(str).tolist()
        return self.split_rows["test"].tolist()

    def truth(self, path: str | None) -> list[Any] | None:
        """The target column as the table writes it: of the test rows (``path`` None), or of the file
        at ``path`` when it has that column (None when it has not{{ ', or for prepared data' if cookiecutter.use_prepared == 'yes' else '' }})."""
{%- if cookiecutter.use_prepared == "yes" %}
        if path is None and self.hparams.prepared is not None:
            return None
{%- endif %}
        target = self._preprocessing()["target"]
        if path is None:
            column = self._frame()[target].iloc[self.split_rows["test"]]
        else:  # the file read_inputs just read (use_inputs calls it first), read once
            read, self._inputs_table = self._inputs_table, None
            frame = read[1] if read is not None and read[0] == path else self._read_inputs_table(path)
            if target not in frame.columns:
                return None
            column = frame[target]
        return ["" if pd.isna(value) else value for value in column.tolist()]

    def _read_inputs_table(self, path: str) -> pd.DataFrame:
        return self._read_file(path, "INPUTS")

    def read_inputs(self, path: str) -> tuple[list[str], torch.Tensor]:
        """Rows of a CSV, Parquet or Arrow file with the training columns; ids are the ``id_column`` values, else row
        numbers.

{%- if cookiecutter.use_serving == "yes" %}
        Other columns (the target, notes, ids) are left out, as the server leaves out other keys of a
        request's rows; one log line names them.
{%- else %}
        Other columns (the target, notes, ids) are left out; one log line names them.
{%- endif %}

        Raises:
            FileNotFoundError: no such file.
            ValueError: not a readable table, or a training column is missing.
        """
        if not Path(path).is_file():
            raise MissingFileError(f"INPUTS={path}: no such file; give a CSV or Parquet file with the training columns")
        frame = self._read_inputs_table(path)
        self._inputs_table = (path, frame)
        if frame.empty:
            raise DataError(f"INPUTS={path}: no rows below the header; add the rows to predict")
        try:
            rows = self.raw_rows(frame)
        except DataError as error:
            raise DataError(f"INPUTS={path}: {error}") from None
        prep, id_column = self._preprocessing(), self.hparams.id_column
        ignored = [name for name in frame.columns if name not in (*prep["numeric"], *prep["categorical"], id_column)]
        if ignored:
            rank_zero_info(f"INPUTS={path}: columns the model was not trained on, left out: {ignored}")
        if id_column is not None and id_column in frame.columns:
            return frame[id_column].astype(str).tolist(), rows
        return [str(i) for i in range(len(frame))], rows
{%- if cookiecutter.use_serving == "yes" %}

    def request_schema(self) -> dict[str, Any]:
        prep = self._preprocessing()
        return {"kind": "row", "columns": [*prep["numeric"], *prep["categorical"]], "numeric": list(prep["numeric"])}

    def inputs_from_json(self, inputs: list[Any]) -> torch.Tensor:
        """Rows given as objects ``{column: value}`` (null for a missing value) -> raw rows (B, columns)."""
        return self.raw_rows(pd.DataFrame.from_records(inputs))
{%- endif %}

    def setup(self, stage: str | None = None) -> None:
        """Split and encode the table (every process, every stage; idempotent){{ "; or open the prepared one" if cookiecutter.use_prepared == "yes" else "" }}."""
        if self.train_set is not None:
            return
{%- if cookiecutter.use_prepared == "yes" %}
        if self.hparams.prepared is not None:
            prepared = self._open_prepared()
            self.preprocessing = self.preprocessing or prepared.state["preprocessing"]
            splits = [prepared.split(name) for name in ("train", "val", "test")]
            self.train_set, self.val_set, self.test_set = (ArrayRecords(s["features"], s["targets"]) for s in splits)
            self.check_batch_size()
            return
{%- endif %}
        frame = self._frame()
        prep = self._preprocessing()
        if not self.split_rows:  # preprocessing came from a checkpoint: split this table the same way
            labels = None
            if prep["task"] == "classification":  # class indices, as _fit stratified by
                index = {name: i for i, name in enumerate(prep["classes"])}
                labels = frame[prep["target"]].astype(str).map(index).to_numpy()
            self.split_rows = self._split(labels, len(frame))
        features, targets = self.encode(frame), self.encode_target(frame)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(features[rows], targets[rows]) for rows in self.split_rows.values()
        )
        self.check_batch_size()
{%- if cookiecutter.use_prepared == "yes" %}

    # ---- a prepared table: encoded once, read from disk --------------------------------------------
    def _prepared_settings(self) -> dict[str, Any]:
        hp = self.hparams
        keys = ("target", "drop_columns", "id_column", "bundled", "target_type", "val_fraction", "test_fraction")
        keys += ("split_seed", "drop_missing_target")
        keys += ("separator", "skip_rows", "header", "encoding", "decimal")  # how the CSV was read
        return {key: hp[key] for key in keys}

    def _open_prepared(self):
        """The checked prepared table (its CSV, when still at its place, must be unchanged), opened once."""
        if getattr(self, "_prepared", None) is None:
            labels = ("<i8", "<f4")  # class indices, or a regression target
            fields = {"features": ("<f4",), "targets": labels, "raw": ("<f4",), "raw_targets": labels, "row": ("<i8",)}
            prepared = open_prepared(
                self.hparams.prepared,
                type(self).__name__,
                self._prepared_settings(),
                lambda f: [f],
                source=self.hparams.path,
                fields=fields,
                state={"preprocessing": MAPPING},
                splits=("train", "val", "test"),
            )
            preprocessing = prepared.state["preprocessing"]
            if isinstance(preprocessing, dict) and preprocessing.get("task") == "classification":
                prepared.check_below("targets", len(preprocessing.get("classes") or ()), "the number of classes")
            self._prepared = prepared
        return self._prepared

    def write_prepared(self, out: str | Path, workers: int | None = None, rows: int = 1 << 16) -> dict[str, Any]:
        """Fit the preprocessing on the training split and encode the table once into a prepared data
        set at ``out``, ``rows`` rows at a time: per split the encoded features (N, F) float32 and
        targets (N,) as training reads them, and for export and predict the raw rows (N, columns)
        float32, the targets in their own units and each row's number in the table.

        Returns:
            rows per split.

        Raises:
            ValueError: see the class's table errors; a write that fails (nothing is left at ``out``).
        """
        frame, prep = self._frame(), self._preprocessing()
        path = self.hparams.path
        source = fingerprint(path, [Path(path)]) if path else {"root": None, "bundled": self.hparams.bundled}
        with PreparedWriter(out, type(self).__name__, self._prepared_settings(), source) as writer:
            for split, indices in self.split_rows.items():
                for start in range(0, len(indices), rows):
                    part = frame.iloc[indices[start : start + rows]]
                    raw = self.raw_rows(part)
                    with torch.no_grad():
                        features = self.inference_transform()(raw)
                    if prep["task"] == "regression":
                        raw_targets = part[prep["target"]].to_numpy(dtype=np.float32)
                    else:
                        raw_targets = self.encode_target(part).numpy()
                    writer.append(
                        split,
                        features=features.numpy(),
                        targets=self.encode_target(part).numpy(),
                        raw=raw.numpy(),
                        raw_targets=raw_targets,
                        row=np.asarray(indices[start : start + rows], dtype=np.int64),
                    )
            writer.state(preprocessing=prep)
        return {split: writer.manifest["splits"][split]["count"] for split in self.split_rows}
{%- endif %}

    def state_dict(self) -> dict[str, Any]:
        """The fitted preprocessing (plain data) and, from the base, where a resumed run's data starts."""
        return {**super().state_dict(), "preprocessing": self._preprocessing()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the fitted preprocessing saved by :meth:`state_dict`.

        Raises:
            engine.checkpoints.CheckpointError: the saved preprocessing is not what :meth:`_fit` writes
                (a mapping of numeric and categorical columns, numbers where numbers are written).
        """
        super().load_state_dict(state_dict)
        self.preprocessing = checked_preprocessing(state_dict.get("preprocessing"))

    @classmethod
    def from_checkpoint(cls, path: str | Path, trust: Sequence[str] = ()) -> "TabularDataModule":
        """The DataModule of a training run, with its preprocessing, to encode new raw rows.

        Raises:
            engine.checkpoints.CheckpointError: the file is missing, broken or holds no table preprocessing,
                or names code outside the trusted modules (``engine/trust.py``, ``trust``).
        """
        checkpoint = read_checkpoint(path)
        check_checkpoint(checkpoint, path, trust)  # the one check every load goes through
        hparams = checkpoint.get("datamodule_hyper_parameters", {})
        with loading(checkpoint_arguments(checkpoint, path, trust), path, trust):
            datamodule = cls(**{key: value for key, value in hparams.items() if not key.startswith("_")})
        datamodule.load_state_dict(checkpoint[cls.__qualname__])
        return datamodule


def checked_preprocessing(saved: Any) -> dict[str, Any]:
    """``saved`` if it has the shape :meth:`TabularDataModule._fit` writes, else a one-line CheckpointError."""

    def refuse(where: str, what: str) -> CheckpointError:
        return CheckpointError(
            f"the checkpoint's table preprocessing: {where} {what}; use a checkpoint written by `make train`"
        )

    if not isinstance(saved, dict):
        raise refuse("preprocessing", f"is {type(saved).__name__}, not a mapping")
    for key, kind in (("task", str), ("target", str), ("classes", list), ("numeric", dict), ("categorical", dict)):
        if not isinstance(saved.get(key), kind):
            raise refuse(f"preprocessing.{key}", f"is {saved.get(key)!r}, not a {kind.__name__}")
    for key in ("target_mean", "target_std"):
        if not isinstance(saved.get(key), int | float) or isinstance(saved.get(key), bool):
            raise refuse(f"preprocessing.{key}", "is not a number")
    for name, column in saved["numeric"].items():
        numbers = isinstance(column, dict) and all(
            isinstance(column.get(k), int | float) and math.isfinite(column[k]) for k in ("mean", "std")
        )
        if not numbers or not isinstance(column.get("indicator"), bool):
            raise refuse(f"preprocessing.numeric.{name}", "is not {mean, std, indicator}")
    for name, values in saved["categorical"].items():
        if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
            raise refuse(f"preprocessing.categorical.{name}", "is not a list of category names")
    return saved


class TableEncoder(nn.Module):
    """Raw rows (B, numeric + categorical columns) -> encoded rows (B, F), as :meth:`TabularDataModule.encode`.

    Numeric values are standardised with the training statistics, a missing one (NaN) becomes 0
    (the training mean) and sets its indicator column; a category index becomes a one-hot row
    (-1: all zeros). Plain tensor operations{{ ', so ONNX and ``torch.export`` carry the encoding' if cookiecutter.use_serving == 'yes' else '' }}.
    """

    def __init__(self, preprocessing: dict[str, Any]) -> None:
        super().__init__()
        numeric = list(preprocessing["numeric"].values())
        self.register_buffer("mean", torch.tensor([c["mean"] for c in numeric], dtype=torch.float32))
        self.register_buffer("std", torch.tensor([c["std"] for c in numeric], dtype=torch.float32))
        self.indicators = [i for i, c in enumerate(numeric) if c["indicator"]]
        self.num_numeric = len(numeric)
        self.category_counts = [len(c) for c in preprocessing["categorical"].values()]

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        numbers = rows[:, : self.num_numeric]  # (B, numeric)
        absent = torch.isnan(numbers)
        scaled = torch.where(absent, torch.zeros_like(numbers), (numbers - self.mean) / self.std)
        parts = []
        for column in range(self.num_numeric):  # the order of encode(): each value, then its indicator
            parts.append(scaled[:, column : column + 1])
            if column in self.indicators:
                parts.append(absent[:, column : column + 1].to(rows.dtype))
        for offset, count in enumerate(self.category_counts):
            codes = rows[:, self.num_numeric + offset].unsqueeze(-1)  # (B, 1)
            parts.append((codes == torch.arange(count, device=rows.device, dtype=rows.dtype)).to(rows.dtype))
        return torch.cat(parts, dim=1)


def _guess_task(labels: pd.Series) -> Literal["classification", "regression"]:
    if not pd.api.types.is_numeric_dtype(labels) or pd.api.types.is_bool_dtype(labels):
        return "classification"  # strings, categories, booleans
    if pd.api.types.is_integer_dtype(labels) and labels.nunique() <= MAX_INTEGER_CLASSES:
        return "classification"
    return "regression"
