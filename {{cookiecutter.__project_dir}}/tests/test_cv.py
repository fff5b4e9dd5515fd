"""make cv: K folds that validate every non-test sample once and keep the test split out, a run each under one
parent folder, and an interrupted cross-validation that continues at its fold and ends as a straight one."""

import json
import logging
import os
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
from conftest import shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.commands import cv
from {{ cookiecutter.package_name }}.engine.datamodule import split_indices


def test_the_folds_validate_every_non_test_sample_once_and_keep_the_test_split_out() -> None:
    labels = np.repeat(np.arange(3), [50, 30, 20])
    plain = split_indices(labels, 100, 0.15, 0.2, seed=0)
    folds = [split_indices(labels, 100, 0.15, 0.2, 0, num_folds=4, fold=k) for k in range(4)]
    rest = np.setdiff1d(np.arange(100), plain["test"])
    for split in folds:
        assert np.array_equal(split["test"], plain["test"])  # the same test split as training without folds
        assert np.intersect1d(split["train"], split["val"]).size == 0
        assert np.array_equal(np.sort(np.concatenate([split["train"], split["val"]])), rest)
        # Stratified: each fold holds a quarter of each class, to within one sample.
        expected = np.bincount(labels[rest]) / 4
        assert np.all(np.abs(np.bincount(labels[split["val"]], minlength=3) - expected) <= 1)
    validated = np.concatenate([split["val"] for split in folds])
    assert np.array_equal(np.sort(validated), rest)  # disjoint and covering: each non-test sample once
    assert np.array_equal(split_indices(labels, 100, 0.15, 0.2, 0, 4, 2)["val"], folds[2]["val"])  # seeded
    assert not np.array_equal(split_indices(labels, 100, 0.15, 0.2, 1, 4, 2)["val"], folds[2]["val"])
    regression = [split_indices(None, 100, 0.15, 0.2, 0, 4, k)["val"] for k in range(4)]  # no labels: KFold
    test = split_indices(None, 100, 0.15, 0.2, 0)["test"]
    assert np.array_equal(np.sort(np.concatenate(regression)), np.setdiff1d(np.arange(100), test))


def test_the_datamodule_serves_the_fold_it_is_given(tmp_path: Path) -> None:
    splits = []
    for fold in range(3):
        folds = ["--data.init_args.num_folds=3", f"--data.init_args.fold={fold}"]
        data = cli_main([*shrunk_args(tmp_path), *folds], run=False).datamodule
        data.setup("fit")
        splits.append({name: set(np.asarray(rows).tolist()) for name, rows in data.{{ "split_rows" if cookiecutter.task == "tabular" else "split_indices" }}.items()})
        assert len(data.val_set) == len(splits[-1]["val"])
    assert splits[0]["test"] == splits[1]["test"] == splits[2]["test"]
    assert not splits[0]["val"] & splits[1]["val"] and not splits[1]["val"] & splits[2]["val"]
    assert splits[0]["val"] | splits[1]["val"] | splits[2]["val"] == splits[0]["train"] | splits[0]["val"]
    with user_error("data.fold must be one of 0 to 2"):
        cli_main([*shrunk_args(tmp_path), "--data.init_args.num_folds=3", "--data.init_args.fold=3"], run=False)


class CtrlCAtStep(L.Callback):
    """Sends this process SIGINT (Ctrl-C) after training step ``step``: the PreemptionCheckpoint saves and stops."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


def cv_args(tmp_path: Path) -> list[str]:
    return [*shrunk_args(tmp_path), "--trainer.max_epochs=2", "--trainer.deterministic=true"]


def test_an_interrupted_cv_continues_at_its_fold_and_ends_as_a_straight_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "straight").mkdir()
    monkeypatch.chdir(tmp_path / "straight")
    straight = cv.cross_validate([], cv_args(tmp_path / "straight"), 3, "tiny")
    assert sorted(straight["results"]) == ["0", "1", "2"]
    runs = sorted(Path(result["run"]).name for result in straight["results"].values())
    assert runs == ["tiny-fold0", "tiny-fold1", "tiny-fold2"]  # a run of its own each, under logs/cv/tiny/
    assert all(Path(result["run"]).is_relative_to(Path("logs/cv/tiny")) for result in straight["results"].values())
    for name, summary in straight["summary"].items():
        values = [result["val"][name] for result in straight["results"].values()]
        assert summary["mean"] == pytest.approx(np.mean(values))
        assert summary["std"] == pytest.approx(np.std(values, ddof=1))
    printed = capsys.readouterr().out
    assert "Cross-validation, 3 folds" in printed and "\nmean " in printed and "\nstd " in printed

    (tmp_path / "interrupted").mkdir()
    monkeypatch.chdir(tmp_path / "interrupted")
    args = cv_args(tmp_path / "interrupted")
    real, fitted = cv.run_cli, []

    def interrupted_in_fold_1(given: list[str], run: bool = True):
        if run and "--data.init_args.fold=1" in given and "--resume=true" not in given:
            cli = real(given[1:], run=False)  # fold 1 gets a Ctrl-C in its first epoch
            cli.trainer.callbacks.append(CtrlCAtStep(step=3))
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        return real(given, run)

    monkeypatch.setattr(cv, "run_cli", interrupted_in_fold_1)
    with pytest.raises(SystemExit), caplog.at_level(logging.INFO):
        cv.cross_validate([], args, 3, "tiny")
    assert sorted(json.loads(Path("logs/cv/tiny/cv.json").read_text())["results"]) == ["0"]
    # The command to continue is the cross-validation's, not `make resume` (which continues one fold's run alone).
    assert "Continue this run with `make cv` again with the same arguments (it continues fold 1)" in caplog.text
    assert "make resume" not in caplog.text

    def counting(given: list[str], run: bool = True):
        if run:
            fitted.append([arg for arg in given if arg.startswith(("--data.init_args.fold=", "--resume"))])
        return real(given, run)

    monkeypatch.setattr(cv, "run_cli", counting)
    resumed = cv.cross_validate([], args, 3, "tiny")
    # Fold 0 is kept, fold 1 continues its own run from its checkpoint, fold 2 starts.
    assert fitted == [["--data.init_args.fold=1", "--resume=true"], ["--data.init_args.fold=2"]]
    assert sorted(path.name for path in Path("logs/cv/tiny").glob("*/tiny-fold*")) == runs
    for fold in ("0", "1", "2"):
        assert resumed["results"][fold]["val"] == straight["results"][fold]["val"]  # exact resume: the same scores
    with user_error("give its own arguments to continue it"):  # another cross-validation under the same name
        cv.main(["--folds=4", "--name=tiny", *args])
