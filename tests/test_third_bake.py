"""The third bake: a language model, csv, 32-true, every optional capability off, installed as its user
installs it (from its uv.lock, into its own environment), then its make lint, make test, make train and
make generate there (a file of its own: see test_second_bake.py)."""

import json

import pytest
from conftest import MINIMAL, installed_linted_and_tested, make

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
