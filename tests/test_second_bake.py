"""The second bake: tabular, tensorboard, 16-mixed, compile, every optional capability off, installed as its
user installs it (from its uv.lock, into its own environment), then its make lint, make test, its slow tests
collected, make train and make profile there. Each bake with other answers than the default's is a test file of its own:
make test gives each process a file at a time, so the bakes are shared out between them."""

import json
import re

import pytest
from conftest import MINIMAL, installed_linted_and_tested, make

SECOND = {
    "task": "tabular",
    "project_name": "Second Bake",
    "logger": "tensorboard",
    "precision": "16-mixed",
    "compile": "yes",
    "license": "Apache-2.0",
    **MINIMAL,
}


@pytest.mark.slow
def test_second_bake_tabular_passes_its_own_tests_and_trains_in_its_own_environment(cookies, monkeypatch) -> None:
    # Other answers than the default's (another logger, precision, compile, no SLURM) change what the
    # bake installs: it installs as its user does, exactly its uv.lock, and is tested there alone.
    project, python = installed_linted_and_tested(cookies, monkeypatch, SECOND)
    # Its slow tests are collected, not run (.ci/slow runs them in the default tabular bake, every capability on):
    # a capability left out leaves no slow test importing what it pruned; one that names a pruned command or module
    # in its text fails test_bake.py's pruned-name check (a README test once expected make export here).
    collected = make(project, "test-slow", args="--collect-only -q", python=python)
    assert re.search(r"\b\d+(/\d+)? tests? collected\b", collected), collected[-2000:]
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
