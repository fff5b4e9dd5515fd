"""A short real training run: accuracy, the run folder and the checkpoint."""

import csv
import importlib.metadata
import json
import platform
from pathlib import Path

import matplotlib.image
import pytest
import torch
from conftest import shrunk_args

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.callbacks import RunPlots
from {{ cookiecutter.package_name }}.models import ImageClassifier


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """Fit the default model for 8 epochs on the full data, then test the best checkpoint.

    Logged every 4 steps, not a divisor of the 10 steps per epoch: see the logging test.
    """
    args = shrunk_args(tmp_path_factory.mktemp("train"))
    cli = main(["fit", *args, "--trainer.max_epochs=8", "--trainer.log_every_n_steps=4"])
    return cli, Path(cli.trainer.checkpoint_callback.dirpath).parent


@pytest.mark.slow
def test_short_training_reaches_90_percent_test_accuracy(trained) -> None:
    _, run = trained
    summary = json.loads((run / "test_metrics.json").read_text())
    assert summary["metrics"]["test/acc"] >= 0.90
    assert summary["world_size"] == 1


@pytest.mark.slow
def test_run_folder_holds_config_checkpoints_and_metrics(trained) -> None:
    cli, run = trained
    assert run == Path(cli.trainer.logger.log_dir)
    checkpoints = {p.name for p in (run / "checkpoints").iterdir()}
    assert "last.ckpt" in checkpoints
    assert len(checkpoints) == 2  # last + the best by val/loss
    expected = {"config.yaml", "test_metrics.json", "metrics.csv", "hparams.yaml", "curves.png", "confusion_matrix.png"}
    assert expected | {"environment.json"} <= {p.name for p in run.iterdir()}
    # What it trained with: the torch build and every package's version.
    environment = json.loads((run / "environment.json").read_text())
    assert environment["torch"] == torch.__version__ and environment["python"] == platform.python_version()
    assert environment["packages"]["lightning"] == importlib.metadata.version("lightning")
    assert environment["packages"]["torchmetrics"] == importlib.metadata.version("torchmetrics")
    summary = json.loads((run / "test_metrics.json").read_text())
    assert Path(summary["checkpoint"]).name in checkpoints - {"last.ckpt"}


@pytest.mark.slow
def test_train_loss_is_logged_every_log_every_n_steps_across_epochs(trained) -> None:
    # Lightning writes on every log_every_n_steps-th optimizer step of the fit, whatever the
    # epoch length (10 steps here, 4 between writes): train/loss must be logged on those steps.
    cli, run = trained
    every = cli.trainer.log_every_n_steps
    with (run / "metrics.csv").open() as file:
        steps = [int(row["step"]) for row in csv.DictReader(file) if row["train/loss"]]
    assert steps == list(range(every - 1, cli.trainer.global_step, every))
    assert len(steps) == 20  # 80 steps


@pytest.mark.slow
def test_curves_confusion_matrix_and_gradient_norm_come_from_the_run(trained) -> None:
    cli, run = trained
    plots = next(c for c in cli.trainer.callbacks if isinstance(c, RunPlots))
    every, steps = cli.trainer.log_every_n_steps, cli.trainer.global_step
    assert [step for step, _ in plots.history["train/loss"]] == list(range(every, steps + 1, every))
    assert [step for step, _ in plots.history["val/acc"]] == list(range(10, steps + 1, 10))  # one per epoch
    for name in ("curves.png", "confusion_matrix.png"):
        height, width, _ = matplotlib.image.imread(run / name).shape  # a PNG that reads back
        assert height >= 300 and width >= 300
    # The matrix drawn is the test split's: its diagonal share is the test accuracy.
    matrix = cli.model.epoch_tensors["test/confusion_matrix"]
    summary = json.loads((run / "test_metrics.json").read_text())
    assert matrix.shape == (10, 10)
    assert matrix.trace() / matrix.sum() == pytest.approx(summary["metrics"]["test/acc"], abs=1e-6)
    # The gradient norm is written on the logging steps only, beside train/loss.
    with (run / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    norms = [(int(row["step"]), float(row["train/grad_norm"])) for row in rows if row["train/grad_norm"]]
    assert [step for step, _ in norms] == [int(row["step"]) for row in rows if row["train/loss"]]
    assert all(0 < norm < 100 for _, norm in norms)


@pytest.mark.slow
def test_checkpoint_loads_with_weights_only_and_restores_the_model(trained) -> None:
    cli, run = trained
    last = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True, map_location="cpu")
    assert not any(key.startswith(("_orig_mod", "module.")) for key in last["state_dict"])
    assert last["global_step"] == cli.trainer.global_step

    # After fit, the model was tested with the best checkpoint's weights, which it still holds.
    # The checkpoint rebuilds its own net from the saved config: no net is passed here.
    best = json.loads((run / "test_metrics.json").read_text())["checkpoint"]
    restored = ImageClassifier.load_from_checkpoint(best, map_location="cpu", weights_only=True).eval()
    model = cli.model.eval()
    images = next(iter(cli.datamodule.test_dataloader()))[0]
    with torch.no_grad():
        assert torch.equal(restored(images), model(images))
    for key, value in model.state_dict().items():
        assert torch.equal(restored.state_dict()[key], value), key
