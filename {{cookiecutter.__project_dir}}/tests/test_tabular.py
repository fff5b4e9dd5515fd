"""Tables: encoding with training statistics, your own CSV (strings, gaps, unseen categories), regression, bad input."""

{% if cookiecutter.use_serving == "yes" -%}
import importlib.util
{% endif -%}
import json
import logging
import re
import shlex
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import (
    CONFIGS,
    assert_ddp_run_resumes_exactly,
{%- if cookiecutter.use_prepared == "yes" %}
    assert_prepared_run_resumes_as_in_memory,
{%- endif %}
    assert_run_resumes_exactly,
    readme_commands,
    shrunk_args,
    user_error,
)

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.predict import predict
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.commands.prepare import main as prepare_main
{%- endif %}
from {{ cookiecutter.package_name }}.data import TabularDataModule, tabular
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.contract import stack_samples
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}
from {{ cookiecutter.package_name }}.engine.export import export_all
{%- endif %}
from {{ cookiecutter.package_name }}.engine.inference import load_trained

EXPERIMENT = CONFIGS / "experiments" / "tabular-csv.yaml"


def write_table(path: Path, rows: int = 600, seed: int = 0) -> Path:
    """A CSV with a numeric column with gaps, a string column with gaps, and a yes/no label.

    The label is a function of the features (x1 + 1.5 [colour is red] - 0.5 x2 > 0.3), so a model
    that uses every column, the string one included, can reach high accuracy.
    """
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=rows), rng.normal(size=rows)
    colour = rng.choice(["red", "green", "blue"], size=rows).astype(object)
    label = np.where(x1 + 1.5 * (colour == "red") - 0.5 * x2 > 0.3, "yes", "no")
    x1[rng.random(rows) < 0.15] = np.nan
    colour[rng.random(rows) < 0.10] = None
    pd.DataFrame({"x1": x1, "x2": x2, "colour": colour, "label": label}).to_csv(path, index=False)
    return path


@pytest.fixture
def table(tmp_path: Path) -> Path:
    return write_table(tmp_path / "table.csv")


def test_encoding_uses_training_statistics_and_handles_gaps_and_unseen_categories(table: Path) -> None:
    data = TabularDataModule(path=str(table), target="label")
    data.setup("fit")
    prep = data.preprocessing
    train = pd.read_csv(table).iloc[data.split_rows["train"]]
    assert prep["numeric"]["x1"]["mean"] == pytest.approx(train["x1"].mean())
    assert prep["numeric"]["x1"]["indicator"] and not prep["numeric"]["x2"]["indicator"]
    assert prep["categorical"]["colour"] == ["blue", "green", "red"]
    assert (data.task, data.num_outputs, data.class_names) == ("classification", 2, ["no", "yes"])
    assert data.num_features == 2 + 1 + 3  # x1, x2, x1's missing indicator, three colours

    rows = pd.DataFrame({"x1": [np.nan, prep["numeric"]["x1"]["mean"]], "x2": [0.0, 0.0], "colour": ["purple", "red"]})
    encoded = data.encode(rows)
    assert encoded.shape == (2, data.num_features)
    # x1 missing: imputed to the mean (0 once standardised), indicator 1; unseen colour: all zeros.
    assert encoded[0, :2].tolist() == [0.0, 1.0]  # (x1, x1 missing)
    assert encoded[1, :2].tolist() == [0.0, 0.0]
    assert encoded[0, -3:].tolist() == [0.0, 0.0, 0.0]
    assert encoded[1, -3:].tolist() == [0.0, 0.0, 1.0]


def test_the_encoding_exports_with_gaps_and_unseen_categories(table: Path) -> None:
    """encode() is raw_rows() then TableEncoder, the module inside {{ "ONNX / torch.export graphs" if cookiecutter.use_serving == "yes" else "the predictor predict runs" }}."""
    data = TabularDataModule(path=str(table), target="label")
    data.setup("fit")
    rows = pd.read_csv(table).drop(columns=["label"])
    rows.loc[0, "colour"] = "purple"  # unseen
    rows.loc[1, "x2"] = np.nan  # missing where training never was (no indicator column)
    raw = data.raw_rows(rows)  # (B, 3): x1, x2 raw with NaN, colour as a category index
    assert raw[0, 2] == -1 and raw[0, :2].tolist() == pytest.approx(rows.loc[0, ["x1", "x2"]].tolist(), nan_ok=True)
    encoded = data.encode(rows)
    assert encoded[1, 2] == 0.0  # x2 missing: imputed to the mean, 0 once standardised
    assert encoded[0, -3:].tolist() == [0.0, 0.0, 0.0]  # the unseen colour: no category
    program = torch.export.export(data.inference_transform(), (raw[:7],))  # exportable as it is
    torch.testing.assert_close(program.module()(raw[:7]), encoded[:7], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_own_csv_trains_to_85_percent_and_a_raw_row_is_predicted_from_the_checkpoint(
    table: Path, tmp_path: Path
) -> None:
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.path={table}"]
    cli = main(["fit", *args, "--data.init_args.target=label", "--trainer.max_epochs=25"])
    run = Path(cli.trainer.checkpoint_callback.dirpath).parent
    summary = json.loads((run / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.85  # measured: 0.94 at the default 40 epochs
    assert (run / "curves.png").is_file() and (run / "confusion_matrix.png").is_file()

    # Later, with only the checkpoint: the preprocessing and the class names travel in it.
    best = summary["checkpoint"]
    trained = load_trained(best)  # as the README shows
    data, model = trained.datamodule, trained.model
    assert TabularDataModule.from_checkpoint(best).state_dict()["preprocessing"] == data.state_dict()["preprocessing"]
    rows = pd.DataFrame({"x1": [3.0, -3.0], "x2": [0.0, 0.0], "colour": ["red", "never-seen"]})
    with torch.no_grad():
        probabilities = model.predict_step((data.encode(rows),), 0)
    names = [model.hparams.class_names[i] for i in probabilities.argmax(dim=-1)]
    assert names == ["yes", "no"]


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the gpu preset)")
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_gpu_preset_trains_a_table_to_85_percent(table: Path, tmp_path: Path, precision: str, compile: bool) -> None:
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip(f"{torch.cuda.get_device_name()} has no bfloat16")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.path={table}"]
    gpu = [f"--config={CONFIGS / 'presets' / 'gpu.yaml'}", "--trainer.accelerator=gpu"]
    options = [f"--trainer.precision={precision}", f"--model.init_args.compile={str(compile).lower()}"]
    cli = main(["fit", *args, *gpu, *options, "--data.init_args.target=label", "--trainer.max_epochs=25"])
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.85  # as on the CPU in float32
    # The checkpoint loads on a machine without a GPU and predicts there.
    trained = load_trained(summary["checkpoint"], map_location="cpu")
    rows = pd.DataFrame({"x1": [3.0, -3.0], "x2": [0.0, 0.0], "colour": ["red", "blue"]})
    with torch.no_grad():
        probabilities = trained.model.predict_step((trained.datamodule.encode(rows),), 0)
    assert [trained.model.hparams.class_names[i] for i in probabilities.argmax(dim=-1)] == ["yes", "no"]


@pytest.mark.slow
def test_regression_on_the_bundled_diabetes_table_beats_the_mean(tmp_path: Path) -> None:
    regression = CONFIGS / "experiments" / "tabular-regression.yaml"
    cli = main(["fit", *shrunk_args(tmp_path), f"--config={regression}", "--trainer.max_epochs=30"])
    run = Path(cli.trainer.checkpoint_callback.dirpath).parent
    metrics = json.loads((run / "test_metrics.json").read_text())
    assert (run / "curves.png").is_file() and not (run / "confusion_matrix.png").exists()  # no classes to confuse
    # Predicting the training mean gives R2 <= 0 and an MAE of about 64 (disease-progression units).
    assert metrics["metrics"]["test/r2"] > 0.1
    assert metrics["metrics"]["test/mae"] < 55
    predictions = cli.model.predict_step(next(iter(cli.datamodule.test_dataloader())), 0)
    assert predictions.ndim == 1 and 25 < predictions.mean() < 350  # in the target's units, not standardised


@pytest.mark.parametrize(
    ("content", "target", "message"),
    [
        ("a,b\n1,2\n3,4\n", "label", r"data.target='label' is not a column .* \['a', 'b'\]"),
        ("a,label\n1,x\n2,x\n3,x\n", "label", "has a single value"),
        ("a,empty,label\n1,,x\n2,,y\n3,,x\n4,,y\n5,,x\n6,,y\n", "label", r"\['empty'\] are empty in every row; "),
        (
            "a,label\n1,x\n2,\n",
            "label",
            r"'label' is empty in 1 of 2 rows \(file lines 3\): .*drop_missing_target=true",
        ),
        ("a,label\n1,\n2,\n", "label", r"'label' is empty in every row \(2\): is it the column to predict"),
        ("", "label", "not a readable CSV"),
    ],
    ids=["no-target-column", "one-value", "empty-column", "missing-label", "no-label", "empty-file"],
)
def test_bad_tables_fail_before_training_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str, target: str, message: str
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(content)
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), f"--data.init_args.path={bad}", f"--data.init_args.target={target}"])
    assert not [path for path in tmp_path.rglob("*") if path.is_file() and path != bad]  # no run folder, no file


def test_drop_columns_keeps_a_column_from_the_model_and_every_column_is_reported(
    table: Path, caplog: pytest.LogCaptureFixture
) -> None:
    frame = pd.read_csv(table)
    frame.insert(0, "row_id", np.arange(len(frame)))  # an id: a column a model must never see
    frame.to_csv(table, index=False)
    with caplog.at_level(logging.INFO):
        data = TabularDataModule(path=str(table), target="label", drop_columns=["row_id"])
        data.setup("fit")
    assert list(data.preprocessing["numeric"]) == ["x1", "x2"] and data.num_features == 2 + 1 + 3
    report = caplog.text
    assert f"Columns of data.path={table} (target 'label', classification):" in report
    assert "numeric, standardised with training statistics (2): x1 (+ missing indicator), x2" in report
    assert "categorical, one-hot over training values (1): colour (3 values)" in report
    assert "dropped (data.drop_columns) (1): row_id" in report
    # Rows, and rows of each class, in each split (what the image folders' report gives too).
    splits = data.split_rows
    assert f"rows (train/val/test): {len(splits['train'])}/{len(splits['val'])}/{len(splits['test'])}" in report
    labels = frame["label"].astype(str).to_numpy()
    per_class = [
        f"{name} " + "/".join(str((labels[splits[s]] == name).sum()) for s in ("train", "val", "test"))
        for name in data.preprocessing["classes"]
    ]
    assert f"rows per class (train/val/test): {', '.join(per_class)}" in report
    # Predicting needs only the columns the model uses: the id may be absent.
    assert data.encode(frame.drop(columns=["row_id", "label"]).head(3)).shape == (3, 6)
    for wrong in (["rowid"], ["label"]):
        with pytest.raises(ValueError, match=r"data.drop_columns: \['\w+'\] are not feature columns of .*row_id"):
            TabularDataModule(path=str(table), target="label", drop_columns=wrong).setup("fit")


def test_a_csv_is_read_as_written_never_with_data_turned_into_an_index(
    table: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # scikit-learn's wine_data.csv shape: a metadata line (rows, features, class names), no header, then
    # rows of 13 features and the class. pandas made 9 features the index and trained on 4, silently.
    rng = np.random.default_rng(0)
    features, classes = rng.normal(size=(90, 13)).round(3), rng.integers(0, 3, size=90)
    rows = [",".join([*map(str, row), str(c)]) for row, c in zip(features, classes, strict=True)]
    lines = ["90,13,class_0,class_1,class_2", *rows]
    wine = tmp_path / "wine_data.csv"
    wine.write_text("\n".join(lines) + "\n")
    metadata = r"line 1, the header, has 5 fields .* the rows below have 14: .*skip_rows=1"
    with pytest.raises(ValueError, match=metadata):
        _ = TabularDataModule(path=str(wine), target="column_13").num_features
    with pytest.raises(ValueError, match=r": line 1 has 5 fields .* the rows below have 14: .*skip_rows=1"):
        _ = TabularDataModule(path=str(wine), target="column_13", header=False).num_features  # no header named
    data = TabularDataModule(path=str(wine), target="column_13", skip_rows=1, header=False)
    assert data.num_features == 13 and data.num_outputs == 3  # every feature, no index built from data

    # A ';' file: the separator is sniffed (it was read as one column named "x1;x2;colour;label").
    semicolons = tmp_path / "semicolons.csv"
    pd.read_csv(table).to_csv(semicolons, sep=";", index=False)
    assert TabularDataModule(path=str(semicolons), target="label").num_features == 2 + 1 + 3

    # A column with a distinct value on every row (an id, a date) is named, with the option that drops it.
    frame = pd.read_csv(table)
    frame.insert(0, "date", [f"2026-01-{i % 28 + 1:02d}T{i % 24:02d}:{i % 60:02d}" for i in range(len(frame))])
    frame.to_csv(table, index=False)
    with caplog.at_level(logging.INFO):
        TabularDataModule(path=str(table), target="label").setup("fit")
    assert "column 'date' has a distinct value on" in caplog.text
    assert "looks like an identifier (an id, a date), not a feature; leave it out with" in caplog.text
    assert """--data.init_args.drop_columns='["date"]'""" in caplog.text


def test_a_european_spreadsheet_export_reads_its_numbers_as_numbers_once_its_notes_are_skipped(
    table: Path, tmp_path: Path
) -> None:
    # Two lines of notes above the header, ';' between fields, decimal commas, an id: how a spreadsheet
    # in much of Europe exports. pandas failed on the second note ("Expected 1 fields in line 3, saw 5",
    # over two lines), and a column of 70,5-style numbers became one-hot categories of its strings.
    frame = pd.read_csv(table)
    frame.insert(0, "id", [f"P{i:04d}" for i in range(len(frame))])
    export = tmp_path / "export.csv"
    body = frame.to_csv(sep=";", index=False, decimal=",")
    export.write_text("# Exported from LabDB 3.2 on 2026-11-01\n# units: mm\n" + body)
    assert "," in frame.to_csv(sep=";", index=False, decimal=",").splitlines()[1]  # the numbers have commas
    notes = r"lines 1 to 2 have 1 field \(separator ';'\) but the rows below have 5: .*skip_rows=2"
    with pytest.raises(ValueError, match=notes):
        _ = TabularDataModule(path=str(export), target="label").num_features
    data = TabularDataModule(path=str(export), target="label", skip_rows=2, drop_columns=["id"])
    data.setup("fit")
    assert list(data.preprocessing["numeric"]) == ["x1", "x2"] and data.num_features == 2 + 1 + 3
    read = tabular.read_table(export, "data.path", skip_rows=2)
    pd.testing.assert_series_equal(read["x1"], frame["x1"])  # the same floats as the ',' file
    # INPUTS= is read the same way; decimal='.' reads text, as the option says.
    inputs, plain = tmp_path / "inputs.csv", tmp_path / "plain.csv"
    inputs.write_text(frame.drop(columns=["label"]).head(4).to_csv(sep=";", index=False, decimal=","))
    frame.drop(columns=["label"]).head(4).to_csv(plain, index=False)
    (ids, rows), (plain_ids, plain_rows) = data.read_inputs(str(inputs)), data.read_inputs(str(plain))
    assert ids == plain_ids and rows.shape == (4, 3)
    torch.testing.assert_close(rows, plain_rows, rtol=0, atol=0, equal_nan=True)
    assert not pd.api.types.is_numeric_dtype(tabular.read_table(export, "data.path", skip_rows=2, decimal=".")["x1"])
    commas = tabular.read_table(export, "data.path", skip_rows=2, decimal=",")  # pandas' own, every column
    pd.testing.assert_frame_equal(commas, read)
    # A line pandas cannot split is still one line, with the options that fix it.
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b,label\n" + "1,2,x\n" * 30 + "1,2,3,4,x\n")
    with pytest.raises(ValueError, match=r"^[^\n]*not a readable CSV table \(.*\); set data.init_args.separator"):
        tabular.read_table(ragged, "data.path")


def test_an_id_column_names_predictions_and_other_columns_are_left_out_of_{{ "files_and_requests" if cookiecutter.use_serving == "yes" else "files" }}(
    table: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    frame = pd.read_csv(table)
    frame.insert(0, "batch_id", [f"b{i:04d}" for i in range(len(frame))])
    frame.to_csv(table, index=False)
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.path={table}"]
    cli = main(["fit", *args, "--data.init_args.target=label", "--data.init_args.id_column=batch_id"])
    assert cli.datamodule.num_features == 2 + 1 + 3  # the id is not a feature
    best = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    tested = predict(ckpt=best["checkpoint"], output=tmp_path / "test.csv", accelerator="cpu")
    test_rows = cli.datamodule.split_rows["test"]
    assert pd.read_csv(tested)["id"].tolist() == frame["batch_id"].iloc[test_rows].tolist()
    assert pd.read_csv(tested)["true_label"].tolist() == frame["label"].iloc[test_rows].tolist()
    # Rows that keep their label: it is the file's true_label column, beside the prediction; the file is read once.
    frame.head(5).to_csv(tmp_path / "labelled.csv", index=False)
    reads = []
    read_table = tabular.read_table
    monkeypatch.setattr(
        tabular, "read_table", lambda path, *args, **kwargs: reads.append(path) or read_table(path, *args, **kwargs)
    )
    labelled = predict(ckpt=best["checkpoint"], inputs=str(tmp_path / "labelled.csv"), output=tmp_path / "l-p.csv")
    assert pd.read_csv(labelled)["true_label"].tolist() == frame["label"].head(5).tolist()
    assert reads.count(str(tmp_path / "labelled.csv")) == 1

    # New rows with the id, a column the model never saw, and no label{{ ": one rule for files and requests" if cookiecutter.use_serving == "yes" else "" }}.
    new = frame.drop(columns=["label"]).head(5).assign(note="checked")
    new.to_csv(tmp_path / "new.csv", index=False)
    with caplog.at_level(logging.INFO):
        written = predict(ckpt=best["checkpoint"], inputs=str(tmp_path / "new.csv"), output=tmp_path / "new-p.csv")
    assert f"INPUTS={tmp_path / 'new.csv'}: columns the model was not trained on, left out: ['note']" in caplog.text
    predicted = pd.read_csv(written)
    assert predicted["id"].tolist() == ["b0000", "b0001", "b0002", "b0003", "b0004"]
    assert list(predicted.columns) == ["id", "label", "probability"]  # no label in the file: no true_label
{%- if cookiecutter.use_serving == "yes" %}
    trained = load_trained(best["checkpoint"])
    records = json.loads(new.to_json(orient="records"))  # as a client sends them: the id and the note too
    if importlib.util.find_spec("litserve") is not None:  # the serve extra: the server's own check of them
        from {{ cookiecutter.package_name }}.serving.api import check_inputs

        check_inputs(records, {**trained.datamodule.request_schema(), "max_inputs": 5})
    from_file = trained.datamodule.read_inputs(str(tmp_path / "new.csv"))[1]
    torch.testing.assert_close(trained.datamodule.inputs_from_json(records), from_file, rtol=0, atol=0, equal_nan=True)
    gap = "an empty cell is a missing value, and is accepted: keep the column"
    with pytest.raises(ValueError, match=rf"lack the column\(s\) \['x1'\] the model was trained with \({gap}\)"):
        trained.datamodule.inputs_from_json([{"x2": 0.0, "colour": "red"}])

    # With the table moved away, an export checks itself on the rows given, or asks for them in one line.
    table.rename(tmp_path / "moved.csv")
    with pytest.raises(ValueError, match=r"the training data is not at hand \(.*\): give INPUTS=<your inputs>"):
        export_all(load_trained(best["checkpoint"]), tmp_path / "export", onnx=False)
    given = str(tmp_path / "new.csv")
    record = export_all(load_trained(best["checkpoint"]), tmp_path / "export", onnx=False, inputs=given)
    assert record["checked_on"] == f"INPUTS={tmp_path / 'new.csv'}" and record["test_scores"] == {}
{%- endif %}


def test_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"data.path=.*nothing.csv: no such file"):
        _ = TabularDataModule(path=str(tmp_path / "nothing.csv")).num_features


def test_preprocessing_restored_from_a_checkpoint_splits_and_encodes_the_table_the_same_way(table: Path) -> None:
    trained = TabularDataModule(path=str(table), target="label")
    trained.setup("fit")
    restored = TabularDataModule(path=str(table), target="label")
    restored.load_state_dict(trained.state_dict())  # what from_checkpoint does
    restored.setup("fit")
    for split in ("train", "val", "test"):
        assert (restored.split_rows[split] == trained.split_rows[split]).all()
    assert torch.equal(restored.test_set.tensors[0], trained.test_set.tensors[0])


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda prep: {}, r"preprocessing.task is None"),
        (lambda prep: 5, r"preprocessing is int, not a mapping"),
        (lambda prep: {**prep, "numeric": dict(x=dict(mean="a", std=1.0, indicator=False))}, r"numeric.x is not"),
        (lambda prep: {**prep, "categorical": dict(c="abc")}, r"categorical.c is not a list of category names"),
    ],
)
def test_a_saved_preprocessing_of_another_shape_is_one_line(table: Path, change, named: str) -> None:
    # It is data from a checkpoint: a KeyError or a TypeError deep in the encoder was the user's message.
    from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError

    trained = TabularDataModule(path=str(table), target="label")
    trained.setup("fit")
    state = trained.state_dict()
    state["preprocessing"] = change(state["preprocessing"])
    with pytest.raises(CheckpointError, match=named) as refused:
        TabularDataModule(path=str(table), target="label").load_state_dict(state)
    assert "\n" not in str(refused.value)
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.parametrize("bundled", [None, "diabetes", "parquet"])
def test_a_prepared_table_holds_exactly_what_memory_would(tmp_path: Path, table: Path, bundled: str | None) -> None:
    # A CSV with gaps and strings (classification) read 100 rows at a time, the bundled regression table, and a
    # Parquet table with typed columns (categories, a boolean and an integer with gaps).
    settings = {"path": str(table), "target": "label"} if bundled is None else {"path": None, "bundled": bundled}
    if bundled == "parquet":
        typed_frame(tmp_path).to_parquet(path := tmp_path / "typed.parquet")
        settings = {"path": str(path), "target": "label", "drop_columns": ["customer"]}
    out = tmp_path / "prepared"
    counts = TabularDataModule(**settings).write_prepared(out, rows=100)
    in_memory, on_disk = TabularDataModule(**settings), TabularDataModule(**settings, prepared=str(out))
    for data in (in_memory, on_disk):
        data.setup("fit")
    for split in ("train", "val", "test"):
        expected, actual = (stack_samples(getattr(data, f"{split}_set")) for data in (in_memory, on_disk))
        assert all(torch.equal(a, b) for a, b in zip(expected, actual, strict=True))
        assert counts[split] == len(expected[0])
{%- if cookiecutter.use_serving == "yes" %}
        expected, actual = in_memory.raw_inputs(split), on_disk.raw_inputs(split)
        assert torch.equal(expected[0].nan_to_num(-9.0), actual[0].nan_to_num(-9.0))  # raw rows keep their gaps
        assert torch.equal(expected[1], actual[1])
{%- endif %}
    assert on_disk.test_ids() == in_memory.test_ids() and on_disk.preprocessing == in_memory.preprocessing
    assert (on_disk.num_features, on_disk.class_names) == (in_memory.num_features, in_memory.class_names)
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow  # a SIGTERM and a resume: two more processes (CI: .ci/slow)
def test_a_prepared_table_trains_and_resumes_exactly_as_in_memory_after_it_moved(tmp_path: Path, table: Path) -> None:
    # The reference: in memory, 2 epochs of 7 batches. The prepared run reads rows from disk through
    # two loader workers, is stopped by SIGTERM after step 10 (mid-epoch 2), its CSV moved away, and resumed.
    out = tmp_path / "prepared"
    source = [f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}", f"--data.init_args.path={table}"]
    prepare_main(["--out", str(out), *source])
    common = [f"--config={EXPERIMENT}", f"--data.init_args.path={table}", "--trainer.max_epochs=2"]
    common += ["--test_after_fit=false", "--trainer.deterministic=true", "--trainer.log_every_n_steps=2"]
    assert_prepared_run_resumes_as_in_memory(tmp_path, common, out, table, step=10)

    # Damage is named before training: a changed table, settings other than the prepared ones.
    write_table(tmp_path / "moved.csv", rows=601).rename(table)
    bad = ["fit", *shrunk_args(tmp_path / "bad"), *common, f"--data.init_args.prepared={out}"]
    with user_error(r"its source .*table.csv changed since prepare \(1 files, .* bytes then; 1 files, .*prepare again"):
        main(bad)
    with user_error(r"data.split_seed=1, but data.prepared=.* was prepared with split_seed=0"):
        main([*bad, "--data.init_args.split_seed=1"])
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").rglob("*.*"))
{%- endif %}
{%- if cookiecutter.use_prepared == "yes" %}


@pytest.mark.slow
def test_a_prepared_table_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path, table: Path) -> None:
    # Two processes, each reading its share of the prepared rows (4 batches an epoch), 2 epochs;
    # SIGTERM after step 6, mid-epoch 2.
    out = tmp_path / "prepared"
    prepare_main(["--out", str(out), f"--config={CONFIGS / 'default.yaml'}", f"--config={EXPERIMENT}",
                  f"--data.init_args.path={table}"])  # fmt: skip
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={table}", f"--data.init_args.prepared={out}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=2"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=6)
{%- else %}


@pytest.mark.slow
def test_a_table_under_ddp_stopped_by_sigterm_resumes_exactly(tmp_path: Path, table: Path) -> None:
    # Two processes, each reading its share of the rows (4 batches an epoch), 2 epochs; SIGTERM after
    # step 6, mid-epoch 2.
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={table}"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=2"]
    assert_ddp_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=6)
{%- endif %}


def test_table_messages_give_counts_and_options_a_shell_takes_as_they_are(tmp_path: Path, caplog) -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({f"indicator {i}": rng.normal(size=120) for i in range(40)})
    frame["Country Name"] = [f"country {i}" for i in range(120)]  # an identifier with a space in its name
    frame["2012"], frame["same"] = np.nan, 1.0
    frame["label"] = np.where(frame["indicator 0"] > 0, "yes", "no").astype(object)
    frame.loc[rng.choice(120, size=17, replace=False), "label"] = None
    path = tmp_path / "wide.csv"
    frame.to_csv(path, index=False)
    args = ["fit", *shrunk_args(tmp_path), f"--data.init_args.path={path}", "--data.init_args.target=label"]
    with user_error(r"'label' is empty in 17 of 120 rows \(file lines \d+, \d+, \d+, \d+, \d+, \.\.\.\)"):
        main(args)
    with user_error(
        """\\['2012'\\] are empty in every row; leave them out with --data.init_args.drop_columns='\\["2012"\\]'"""
    ):
        main([*args, "--data.init_args.drop_missing_target=true"])
    options = shlex.split("""--data.init_args.drop_columns='["2012"]'""")  # the option as the message gives it
    with caplog.at_level(logging.INFO):
        cli = main([*args[1:], "--data.init_args.drop_missing_target=true", *options], run=False)
        cli.datamodule.setup("fit")
    assert sum(len(rows) for rows in cli.datamodule.split_rows.values()) == 120 - 17
    assert "data.drop_missing_target: 17 row(s) without a target left out" in caplog.text
    report = [line for line in caplog.text.splitlines() if line.startswith("  ")]  # the column report's lines
    assert max(map(len, report)) <= 200  # 40 columns, not one line of 800 characters
    assert re.search(r"numeric, standardised with training statistics \(41\): indicator 0, .* and \d+ more$", report[0])
    constant = "one value in every training row, nothing to learn from (kept; drop_columns drops them) (1): same"
    assert constant in "\n".join(report)
    drop = r"(--data\.init_args\.drop_columns='\[\"Country Name\"\]')"
    hint = re.search(rf"leave it out with {drop}, or name the rows by it with (.*)$", caplog.text, re.M)
    assert hint is not None, caplog.text
    frame.drop(columns=["2012"]).to_csv(path, index=False)
    for option in hint.groups():  # each pastes into a shell as one argument the CLI takes
        cli = main([*args[1:], "--data.init_args.drop_missing_target=true", *shlex.split(option)], run=False)
        assert "Country Name" not in cli.datamodule.preprocessing["categorical"]


def test_the_readmes_headerless_table_recipe_trains_on_scikit_learns_wine_data(tmp_path: Path) -> None:
    import sklearn

    wine = Path(sklearn.__file__).parent / "datasets" / "data" / "wine_data.csv"
    command = readme_commands("A table without a header row")[0]
    arguments = shlex.split(command.removeprefix("make train ARGS="))[0].replace("=wine_data.csv", f"={wine}")
    cli = main(["fit", *shrunk_args(tmp_path), *arguments.split(), "--trainer.max_epochs=30"])
    assert cli.datamodule.num_features == 13 and cli.datamodule.num_outputs == 3
    assert cli.trainer.callback_metrics["test/acc"] >= 0.9  # 178 wines, 3 cultivars: an easy table
    # The same file read as if its first row were a header: the one line says what to do.
    header_row = "that header row reads as data: a file without one needs --data.init_args.header=false"
    with user_error(rf"is not a column .*{header_row}, and its columns are then column_0 to column_13"):
        main(["fit", *shrunk_args(tmp_path), f"--data.init_args.path={wine}", "--data.init_args.skip_rows=1"])


# ---- Parquet and Arrow tables: the schema's types, the same rows as a CSV's -----------------------------------


def typed_frame(folder: Path, rows: int = 600) -> pd.DataFrame:
    """write_table's rows with typed columns, as a warehouse export holds them: category (dictionary) columns,
    a boolean and an integer with gaps, an id, and the index a filter leaves (pandas writes it beside the data)."""
    rng = np.random.default_rng(1)
    frame = pd.read_csv(write_table(folder / "rows.csv", rows))
    frame["colour"] = frame["colour"].astype("category")
    frame["label"] = frame["label"].astype("category")
    member, gaps = rng.random(rows) < 0.5, rng.random(rows) < 0.1
    frame["member"] = pd.array([None if gap else bool(m) for gap, m in zip(gaps, member, strict=True)], "boolean")
    visits, gaps = rng.integers(0, 9, rows), rng.random(rows) < 0.1
    frame["visits"] = pd.array([None if gap else int(v) for gap, v in zip(gaps, visits, strict=True)], "Int64")
    frame.insert(0, "customer", [f"c{i:05d}" for i in range(rows)])
    frame.index = frame.index * 2 + 10  # a filtered frame's index: to_parquet stores it as a column of the file
    return frame


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_a_parquet_or_arrow_table_gives_the_split_and_encoding_of_the_same_rows_as_a_csv(
    tmp_path: Path, suffix: str
) -> None:
    frame = typed_frame(tmp_path)
    columnar, csv = tmp_path / f"table{suffix}", tmp_path / "table.csv"
    frame.to_parquet(columnar) if suffix == ".parquet" else frame.to_feather(columnar)  # feather: no index
    frame.to_csv(csv, index=False)
    read = {}
    for path in (columnar, csv):
        read[path.suffix] = data = TabularDataModule(path=str(path), target="label", id_column="customer")
        data.setup("fit")
    typed, plain = read[suffix], read[".csv"]
    assert typed.preprocessing == plain.preprocessing  # the index written beside the data is no column
    assert typed.preprocessing["categorical"]["member"] == ["False", "True"]  # a boolean: a category, gaps apart
    assert typed.preprocessing["numeric"]["visits"]["indicator"]  # an integer with gaps: a number, NaN-imputed
    assert typed.num_features == 2 + 1 + 3 + 2 + 1 + 1  # x1 (+ gap), x2, colours, member, visits (+ gap)
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(typed.split_rows[name], plain.split_rows[name])
    torch.testing.assert_close(typed.train_set.tensors, plain.train_set.tensors, rtol=0, atol=0)
    assert typed.test_ids() == plain.test_ids() == frame["customer"].iloc[typed.split_rows["test"]].tolist()


@pytest.mark.slow
def test_a_typed_parquet_table_trains_to_85_percent_and_scores_as_its_csv(tmp_path: Path) -> None:
    # Categories, a boolean and an integer with gaps, an id column: the Parquet file and the same rows as a CSV give
    # the same split and encoding, so the same seeded run reaches the same test metrics.
    frame = typed_frame(tmp_path)
    frame.to_parquet(columnar := tmp_path / "table.parquet")
    frame.to_csv(csv := tmp_path / "table.csv", index=False)
    scores = {}
    for path in (columnar, csv):
        args = [*shrunk_args(tmp_path / path.suffix[1:]), f"--config={EXPERIMENT}", f"--data.init_args.path={path}"]
        data = ["--data.init_args.target=label", "--data.init_args.id_column=customer"]
        cli = main(["fit", *args, *data, "--trainer.max_epochs=25", "--trainer.deterministic=true"])
        run = Path(cli.trainer.checkpoint_callback.dirpath).parent
        scores[path.suffix] = json.loads((run / "test_metrics.json").read_text())["metrics"]
    assert scores[".parquet"]["test/acc"] >= 0.85
    assert scores[".parquet"] == pytest.approx(scores[".csv"], rel=1e-6)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda f: f.assign(seen=pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(len(f)), "D")),
            r"column 'seen' holds dates or times \(timestamp\[\w+\]\): .*days since a date, or year, month and day "
            r"columns, or leave it out with --data.init_args.drop_columns='\[\"seen\"\]'",
        ),
        (lambda f: f.assign(tags=[["a", "b"]] * len(f)), r"column 'tags' holds values that are not numbers, booleans"),
        (lambda f: f.assign(blob=[b"\x00\x01"] * len(f)), r"column 'blob' holds values that are not numbers"),
        (lambda f: f.iloc[:0], r"the table has no rows"),
    ],
    ids=["dates", "lists", "bytes", "no-rows"],
)
def test_a_parquet_column_the_model_cannot_take_fails_before_training_and_writes_nothing(
    tmp_path: Path, change, message: str
) -> None:
    path = tmp_path / "data" / "table.parquet"
    path.parent.mkdir()
    change(typed_frame(tmp_path)).to_parquet(path)
    with user_error(rf"data.path={re.escape(str(path))}: {message}"):
        main(["fit", *shrunk_args(tmp_path / "runs"), f"--data.init_args.path={path}", "--data.init_args.target=label"])
    assert not [path for path in (tmp_path / "runs").rglob("*") if path.is_file()]  # no run folder, no file


def test_a_dropped_date_column_and_a_date_id_are_read_as_text_never_features(tmp_path: Path) -> None:
    frame = typed_frame(tmp_path).drop(columns=["customer"])
    frame["seen"] = pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(len(frame)), "D")
    frame["logged"] = pd.Timestamp("2026-01-01") + pd.to_timedelta(np.arange(len(frame)), "min")
    frame.to_parquet(path := tmp_path / "table.parquet")
    data = TabularDataModule(path=str(path), target="label", drop_columns=["seen"], id_column="logged")
    data.setup("fit")
    assert "seen" not in data.preprocessing["numeric"] | data.preprocessing["categorical"]
    assert pd.Timestamp(data.test_ids()[0]) == frame["logged"].iloc[data.split_rows["test"][0]]  # as Arrow writes it


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (lambda path: path.write_bytes(b"PAR1" + bytes(range(256)) * 4), "not a readable Parquet file"),
        (lambda path: path.write_bytes(path.with_suffix(".whole").read_bytes()[:-40]), "not a readable Parquet file"),
        (lambda path: path.write_text("a,label\n1,x\n"), "not a readable Parquet file"),
    ],
    ids=["garbage", "truncated", "a-csv-named-parquet"],
)
def test_a_broken_parquet_file_is_one_line_naming_it(tmp_path: Path, write, message: str) -> None:
    typed_frame(tmp_path).to_parquet(tmp_path / "table.whole")
    write(path := tmp_path / "table.parquet")
    with user_error(rf"data.path={re.escape(str(path))}: {message} \(.*\); check the file and its suffix"):
        main(["fit", *shrunk_args(tmp_path / "runs"), f"--data.init_args.path={path}", "--data.init_args.target=label"])


def test_a_parquet_table_larger_than_the_free_memory_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A few kilobytes on disk may expand to any size: the row groups' sizes in memory are in the footer.
    typed_frame(tmp_path).to_parquet(path := tmp_path / "table.parquet")
    from {{ cookiecutter.package_name }}.engine import tables

    pages = {"SC_AVPHYS_PAGES": 1, "SC_PAGE_SIZE": 4096}  # 4 KiB free
    monkeypatch.setattr(tables.os, "sysconf", lambda name: pages[name])
    monkeypatch.setattr(tables.os, "sysconf_names", pages, raising=False)
    with pytest.raises(ValueError, match=r"table.parquet: the table takes 0.0 GiB in memory, more than half of the"):
        tables.read_columnar(path, "data.path")
    monkeypatch.setattr(tables.os, "sysconf_names", {"SC_PAGE_SIZE": 0})  # macOS: no free-page count, no check
    assert len(tables.read_columnar(path, "data.path")) == 600


def test_csv_reading_options_given_for_a_parquet_file_fail_before_anything_is_read(tmp_path: Path) -> None:
    typed_frame(tmp_path).to_parquet(path := tmp_path / "table.parquet")
    with user_error(r"data.separator: a CSV reading option, and data.path=.*table.parquet is a Parquet file"):
        main(["fit", *shrunk_args(tmp_path), f"--data.init_args.path={path}", "--data.init_args.separator=;"])


@pytest.mark.slow
def test_a_parquet_table_trains_to_85_percent_and_predicts_a_parquet_file_of_new_rows(tmp_path: Path) -> None:
    frame = typed_frame(tmp_path)
    frame.to_parquet(path := tmp_path / "table.parquet")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.path={path}"]
    args += ["--data.init_args.target=label", "--data.init_args.id_column=customer", "--trainer.max_epochs=25"]
    cli = main(["fit", *args])
    summary = json.loads((Path(cli.trainer.checkpoint_callback.dirpath).parent / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.85
    new = frame.drop(columns=["label"]).head(5)
    new.to_parquet(tmp_path / "new.parquet")
    best = summary["checkpoint"]
    predicted = pd.read_csv(predict(ckpt=best, inputs=str(tmp_path / "new.parquet"), output=tmp_path / "p.csv"))
    assert predicted["id"].tolist() == new["customer"].tolist()
    new.to_csv(tmp_path / "new.csv", index=False)  # the same rows as a CSV: the same predictions
    same = pd.read_csv(predict(ckpt=best, inputs=str(tmp_path / "new.csv"), output=tmp_path / "q.csv"))
    pd.testing.assert_frame_equal(predicted, same)


@pytest.mark.slow
def test_a_parquet_table_stopped_by_sigterm_resumes_exactly(tmp_path: Path) -> None:
    # Under DDP the engine splits and resumes every map-style data set alike (this file's DDP run, on prepared or
    # in-memory data);
    # what is the data set's own, the same examples in the same order after a restart, is held here in one process.
    typed_frame(tmp_path).to_parquet(path := tmp_path / "table.parquet")
    args = [f"--config={EXPERIMENT}", f"--data.init_args.path={path}", "--data.init_args.target=label"]
    args += ["--trainer.max_epochs=2", "--test_after_fit=false", "--trainer.deterministic=true"]
    args += ["--trainer.log_every_n_steps=2", "--data.init_args.id_column=customer"]
    assert_run_resumes_exactly(tmp_path, lambda root: [*shrunk_args(root), *args], step=6)
