"""The fourth bake: image classification, csv, bf16-mixed, every optional capability off, installed as its
user installs it (from its uv.lock, into its own environment), then its make lint, make test and make train
there (a file of its own: see test_second_bake.py)."""

import json

import pytest
from conftest import MINIMAL, installed_linted_and_tested, make

FOURTH = {
    "task": "image-classification",
    "project_name": "Fourth Bake",
    "logger": "csv",
    "precision": "bf16-mixed",
    "compile": "no",
    "license": "BSD-3-Clause",
    **MINIMAL,
}


@pytest.mark.slow
def test_fourth_bake_images_minimal_passes_its_own_tests_and_trains(cookies, monkeypatch) -> None:
    # The image task's minimal bake in its own environment: no transformers, timm, onnx or LitServe there.
    absent = ("transformers", "litserve", "onnxruntime", "optuna")
    project, python = installed_linted_and_tested(cookies, monkeypatch, FOURTH, absent)
    # Two epochs of the CNN on the bundled digits (about 25 s on 2 cores): 0.963 test accuracy measured.
    make(project, "train", args="--trainer.max_epochs=2", python=python)
    (summary_path,) = (project / "logs").rglob("test_metrics.json")
    assert json.loads(summary_path.read_text())["metrics"]["test/acc"] >= 0.9
    assert (summary_path.parent / "metrics.csv").is_file()  # the answer's logger wrote the run
