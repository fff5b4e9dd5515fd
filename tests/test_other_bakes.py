"""Bakes with other answers than the default's (another task, logger, precision, compile, SLURM), each task's
minimal bake (every optional capability off) among them, each installed as its user installs it, from its
uv.lock into its own environment, then make lint, make test, make train and a task's own command there."""

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
from conftest import MINIMAL, bake, install_own_environment, make

# The pytest -k expression of .ci/default_only: the slow tests that run in the default bake alone.
DEFAULT_ONLY = subprocess.run(
    ["bash", "-c", 'source .ci/default_only && printf %s "$DEFAULT_ONLY"'],
    cwd=Path(__file__).parents[1],
    capture_output=True,
    text=True,
    check=True,
).stdout

SECOND = {
    "task": "tabular",
    "project_name": "Second Bake",
    "logger": "tensorboard",
    "precision": "16-mixed",
    "compile": "yes",
    "license": "Apache-2.0",
    **MINIMAL,
}


def installed_linted_and_tested(cookies, monkeypatch, answers: dict, absent: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """Bake ``answers`` (locked), install it as its user does, exactly its uv.lock into its own environment,
    where none of ``absent`` imports, then run its own ``make lint`` and ``make test`` (the quick tests, as
    for the default bake; slow ones: .ci/slow and .ci/floors); return the project and its Python."""
    monkeypatch.setenv("TORCH_TEMPLATE_LOCK", "1")
    project = bake(cookies, **answers)
    python = install_own_environment(project)
    for name in absent:
        assert subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode != 0, name
    make(project, "lint", python=python)
    # A make target glued to the previous recipe once ran nothing here and exited 0: tests must have run.
    assert re.search(r"\b\d+ passed\b", make(project, "test", python=python))
    return project, python


@pytest.mark.slow
def test_second_bake_tabular_passes_its_own_tests_and_trains_in_its_own_environment(cookies, monkeypatch) -> None:
    # Other answers than the default's (another logger, precision, compile, no SLURM) change what the
    # bake installs: it installs as its user does, exactly its uv.lock, and is tested there alone.
    project, python = installed_linted_and_tested(cookies, monkeypatch, SECOND)
    # Its slow tests too (.ci/slow runs the default bakes' only): a capability left out must leave no slow
    # test that needs it (two did: a README test expecting make export, the planted-module test's export).
    # Those of the core's task-independent machinery run in the default image bake alone, as in .ci/slow.
    only_default = f"not ({DEFAULT_ONLY})"
    assert re.search(
        r"\b\d+ passed\b", make(project, "test-slow", args=f"-k {shlex.quote(only_default)}", python=python)
    )
    # The bundled breast cancer table, the default 40 epochs (about 15 s on 2 cores).
    make(project, "train", python=python)
    (summary_path,) = (project / "logs").rglob("test_metrics.json")
    assert json.loads(summary_path.read_text())["metrics"]["test/acc"] >= 0.9  # measured 0.953
    assert list((project / "logs").rglob("events.out.tfevents.*"))  # the answer's logger wrote the run
    # The profiler's report lands in the run folder, beside that run's config, and make says where.
    output = make(project, "profile", args="--trainer.max_epochs=1", stderr=True, python=python)
    (report,) = (project / "logs").rglob("fit-profile.txt")
    assert report.parent.parent.name == "tabular"  # logs/tabular/<config>-<date>-<time>-<xxxx>/fit-profile.txt
    assert (report.parent / "config.yaml").exists() and "Profiler Report" in report.read_text()
    assert f"Profiler report written to {report.relative_to(project)}" in output


THIRD = {
    "task": "language-model",
    "project_name": "Third Bake",
    "logger": "csv",
    "precision": "32-true",
    "compile": "no",
    "license": "MIT",
    **MINIMAL,
}


@pytest.mark.slow
def test_third_bake_language_model_passes_its_own_tests_trains_and_generates(cookies, monkeypatch) -> None:
    # As the second bake: in its own environment, which has no wandb and no tensorboard, nor serving.
    project, python = installed_linted_and_tested(cookies, monkeypatch, THIRD, absent=("wandb", "litserve"))
    # `make train` on the bundled corpus with a one-block GPT for 150 steps (29 s): it learns
    # common letter sequences, below the corpus's unigram entropy of 4.53 bits per byte (3.76
    # measured). The default model's full run reaches 2.26 (docs/benchmarks.md).
    tiny = "--model.init_args.net.init_args.n_layer=1 --model.init_args.net.init_args.n_embd=64"
    make(project, "train", args=f"--trainer.max_epochs=1 --trainer.limit_train_batches=150 {tiny}", python=python)
    (summary_path,) = (project / "logs").rglob("test_metrics.json")
    metrics = json.loads(summary_path.read_text())["metrics"]
    assert metrics["test/bpb"] < 4.2
    assert (summary_path.parent / "metrics.csv").is_file()  # the answer's logger wrote the run
    text = make(project, "generate", args="--max_new_tokens 80 --prompt Ishmael", python=python)
    sample = text.split("\nIshmael", 1)  # after the command line make echoes
    assert len(sample) == 2 and len(sample[1]) > 60, text


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
