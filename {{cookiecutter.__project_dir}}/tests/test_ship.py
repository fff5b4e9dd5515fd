"""Shipping a trained model: predictions to a file, ONNX and torch.export files, an HTTP server.

One short run per module (fixture ``shipped``); every test uses its best checkpoint and exports.
"""

import contextlib
{%- if cookiecutter.task != "language-model" %}
import csv
import fcntl
{%- endif %}
import json
import math
import os
import re
import resource
import selectors
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import documentation, serving, shrunk_args, user_error

pytest.importorskip("onnxruntime", reason="the export extra is not installed: pip install -e '.[export,serve]'")
pytest.importorskip("litserve", reason="the serve extra is not installed: pip install -e '.[export,serve]'")

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.export import default_folder as default_export_folder
from {{ cookiecutter.package_name }}.commands.export import main as export_main
from {{ cookiecutter.package_name }}.commands.predict import main as predict_main
from {{ cookiecutter.package_name }}.commands.predict import predict
from {{ cookiecutter.package_name }}.commands.serve import main as serve_main
{%- if cookiecutter.task != "language-model" %}
from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError
{%- endif %}
from {{ cookiecutter.package_name }}.engine.export import ExportError, export_all, export_onnx
from {{ cookiecutter.package_name }}.engine.inference import Trained, load_trained
from {{ cookiecutter.package_name }}.serving.api import check_inputs, cpu_threads, cut

PACKAGE = "{{ cookiecutter.package_name }}"
TOLERANCE = 1e-4
{%- if cookiecutter.task == "language-model" %}
EPOCHS = 1
{%- elif cookiecutter.task == "tabular" %}
EPOCHS = 10
{%- else %}
EPOCHS = 4
{%- endif %}


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Trained, dict[str, Any], Path]:
    """Train briefly, rebuild the run from its best checkpoint alone, export it (ONNX, .pt2, int8 scores)."""
    folder = tmp_path_factory.mktemp("ship")
    cli = main(["fit", *shrunk_args(folder), f"--trainer.max_epochs={EPOCHS}"])
    trained = load_trained(cli.trainer.checkpoint_callback.best_model_path)
    int8 = importable("torchao")  # torchao releases import beside the torch they were built for only
    record = export_all(trained, trained.checkpoint.parent.parent / "export", int8=int8, tolerance=TOLERANCE)
    return trained, record, folder


def importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True
{%- if cookiecutter.task != "language-model" %}


def training_metrics(trained: Trained) -> dict[str, float]:
    return json.loads((trained.checkpoint.parent.parent / "test_metrics.json").read_text())["metrics"]
{%- endif %}


# ---- export --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_export_writes_checked_files_and_a_model_card(shipped) -> None:
    trained, record, _ = shipped
    folder = trained.checkpoint.parent.parent / "export"
    assert {path.name for path in folder.iterdir()} == {"model.onnx", "model.pt2", "export.json", "model-card.md"}
    assert record["files"] == {"onnx": "model.onnx", "pt2": "model.pt2"}
    assert record["input"]["shape"][0] == "batch" and record["output"]["shape"][0] == "batch"
    for kind in ("onnx", "pt2"):
        diffs = record["max_abs_diff"][kind]
        assert "batch_1" in diffs and "batch_37" in diffs  # one sample and an odd batch
        assert all(0 <= value <= TOLERANCE for value in diffs.values()), (kind, diffs)
        assert record["test_scores"][kind] == pytest.approx(record["test_scores"]["eager"], abs=1e-6)
    assert record["max_abs_diff"]["pt2"]["batch_37"] == 0.0  # the same kernels: exact
    assert json.loads((folder / "export.json").read_text()) == record
    card = (folder / "model-card.md").read_text()
    assert str(trained.checkpoint) in card and "max abs diff" in card
    assert record["trained_with"]["model"] == f"{type(trained.model).__module__}.{type(trained.model).__qualname__}"
    assert record["versions"]["torch"] == torch.__version__ and record["versions"]["onnx_opset"] >= 18
{%- if cookiecutter.task != "language-model" %}
    # The graph's preprocessing is the one of training: the export scores what training measured.
    assert record["test_scores"]["onnx"]["acc"] == pytest.approx(training_metrics(trained)["test/acc"], abs=1e-6)
{%- else %}
    # The graph outputs the last position's distribution only: its score is named for what it measures,
    # not as training's test/bpb, which averages every position (language_model.score says so).
    assert set(record["test_scores"]["onnx"]) == {"last_byte_acc", "last_bits_per_byte"}
{%- endif %}


@pytest.mark.slow
def test_the_model_cards_code_runs_each_file(shipped, monkeypatch: pytest.MonkeyPatch) -> None:
    trained, _, _ = shipped
    folder = trained.checkpoint.parent.parent / "export"
    blocks = re.findall(r"```python\n(.*?)```", (folder / "model-card.md").read_text(), flags=re.DOTALL)
    assert len(blocks) == 2  # onnxruntime, torch.export
    raw, _ = trained.datamodule.raw_inputs("test")
    with torch.no_grad():
        expected = trained.predictor(raw[:5])
    monkeypatch.chdir(folder)
    for code in blocks:
        namespace = {"x": raw[:5].numpy()}
        exec(code, namespace)  # the card's own example, run as a reader would
        assert torch.allclose(torch.as_tensor(namespace["outputs"]), expected, atol=TOLERANCE), code


@pytest.mark.slow
def test_int8_weights_keep_the_score(shipped) -> None:
    _, record, _ = shipped
    if "int8" not in record["test_scores"]:
        pytest.skip("torchao does not import here (not installed, or built for another torch)")
    eager, int8 = record["test_scores"]["eager"], record["test_scores"]["int8"]
{%- if cookiecutter.task == "language-model" %}
    assert int8["last_bits_per_byte"] == pytest.approx(eager["last_bits_per_byte"], abs=0.05)
{%- else %}
    assert int8["acc"] >= eager["acc"] - 0.02
{%- endif %}


# Runs in a fresh interpreter that never imports torch or this project: the ONNX file is all it needs.
ONNX_ALONE = """
import json, sys
import numpy as np
import onnxruntime
session = onnxruntime.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
{%- if cookiecutter.task == "tabular" %}
from sklearn.datasets import load_breast_cancer
inputs = load_breast_cancer().data.astype(np.float32)  # (569, 30) raw numbers, as the table holds them
{%- elif cookiecutter.task == "language-model" %}
prompts = [b"Call me Ishmael. Some years", b"The whale, the whale! Ahoy!"]  # equal lengths: one batch
inputs = np.array([list(prompt) for prompt in prompts], dtype=np.int64)  # (2, T) byte ids
{%- else %}
from sklearn.datasets import load_digits
inputs = load_digits().data.reshape(-1, 1, 8, 8).astype(np.float32)  # all 1,797 digits, raw pixels 0-16
{%- endif %}
outputs = session.run(None, {"inputs": inputs})[0]
assert "torch" not in sys.modules and "PACKAGE" not in sys.modules
print(json.dumps(outputs.argmax(axis=1).tolist()))
""".replace("PACKAGE", PACKAGE)


@pytest.mark.slow
def test_onnxruntime_alone_labels_like_the_project(shipped) -> None:
    trained, _, folder = shipped
    done = subprocess.run(
        [sys.executable, "-c", ONNX_ALONE, str(trained.checkpoint.parent.parent / "export" / "model.onnx")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    labels = torch.tensor(json.loads(done.stdout))
{%- if cookiecutter.task == "tabular" %}
    from sklearn.datasets import load_breast_cancer

    raw = torch.as_tensor(load_breast_cancer().data, dtype=torch.float32)
{%- elif cookiecutter.task == "language-model" %}
    raw = torch.tensor([list(b"Call me Ishmael. Some years"), list(b"The whale, the whale! Ahoy!")])
{%- else %}
    raw, targets = trained.datamodule.raw_inputs("all")
{%- endif %}
    with torch.no_grad():
        expected = trained.predictor(raw).argmax(dim=-1)
    assert torch.equal(labels, expected)
{%- if cookiecutter.task == "image-classification" %}
    test_rows = trained.datamodule.split_indices["test"]
    accuracy = (labels[test_rows] == targets[test_rows]).float().mean().item()
    assert accuracy == pytest.approx(training_metrics(trained)["test/acc"], abs=1e-6)
    assert (labels == targets).float().mean() > 0.9  # the whole set, training rows included
{%- endif %}


@pytest.mark.slow
def test_pt2_reloads_with_torch_alone(shipped) -> None:
    trained, _, _ = shipped
    program = torch.export.load(str(trained.checkpoint.parent.parent / "export" / "model.pt2")).module()
    raw, _ = trained.datamodule.raw_inputs("test")
    with torch.no_grad():
        assert torch.equal(program(raw[:5]), trained.predictor(raw[:5]))


@pytest.mark.slow
def test_export_beyond_its_tolerance_is_refused_and_the_previous_export_stays_whole(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    folder = tmp_path / "export"
    shutil.copytree(trained.checkpoint.parent.parent / "export", folder)
    before = {path.name: path.read_bytes() for path in folder.iterdir()}
    # The worst batch may be one cut along a variable axis (a language model's: batch_37_axis1_17).
    differs = r"onnx .*differ from eager PyTorch by .* on batch_\d+(_axis\d+_\d+)? \(tolerance 0\)"
    with pytest.raises(ExportError, match=differs):
        export_all(trained, folder, tolerance=0.0)
    assert {path.name: path.read_bytes() for path in folder.iterdir()} == before
    assert [path.name for path in tmp_path.iterdir()] == ["export"]  # no partial folder left behind

    # The export folder is replaced whole, so one holding anything else is refused before any work.
    with pytest.raises(ExportError, match=r"holds files that are not an export \(export\).*--output"):
        export_all(trained, tmp_path)


def test_export_never_replaces_a_file_and_writes_beside_a_checkpoint_kept_outside_a_run(
    shipped, tmp_path: Path
) -> None:
    trained, _, _ = shipped
    mine = tmp_path / "notes.txt"
    mine.write_text("keep")
    with user_error(r"--output .*notes.txt is a file, not a folder: export into a new or empty folder"):
        export_main(["--ckpt", str(trained.checkpoint), "--output", str(mine)])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"] and mine.read_text() == "keep"
    # A checkpoint in a run folder exports into <run>/export; one kept elsewhere beside itself, never two levels up.
    assert default_export_folder(trained.checkpoint) == trained.checkpoint.parent.parent / "export"
    assert default_export_folder(tmp_path / "models" / "best.ckpt") == tmp_path / "models" / "best-export"


def test_onnx_on_a_torch_too_old_for_it_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.raises(ExportError, match=r"ONNX export needs torch >= 2.9, this is torch 2.6.0.*--onnx false"):
        export_onnx(torch.nn.Identity(), torch.zeros(3, 1), {}, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


def test_export_without_a_checkpoint_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with user_error(r"no checkpoint under logs/: train first"):
        export_main([])


# ---- predict -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_predict_writes_one_readable_row_per_test_sample(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    output = tmp_path / "predictions.{{ 'jsonl' if cookiecutter.task == 'language-model' else 'csv' }}"
    path = predict(ckpt=trained.checkpoint, output=output, accelerator="cpu")
    data = trained.datamodule
{%- if cookiecutter.task == "language-model" %}
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [row["id"] for row in rows] == [str(i) for i in range(len(data.test_set))]
    inputs, targets = data.test_set[0]
    with torch.no_grad():
        nats = torch.nn.functional.cross_entropy(trained.model(inputs[None]).squeeze(0), targets)
    assert rows[0]["bits_per_byte"] == pytest.approx(nats.item() / math.log(2), abs=1e-4)
{%- else %}
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["id", "label", "probability", "true_label"]  # the test split's labels are known
    assert [int(row["id"]) for row in rows] == data.test_ids()
    _, targets = data.raw_inputs("test")
    names = trained.class_names
    assert [row["true_label"] for row in rows] == [str(names[target]) for target in targets.tolist()]
    correct = [row["label"] == row["true_label"] for row in rows]
    assert sum(correct) / len(rows) == pytest.approx(training_metrics(trained)["test/acc"], abs=1e-6)
    assert all(0.0 < float(row["probability"]) <= 1.0 for row in rows)
{%- endif %}


@pytest.mark.slow
def test_the_cli_predict_subcommand_writes_the_same_file_into_the_run_folder(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    main(["predict", *shrunk_args(tmp_path), f"--ckpt_path={trained.checkpoint}"])
    written = trained.checkpoint.parent.parent / "predictions.{{ 'jsonl' if cookiecutter.task == 'language-model' else 'csv' }}"
    lines = written.read_text().splitlines()
{%- if cookiecutter.task == "language-model" %}
    assert len(lines) == len(trained.datamodule.test_set)
    assert json.loads(lines[0])["id"] == "0"
{%- else %}
    assert len(lines) == len(trained.datamodule.test_set) + 1  # a header
    assert lines[1].startswith(f"{trained.datamodule.test_ids()[0]},")
{%- endif %}


@pytest.mark.slow
def test_predict_on_your_own_inputs(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
{%- if cookiecutter.task == "tabular" %}
    rows = trained.datamodule.read().iloc[:4].drop(columns=["target"])
    inputs = tmp_path / "rows.csv"
    rows.to_csv(inputs, index=False)
    expected = trained.describe(trained.predictor(trained.datamodule.raw_rows(rows)))
{%- elif cookiecutter.task == "language-model" %}
    inputs = tmp_path / "prompts.txt"
    inputs.write_text("Call me\n\nThe whale\n")
    prompts = [trained.datamodule.encode(text) for text in ("Call me", "The whale")]
    expected = [{"completion": text} for text in trained.model.infer(trained.predictor, prompts)]
{%- else %}
    raw, _ = trained.datamodule.raw_inputs("test")
    inputs = tmp_path / "digits.csv"
    inputs.write_text("\n".join(",".join(f"{value:g}" for value in image.flatten().tolist()) for image in raw[:4]))
    expected = trained.describe(trained.predictor(raw[:4]))
{%- endif %}
    path = predict(ckpt=trained.checkpoint, inputs=str(inputs), output=tmp_path / "out.jsonl", accelerator="cpu")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    # Without --output: a file of these inputs' own in the run folder; the test split's is not replaced.
    checkpoint = tmp_path / "run" / "checkpoints" / "best.ckpt"
    checkpoint.parent.mkdir(parents=True)
    shutil.copy(trained.checkpoint, checkpoint)
    split = predict(ckpt=checkpoint, accelerator="cpu")
    before = split.read_bytes()
    own = predict(ckpt=checkpoint, inputs=str(inputs), accelerator="cpu")
    assert own.parent == split.parent == tmp_path / "run" and own.name.startswith(f"predictions-{inputs.name}-")
    assert split.read_bytes() == before and len(own.read_text().splitlines()) >= len(rows)
    assert [{key: value for key, value in row.items() if key != "id"} for row in rows] == expected
{%- if cookiecutter.task == "language-model" %}
    assert [row["id"] for row in rows] == ["Call me", "The whale"]
{%- else %}
    assert [row["id"] for row in rows] == ["0", "1", "2", "3"]
{%- endif %}


@pytest.mark.slow
def test_an_interrupted_predict_keeps_the_previous_file(
    shipped, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained, _, _ = shipped
    output = tmp_path / "predictions.{{ 'jsonl' if cookiecutter.task == 'language-model' else 'csv' }}"
    output.write_text("the previous predictions\n")

    def interrupted(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("interrupted")

    monkeypatch.setattr(type(trained.model), "describe", interrupted)
    with pytest.raises(RuntimeError, match="interrupted"):
        predict(ckpt=trained.checkpoint, output=output, accelerator="cpu")
    assert output.read_text() == "the previous predictions\n"
    assert output.with_name(f"{output.name}.partial").is_file()  # the rows it had written


@pytest.mark.slow
def test_make_predict_runs_as_one_quiet_process_beside_slurm(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    bin_dir = tmp_path / "bin"  # an srun on PATH, as on a cluster's login node
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    for name in [name for name in env if name.startswith("SLURM_")]:
        del env[name]
    output = tmp_path / "predictions.jsonl"
    command = [sys.executable, "-m", f"{PACKAGE}.commands.predict", "--ckpt", str(trained.checkpoint)]
    command += ["--output", str(output)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "srun" not in done.stdout + done.stderr
    rows = output.read_text().splitlines()
    assert f"{len(rows)} predictions written to {output}" in done.stdout + done.stderr


{%- if cookiecutter.task != "language-model" %}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("content", "message"),
{%- if cookiecutter.task == "tabular" %}
    [
        ("abc", r"row 1, column '(?P<column>.+)': 'abc' is not a number"),
        ("17,99", r"row 1, column .*: '17,99' is not a number"),
        ("1e308", r"row 1, column .*: 1e\+308 is not finite within float32"),
        ("inf", r"row 1, column .*: inf is not finite within float32"),
        ("1e30", r"input 1: the model's output is not finite .*: column '.+' = 1e\+30 is [\d.e+]+ training standard"),
        (None, r"no rows below the header"),
    ],
    ids=["text", "decimal-comma", "huge", "infinite", "far-beyond-the-data", "header-only"],
)
def test_predict_refuses_values_it_would_answer_wrongly(
    shipped, tmp_path: Path, content: str | None, message: str
) -> None:
    trained, _, _ = shipped
    rows = trained.datamodule.read().iloc[:3].drop(columns=["target"]).astype(object)
    if content is None:
        rows = rows.iloc[:0]
    else:
        rows.iloc[1, 0] = content  # the first numeric column
    inputs = tmp_path / "rows.csv"
    rows.to_csv(inputs, index=False)
{%- else %}
    [
        ("nan", r"row 1 holds NaN or infinite pixel values"),
        ("bom", None),
        (";", r"not readable as comma-separated numbers, no header row"),
        ("header", r"not readable as comma-separated numbers, no header row"),
    ],
    ids=["nan", "byte-order-mark", "semicolons", "header-row"],
)
def test_predict_refuses_values_it_would_answer_wrongly(
    shipped, tmp_path: Path, content: str, message: str | None
) -> None:
    trained, _, _ = shipped
    raw, _ = trained.datamodule.raw_inputs("test")
    lines = [",".join(f"{value:g}" for value in image.flatten().tolist()) for image in raw[:3]]
    text = "\n".join(lines)
    if content == "nan":
        text = "\n".join([lines[0], lines[1].replace("0", "nan", 1), lines[2]])
    elif content == ";":
        text = text.replace(",", ";")
    elif content == "header":
        text = ",".join(f"pixel{i}" for i in range(64)) + "\n" + text
    inputs = tmp_path / "digits.csv"
    inputs.write_text(text, encoding="utf-8-sig" if content == "bom" else "utf-8")
    if message is None:  # Excel's byte-order mark is read, not refused
        path = predict(ckpt=trained.checkpoint, inputs=str(inputs), output=tmp_path / "out.jsonl", accelerator="cpu")
        assert len(path.read_text().splitlines()) == 3
        return
{%- endif %}
    output = tmp_path / "out.jsonl"
    output.write_text("the previous predictions\n")
    with user_error(message):
        predict_main(["--ckpt", str(trained.checkpoint), "--inputs", str(inputs), "--output", str(output)])
    assert output.read_text() == "the previous predictions\n"  # exit 2 says it; nothing half-written
{%- endif %}


@pytest.mark.slow
def test_predict_on_a_missing_inputs_file_is_a_user_error(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    with user_error(r"INPUTS=.*missing.*: no such file"):
        predict_main(["--ckpt", str(trained.checkpoint), "--inputs", str(tmp_path / "missing.csv")])


# ---- serve ---------------------------------------------------------------------------------------


def example_inputs(trained: Trained, count: int) -> list[Any]:
    """``count`` raw test examples as a JSON request carries them."""
{%- if cookiecutter.task == "tabular" %}
    frame = trained.datamodule.read().iloc[trained.datamodule.split_rows["test"][:count]]
    return frame.drop(columns=["target"]).to_dict("records")
{%- elif cookiecutter.task == "language-model" %}
    prompts = ["Call me", "The whale", "It was the best of times", "Moby", "Ahab", "The sea", "Queequeg", "Ishmael"]
    return prompts[:count]
{%- else %}
    return trained.datamodule.raw_inputs("test")[0][:count].tolist()
{%- endif %}


def expected_response(trained: Trained, inputs: list[Any]) -> dict[str, Any]:
    """What the server must answer for ``inputs``: the same code run here, in this process."""
    with torch.no_grad():
        outputs = trained.model.infer(trained.predictor, trained.datamodule.inputs_from_json(inputs))
    return json.loads(json.dumps(trained.model.response(outputs, trained.class_names)))


def assert_same_response(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        if key == "probabilities" or key == "predictions":
            assert torch.allclose(torch.tensor(got[key]), torch.tensor(value), atol=1e-5), key
        else:
            assert got[key] == value, key


def post(port: int, body: bytes, content_type: str = "application/json") -> tuple[int, Any]:
    headers = {"Content-Type": content_type}
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, headers=headers)
    try:
        # Generous: 16 concurrent requests of a language model (64 greedy steps per prompt) on a busy
        # 2-core machine took over 60 s (a CI run beside other tests); speed is measured elsewhere.
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def bad_requests(one: list[Any]) -> dict[str, bytes]:
    """Bodies that must get 422, each valid JSON (Python's json writes NaN and Infinity, as many clients do)."""
{%- if cookiecutter.task == "tabular" %}
    column = next(iter(one[0]))  # the first column is numeric in the bundled tables
    return {
        "wrong columns": json.dumps({"inputs": [{"nope": 1.0}]}).encode(),
        "wrong type": json.dumps({"inputs": [{key: [1, 2] for key in one[0]}]}).encode(),
        "text in a numeric column": json.dumps({"inputs": [{**one[0], column: "tall"}]}).encode(),
        "NaN": json.dumps({"inputs": [{**one[0], column: float("nan")}]}).encode(),
        "beyond float32": json.dumps({"inputs": [{**one[0], column: 1e308}]}).encode(),
        # Finite in float32, but the model's output is NaN: refused by the worker, naming the column.
        "far beyond the data": json.dumps({"inputs": [{**one[0], column: 1e30}]}).encode(),
        "a 400-digit integer": json.dumps({"inputs": [{**one[0], column: 10**400}]}).encode(),
    }
{%- elif cookiecutter.task == "language-model" %}
    return {
        "not text": json.dumps({"inputs": [123]}).encode(),
        "too long": json.dumps({"inputs": ["x" * 100_000]}).encode(),
        # 17 prompts x 64 new tokens: over --max_request_tokens (1024), though under --max_inputs (256).
        "too much to generate": json.dumps({"inputs": one * 17}).encode(),
    }
{%- else %}
    return {
        "wrong shape": json.dumps({"inputs": [[1.0, 2.0]]}).encode(),
        "wrong type": json.dumps({"inputs": [[[["a"] * 8] * 8]]}).encode(),
        "out of range": json.dumps({"inputs": [[[[99.0] * 8] * 8]]}).encode(),
        "NaN": json.dumps({"inputs": [[[[float("nan")] * 8] * 8]]}).encode(),
        "Infinity": json.dumps({"inputs": [[[[float("inf")] * 8] * 8]]}).encode(),
        "1e400": b'{"inputs": [[' + b",".join([b"[" + b",".join([b"1e400"] * 8) + b"]"] * 8) + b"]]}",
    }
{%- endif %}


def readme_curl() -> str:
    """The documentation's ``curl`` for ``make serve`` (docs/shipping.md), as written there."""
    lines = documentation().splitlines()
    return next(line for line in lines if line.startswith("curl -s localhost:8000/predict"))


def assert_the_readmes_curl_gets_an_answer(trained: Trained, port: int) -> None:
    """The documentation's ``curl`` for ``make serve``, as written there, against the server on ``port``."""
    command = shlex.split(readme_curl().split("   #")[0].replace("localhost:8000", f"localhost:{port}"))
    body = command.index("-d") + 1
    if "..." in command[body]:  # the README shortens the example: the same command with a whole one
        command[body] = json.dumps({"inputs": example_inputs(trained, 1)})
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    answer = json.loads(done.stdout)
    assert_same_response(answer, expected_response(trained, json.loads(command[body])["inputs"]))


@pytest.fixture
def server(shipped, tmp_path: Path):
    """The server over the module's trained checkpoint: ``(trained, port, process, log file)``."""
    trained, _, _ = shipped
    with serving(trained.checkpoint, tmp_path) as (port, process, log):
        yield trained, port, process, log


@pytest.mark.slow
def test_server_answers_the_readmes_curl_and_batches_refuses_bad_requests_and_stops_on_sigterm(server) -> None:
    trained, port, process, log = server
    assert_the_readmes_curl_gets_an_answer(trained, port)  # one server start for both (each is 20 s of CI)
    inputs = example_inputs(trained, 3)
    status, answer = post(port, json.dumps({"inputs": inputs}).encode())
    assert status == 200, answer
    assert_same_response(answer, expected_response(trained, inputs))

    # Concurrent requests of different sizes, batched together by the server, each answered alone;
    # a bad request among them (every fourth) gets its 422 and fails none of the good ones.
    one = example_inputs(trained, 1)
    poison = list(bad_requests(one).values())
    bodies = [
        poison[i % len(poison)] if i % 4 == 3 else json.dumps({"inputs": example_inputs(trained, 1 + i % 3)}).encode()
        for i in range(96)
    ]
    with ThreadPoolExecutor(max_workers=16) as pool:
        answers = list(pool.map(lambda body: post(port, body), bodies))
    for i, (body, (status, answer)) in enumerate(zip(bodies, answers, strict=True)):
        if i % 4 == 3:
            assert status == 422, (body[:200], status, answer)
        else:
            assert status == 200, answer
            assert_same_response(answer, expected_response(trained, json.loads(body)["inputs"]))

    bad = {
        "not JSON": b"{inputs: nope",
        "no inputs": json.dumps({"examples": one}).encode(),
        "empty": json.dumps({"inputs": []}).encode(),
        "too many": json.dumps({"inputs": one * 257}).encode(),
        **bad_requests(one),
    }
    for name, body in bad.items():
        status, answer = post(port, body)
        assert status == 422, (name, status, answer)
        detail = json.loads(answer)["detail"]
        assert ("inputs" in detail or "JSON" in detail) and len(detail) <= 500, (name, detail)  # no echo
    status, answer = post(port, b'{"inputs": [' + b"1," * (1 << 20) + b"1]}")
    assert status == 413 and "over 1048576 bytes, the server's --max_body_bytes" in answer  # 1 MiB
    # A malformed upload is a 400 in one line (Starlette's parser raised a 500 and 50 log lines).
    fields = b"".join(b'--b\r\nContent-Disposition: form-data; name="f%d"\r\n\r\nv\r\n' % i for i in range(1200))
    files = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\nx\r\n' * 257
    uploads = {
        "no boundary": (b"--x\r\n", "multipart/form-data", "Missing boundary"),
        "1,200 fields": (fields + b"--b--\r\n", "multipart/form-data; boundary=b", "Too many fields"),
        "257 files": (files + b"--b--\r\n", "multipart/form-data; boundary=b", "Too many files"),
        "not multipart": (b"garbage", "multipart/form-data; boundary=b", "Invalid multipart data"),
    }
    for name, (body, content_type, reason) in uploads.items():
        status, answer = post(port, body, content_type)
        assert status == 400 and "not a readable multipart/form-data upload" in answer, (name, answer)
        assert reason in answer, (name, answer)
    status, answer = post(port, json.dumps({"inputs": one}).encode())
    assert status == 200 and "Traceback" not in log.read_text()  # no worker died
    # A refused request is one line in the log (uvicorn's access line), never a traceback.
    lines = log.read_text().splitlines()
    refused = sum(1 for i in range(len(bodies)) if i % 4 == 3) + len(bad)
    assert sum('"POST /predict HTTP/1.1" 422' in line for line in lines) == refused
    assert sum('"POST /predict HTTP/1.1" 400' in line for line in lines) == len(uploads)
    assert all(line.startswith(("INFO:", "Serving ")) or " - litserve." in line for line in lines), lines

    assert f"http://127.0.0.1:{port}" in log.read_text()  # loopback unless HOST= says otherwise
    # The start-up line says what a request holds.
{%- if cookiecutter.task == "tabular" %}
    assert re.search(r'POST /predict \{"inputs": \[\.\.\.\]\}, 1 to 256 inputs, each an object', log.read_text())
{%- elif cookiecutter.task == "language-model" %}
    assert re.search(r'POST /predict \{"inputs": \[\.\.\.\]\}, 1 to 16 inputs, each a string', log.read_text())
{%- else %}
    shape = list(trained.datamodule.request_schema()["shape"])
    assert f"1 to 256 inputs, each a nested list of shape {shape} of numbers in [0.0, " in log.read_text()
{%- endif %}
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)
    with pytest.raises(ProcessLookupError):  # every process of the group is gone
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            os.killpg(process.pid, 0)
            time.sleep(0.5)
    with socket.socket() as again:
        # Nothing listens there any more (SO_REUSEADDR: the closed connections' TIME_WAIT does not count).
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def slow_client(port: int, body_start: bytes) -> socket.socket:
    """A connection that sends its headers and the start of a 1,000-byte body, then nothing more."""
    connection = socket.create_connection(("127.0.0.1", port))
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    connection.sendall(head + body_start)
    return connection


@pytest.mark.slow
def test_slow_bodies_are_dropped_and_good_requests_answered_meanwhile(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    good = json.dumps({"inputs": example_inputs(trained, 1)}).encode()
    # The body deadline alone: 200 slow clients on this one address (no bound on connections per client).
    with serving(trained.checkpoint, tmp_path, "--body_timeout", "2", "--max_client_connections", "0") as (
        port,
        process,
        log,
    ):
        start = time.monotonic()
        slow = [slow_client(port, b'{"inputs": [') for _ in range(200)]
        for _ in range(5):  # answered while 200 bodies are held open
            assert post(port, good)[0] == 200
        for connection in slow:  # each dropped with a 408 at its deadline, and its connection closed
            connection.settimeout(30)
            answer = b""
            while chunk := connection.recv(4096):
                answer += chunk
            connection.close()
            assert answer.startswith(b"HTTP/1.1 408 ") and b"within 2 s (the server's --body_timeout)" in answer
        assert time.monotonic() - start < 20
        assert post(port, good)[0] == 200 and process.poll() is None
        assert "Traceback" not in log.read_text()


def answers_while_trickling(connections: list[socket.socket], line: bytes, seconds: float) -> list[tuple[bytes, float]]:
    """Each connection's answer and the time it came, sending ``line`` every half second on each one
    still unanswered (a client trickling its headers), for at most ``seconds``; a reset reads as b""."""
    answers: dict[socket.socket, tuple[bytes, float]] = {}
    start = time.monotonic()
    with selectors.DefaultSelector() as readable:  # epoll: no limit on descriptor numbers, unlike select()
        for connection in connections:
            readable.register(connection, selectors.EVENT_READ)
        while len(answers) < len(connections) and time.monotonic() - start < seconds:
            for key, _ in readable.select(0.5):
                connection, answer = key.fileobj, b""
                readable.unregister(connection)
                with contextlib.suppress(ConnectionResetError):
                    connection.settimeout(5)
                    while chunk := connection.recv(4096):
                        answer += chunk
                answers[connection] = answer, time.monotonic() - start
                connection.close()
            for connection in connections:
                if connection not in answers:
                    with contextlib.suppress(OSError):
                        connection.sendall(line)
    return [answers.get(connection, (b"(no answer)", math.inf)) for connection in connections]


@pytest.mark.slow
def test_one_client_trickling_headers_on_more_connections_than_the_server_has_starves_no_other(
    shipped, tmp_path: Path
) -> None:
    """The Slowloris attack, from 127.0.0.2: each of more connections than the server's ``ulimit -n``
    trickles a header line every half second. Before the bounds, every descriptor was held and
    ``/health`` failed for the whole attack."""
    trained, _, _ = shipped
    good = json.dumps({"inputs": example_inputs(trained, 1)}).encode()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2000:
        pytest.skip(f"this test opens 700 connections: the hard limit of open files here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2000), hard))
    try:
        socket.create_server(("127.0.0.2", 0)).close()
    except OSError as error:  # macOS routes only 127.0.0.1 unless told to (ifconfig lo0 alias 127.0.0.2)
        pytest.skip(f"another client address is needed, and 127.0.0.2 is not one here: {error}")
    args = ("--header_timeout", "3", "--max_client_connections", "32")
    with serving(trained.checkpoint, tmp_path, *args, nofile=512) as (port, process, log):
        flood = [socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.2", 0)) for _ in range(700)]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:  # another client
            assert answer.status == 200
        assert post(port, good)[0] == 200
        for connection in flood:
            with contextlib.suppress(OSError):  # reset: refused already
                connection.sendall(b"POST /predict HTTP/1.1\r\n")
        answers = answers_while_trickling(flood, b"X-Slow: 1\r\n", seconds=30)
        late = [seconds for answer, seconds in answers if answer.startswith(b"HTTP/1.1 408 ")]
        refused = [answer for answer, _ in answers if answer.startswith(b"HTTP/1.1 503 ") or answer == b""]
        assert len(late) == 32, "the client's connections up to --max_client_connections wait for their headers"
        assert max(late) < 3 + 2, "a header line every half second does not extend the header deadline"
        assert len(refused) == 700 - 32, "one connection over the bound is refused at once"
        assert all(b"the server's --max_client_connections" in answer for answer in refused if answer)
        message = b"the request headers did not arrive within 3 s (the server's --header_timeout)"
        assert all(message in answer for answer, _ in answers if answer.startswith(b"HTTP/1.1 408 "))
        assert post(port, good)[0] == 200 and process.poll() is None
        assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    "option, value, reason",
    [
        ("--header_timeout", "0", "--header_timeout must be a positive number of seconds, got 0"),
        ("--max_client_connections", "-1", r"--max_client_connections must be 0 \(no bound\) or more, got -1"),
    ],
)
def test_connection_bounds_that_cannot_hold_are_refused_before_loading_anything(
    option: str, value: str, reason: str, tmp_path: Path
) -> None:
    with user_error(reason):
        serve_main(["--ckpt", str(tmp_path / "never-read.ckpt"), option, value])


@pytest.mark.slow
def test_ctrl_c_stops_the_server_without_a_traceback(server) -> None:
    # On the default (batched) server: with the worker's SIGINT fix removed, an unbatched server's Ctrl-C
    # printed no traceback and passed (checked 2026-12-03); this one fails.
    _, port, process, log = server
    os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the terminal's group
    assert process.wait(timeout=60) == 0
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))  # the port is free again


SERVE_BENCH = Path(__file__).parents[1] / "scripts" / "serve_load.py"


@pytest.mark.slow
def test_serve_bench_measures_the_server_against_the_in_process_baseline(shipped) -> None:
    trained, _, _ = shipped
    command = [sys.executable, str(SERVE_BENCH), "--ckpt", str(trained.checkpoint), "--requests", "8"]
    command += ["--concurrency", "1", "2", "--rounds", "2", "--bad-every", "4"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    baseline, server, *levels = done.stdout.splitlines()
    assert re.fullmatch(r"baseline: in-process Predictor, 1 example: p50 [\d.]+ ms \(torch threads \d+\)", baseline)
    assert re.fullmatch(r"server: \d+ processes, largest RSS \d+ MB after warm-up", server), server
    assert len(levels) == 4
    for (round_, level), line in zip([(1, 1), (1, 2), (2, 1), (2, 2)], levels, strict=True):
        pattern = (
            rf"round {round_} concurrency +{level}: 8 requests, good 6/6 answered, bad 2/2 refused, "
            r"p50 [\d.]+ ms, p99 [\d.]+ ms, \d+ requests/s, p50 / baseline [\d.]+x, largest RSS \d+ MB"
        )
        assert re.fullmatch(pattern, line), line


def test_serve_bench_without_a_checkpoint_is_a_user_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SERVE_BENCH)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("serve-bench: no checkpoint under logs/: train first")


def test_serve_on_a_port_in_use_says_so_before_loading_anything(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with user_error(rf"cannot listen on 127.0.0.1:{port} \(Address already in use\).*another PORT="):
            serve_main(["--ckpt", str(tmp_path / "never-read.ckpt"), "--port", str(port)])


def test_a_timeout_no_longer_than_the_batch_wait_is_refused_before_loading_anything(tmp_path: Path) -> None:
    with user_error(r"--timeout \(0.005 s\) must be longer than --batch_timeout \(0.005 s\)"):
        serve_main(["--ckpt", str(tmp_path / "never-read.ckpt"), "--timeout", "0.005"])


def test_request_checks_name_the_input_and_the_problem() -> None:
    schema = {"kind": "array", "shape": [2, 2], "min": 0.0, "max": 1.0, "max_inputs": 2}
    check_inputs([[[0, 1], [1, 0.5]]], schema)
    cases = {
        "inputs is empty": [],
        "3 inputs in one request; send at most 2": [[[0, 0], [0, 0]]] * 3,
        r"inputs\[0\] must be a list of 2": [[[0, 0]]],
        r"inputs\[0\]\[1\]\[0\] must be a number, got str": [[[0, 0], ["x", 0]]],
        r"inputs\[0\]\[0\]\[0\] must be a finite number within float32": [[[math.inf, 0], [0, 0]]],
        r"inputs\[0\]\[0\]\[1\] = 2 is outside": [[[0, 2], [0, 0]]],
    }
    for message, inputs in cases.items():
        with pytest.raises(ValueError, match=message):
            check_inputs(inputs, schema)
    rows = {"kind": "row", "columns": ["a", "b"], "numeric": ["a"], "max_inputs": 4}
    check_inputs([{"a": 1, "b": None}, {"a": None, "b": "x"}, {"a": -3.5e38 / 1.1, "b": 2}], rows)
    check_inputs([{"a": 1, "b": None, "batch_id": "x"}], rows)  # other keys are left out, as a file's other columns
    with pytest.raises(ValueError, match=r"missing 1 of the 2 columns: b \(null is a missing value, and is accepted\)"):
        check_inputs([{"a": 1, "c": 2}], rows)
    wide = {"kind": "row", "columns": [f"indicator_{i}_of_the_world_bank" for i in range(60)], "max_inputs": 1}
    with pytest.raises(ValueError) as refused:
        check_inputs([{}], wide)
    assert "missing 60 of the 60 columns: indicator_0_of_the_world_bank," in str(refused.value)
    assert str(refused.value).endswith(", ... (null is a missing value, and is accepted)")
    assert cut(f"{'word ' * 200}end") == ("word " * 99).strip() + " ..."  # a long detail ends at a word
    numeric = {
        r"inputs\[0\]\['a'\] \(a numeric column; null for a missing value\) must be a number, got str": "tall",
        r"must be a number, got bool True": True,
        r"must be a finite number within float32 \(\|x\| <= 3\.4e38\), got 1e\+308": 1e308,
        r"must be a finite number within float32 .*, got nan": math.nan,
        r"must be a finite number within float32 .*, got 1000+\.\.\.": 10**400,
    }
    for message, value in numeric.items():
        with pytest.raises(ValueError, match=message):
            check_inputs([{"a": value, "b": "x"}], rows)
    text = {"kind": "text", "max_bytes": 4, "max_inputs": 4}
    with pytest.raises(ValueError, match=r"inputs\[0\] has 5 UTF-8 bytes; at most 4"):
        check_inputs(["héll"], text)
{%- if cookiecutter.task == "language-model" %}
    generated = {**text, "max_inputs": 256, "new_tokens": 64, "max_request_tokens": 1024}
    check_inputs(["ab"] * 16, generated)
    budget = r"17 prompts x 64 new tokens each = 1088 tokens to generate; the server generates at most 1024 per request"
    with pytest.raises(ValueError, match=budget + r" \(--max_request_tokens\): send at most 16 prompts per request"):
        check_inputs(["ab"] * 17, generated)
{%- endif %}


@pytest.mark.slow
def test_a_server_without_batching_answers(shipped, tmp_path: Path) -> None:
    # --max_batch_size 1: LitServe then never calls batch()/unbatch(); each request runs alone.
    trained, _, _ = shipped
    with serving(trained.checkpoint, tmp_path, "--max_batch_size", "1") as (port, _, log):
        bodies = [example_inputs(trained, 1 + i % 3) for i in range(6)]
        with ThreadPoolExecutor(max_workers=3) as pool:
            answers = list(pool.map(lambda body: post(port, json.dumps({"inputs": body}).encode()), bodies))
        for body, (status, answer) in zip(bodies, answers, strict=True):
            assert status == 200, (answer, log.read_text()[-2000:])
            assert_same_response(answer, expected_response(trained, body))


# Loaded by every Python process of a server started with its folder on PYTHONPATH (LitServe's
# workers are spawned, so a patch made in the test would not reach them): the raw example
# PLANTED_FAULTS["decode"] fails decoding, and the model fails on any batch holding PLANTED_FAULTS["model"].
PLANTED_FAULTS = """
import json
import os

import torch

from {{ cookiecutter.package_name }}.serving import api as serving

faults = json.loads(os.environ["PLANTED_FAULTS"])
setup = serving.PredictorAPI.setup


def planted_setup(self, device):
    setup(self, device)
    data, model = self.trained.datamodule, self.trained.model
    decode, infer = data.inputs_from_json, model.infer
    poison = decode([faults["model"]])[0]

    def planted_decode(inputs):
        if faults["decode"] in inputs:
            raise ValueError("planted decoding fault")
        return decode(inputs)

    def planted_infer(predictor, inputs):
        if any(torch.equal(example.cpu(), poison) for example in inputs):
            raise RuntimeError("planted model fault")
        return infer(predictor, inputs)

    data.inputs_from_json, model.infer = planted_decode, planted_infer


serving.PredictorAPI.setup = planted_setup
"""


@pytest.mark.slow
def test_a_request_that_fails_in_the_worker_fails_alone(shipped, tmp_path: Path) -> None:
    trained, _, _ = shipped
    examples = example_inputs(trained, 8)
    faults = {"decode": examples[6], "model": examples[7]}
    (tmp_path / "sitecustomize.py").write_text(PLANTED_FAULTS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PLANTED_FAULTS": json.dumps(faults)}
    bodies = []
    # Concurrent, so that good requests share batches with the failing ones (fewer for a language
    # model: each request is 64 greedy steps).
    for i in range({{ 24 if cookiecutter.task == "language-model" else 64 }}):
        if i % 8 == 3:
            bodies.append([examples[0], faults["decode"]])
        elif i % 8 == 7:
            bodies.append([faults["model"], examples[1]])
        else:
            bodies.append(examples[: 1 + i % 3])
    with serving(trained.checkpoint, tmp_path, env=env) as (port, _, log):
        with ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda inputs: post(port, json.dumps({"inputs": inputs}).encode()), bodies))
        text = log.read_text()
    for i, (inputs, (status, answer)) in enumerate(zip(bodies, answers, strict=True)):
        if i % 8 == 3:
            assert (status, json.loads(answer)) == (422, {"detail": "inputs: planted decoding fault"})
        elif i % 8 == 7:
            assert status == 500 and "the model failed on this request's inputs" in answer, (status, answer)
        else:
            assert status == 200, (i, status, answer, text[-3000:])
            assert_same_response(answer, expected_response(trained, inputs))
    # One line per failed request, and one traceback: the worker's first failure.
    failed = len(bodies) // 8
    assert text.count("request failed with 422: ValueError: planted decoding fault") == failed, text[-3000:]
    assert text.count("request failed with 500: RuntimeError: planted model fault") == failed, text[-3000:]
    assert text.count("Traceback") == 1, text[-3000:]
{%- if cookiecutter.task != "language-model" %}


# ---- a user's own pieces ship like the bundled ones (README: "Add your own data, model or task") -----
OWN_PIECES = Path(__file__).with_name("own_pieces.py")
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE
OWN_CASES = {
    # The README's DataModule in the package's data/: the project's own trust covers it.
    "own-data-in-package": ([f"--data={PACKAGE}.data.mine.OwnDataModule"], None),
    # Kept outside the package (here: tests/own_pieces.py): loading needs --trust.
    "own-data-outside-trusted": (["--data=own_pieces.OwnDataModule"], "own_pieces"),
{%- if cookiecutter.task == "image-classification" %}
    # An own net in nets/ and an own task module in models/, on engine.TrainingModule.
    "own-net-and-task-in-package": (
        [
            f"--data={PACKAGE}.data.mine.OwnDataModule",
            f"--model={PACKAGE}.models.mine.OwnClassifier",
            f"--model.init_args.net={PACKAGE}.nets.mine.OwnNet",
        ],
        None,
    ),
    "own-net-and-task-outside-trusted": (
        [
            "--data=own_pieces.OwnDataModule",
            "--model=own_pieces.OwnClassifier",
            "--model.init_args.net=own_pieces.OwnNet",
        ],
        "own_pieces",
    ),
{%- endif %}
}


@pytest.fixture
def own_pieces_in_package(tmp_path_factory: pytest.TempPathFactory):
    """tests/own_pieces.py copied into the package as data/mine.py, nets/mine.py and models/mine.py.

    The package folder is one for every pytest-xdist worker: a lock in the session's shared temporary
    folder lets one such test at a time hold the copies (another worker's teardown removed them mid-test).
    """
    copies = [SOURCE / part / "mine.py" for part in ("data", "nets", "models")]
    with (tmp_path_factory.getbasetemp().parent / "own-pieces.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for copy in copies:
            shutil.copy(OWN_PIECES, copy)
        try:
            yield
        finally:
            for copy in copies:
                copy.unlink()
            for name in [name for name in sys.modules if name.endswith(".mine") and name.startswith(PACKAGE)]:
                del sys.modules[name]


@pytest.mark.slow
@pytest.mark.parametrize("case", OWN_CASES)
def test_own_pieces_train_then_predict_export_and_serve(case: str, own_pieces_in_package, tmp_path: Path) -> None:
    args, trust = OWN_CASES[case]
    own = ["--data.init_args.batch_size=32", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=5"]
    cli = main(["fit", *shrunk_args(tmp_path), *args, *own])
    best = Path(cli.trainer.checkpoint_callback.best_model_path)
    trust_args = ["--trust", trust] if trust else []
    if trust:
        with pytest.raises(CheckpointError, match=rf"names {trust}\.\w+, outside .* --trust {trust}"):
            load_trained(best)
    trained = load_trained(best, trust=[trust] if trust else [])
    trained.datamodule.setup("predict")
    raw, _ = trained.datamodule.raw_inputs("test")

    written = predict(ckpt=best, output=tmp_path / "predictions.csv", accelerator="cpu", trust=trust)
    with written.open() as file:
        rows = list(csv.DictReader(file))
    with torch.no_grad():
        expected = trained.describe(trained.predictor(raw))
    assert len(rows) == len(raw)
    assert [row["label"] for row in rows] == [record["label"] for record in expected]

    export_main(["--ckpt", str(best), "--output", str(tmp_path / "export"), *trust_args])
    record = json.loads((tmp_path / "export" / "export.json").read_text())
    for kind in ("onnx", "pt2"):
        assert all(0 <= value <= TOLERANCE for value in record["max_abs_diff"][kind].values()), (kind, record)

    env = {**os.environ, "PYTHONPATH": str(OWN_PIECES.parent)}  # own_pieces, for the server's worker
    with serving(best, tmp_path, *trust_args, env=env) as (port, _, log):
        inputs = raw[:3].tolist()
        status, answer = post(port, json.dumps({"inputs": inputs}).encode())
        assert status == 200, (answer, log.read_text()[-2000:])
        assert_same_response(answer, expected_response(trained, inputs))
{%- endif %}


def test_a_cpu_worker_leaves_a_core_to_each_http_process_and_shares_the_rest(monkeypatch) -> None:
    """OpenMP threads on every core lose the ones the HTTP process takes, at every op: the worker's threads
    are the cores left (on 2 cores 16 streams went 1.4x faster with 1 thread than with 2: the template's
    docs/benchmarks.md)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    assert [cpu_threads(workers) for workers in (1, 2, 3, 7, 16)] == [7, 3, 2, 1, 1]
    assert cpu_threads(2, http_processes=4) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert cpu_threads(1) == 1  # one core: the worker keeps a thread
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_threads(1) is None  # the user's setting, which torch reads itself
