"""Exact resume: a run stopped mid-epoch or at an epoch boundary and resumed ends identical to an uninterrupted run."""

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CONFIGS, shrunk_args
from test_preemption import SignalAtStep
from torch.utils.data import DataLoader, TensorDataset

from {{ cookiecutter.package_name }}.cli import CLI, main
from {{ cookiecutter.package_name }}.engine.callbacks import RunPlots
from {{ cookiecutter.package_name }}.engine.callbacks.ema import warmup_ema_update
from {{ cookiecutter.package_name }}.engine.callbacks.preemption import Preempted
from {{ cookiecutter.package_name }}.engine.datamodule import ResumableDataModule, TensorBatches
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.engine.run_folders import run_dir
from {{ cookiecutter.package_name }}.engine.run_records import own_config

# Three epochs, deterministic algorithms; the test after fit is not part of the comparison.
EXACT = ["--trainer.max_epochs=3", "--trainer.deterministic=true", "--test_after_fit=false"]


class StopAfterEpoch(L.Callback):
    """Ends fit after the given epoch, as a run whose job ended there would (last.ckpt is saved first)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def plot_history(cli: CLI) -> dict:
    return next(c for c in cli.trainer.callbacks if isinstance(c, RunPlots)).history


def assert_same_end_state(reference: CLI, resumed: CLI) -> None:
    assert resumed.trainer.global_step == reference.trainer.global_step
    expected, actual = reference.model.state_dict(), resumed.model.state_dict()
    assert expected.keys() == actual.keys()
    for key in expected:
        if isinstance(expected[key], torch.Tensor):
            assert torch.equal(expected[key], actual[key]), f"weights differ: {key}"
        else:  # a module's extra state (a pretrained net's record of its base)
            assert expected[key] == actual[key], f"state differs: {key}"
    expected_opt, actual_opt = reference.trainer.optimizers[0].state_dict(), resumed.trainer.optimizers[0].state_dict()
    assert expected_opt["state"].keys() == actual_opt["state"].keys()
    for index, state in expected_opt["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(actual_opt["state"][index][name])), (index, name)
    scheduler = reference.trainer.lr_scheduler_configs[0].scheduler
    assert resumed.trainer.lr_scheduler_configs[0].scheduler.state_dict()["last_epoch"] == scheduler.last_epoch
    # curves.png of the resumed run draws the whole run, the part before the interruption included.
    assert plot_history(resumed) == plot_history(reference)
    metrics = reference.trainer.callback_metrics
    assert metrics.keys() == resumed.trainer.callback_metrics.keys()
    for name, value in metrics.items():
        assert torch.equal(value, resumed.trainer.callback_metrics[name]), f"metric differs: {name}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> CLI:
    return main(["fit", *shrunk_args(tmp_path_factory.mktemp("reference")), *EXACT])


# Lightning warns when a resumed run's checkpoint or CSV folder is not empty; the CLI keeps the
# earlier metrics.csv aside (see test_preemption), and the checkpoints are meant to be there.
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_mid_epoch_interruption_resumes_exactly(reference: CLI, tmp_path: Path) -> None:
    args = [*shrunk_args(tmp_path), *EXACT]
    interrupted = main(args, run=False)
    interrupted.trainer.callbacks.append(
        SignalAtStep(step=15)
    )  # mid-epoch for the bundled data (10 or 7 steps per epoch)
    with pytest.raises(Preempted):
        interrupted.trainer.fit(interrupted.model, datamodule=interrupted.datamodule)
    assert interrupted.trainer.global_step == 16

    # `make resume`: no path given, the arguments on the command line (LightningCLI warned of "both args and
    # command line arguments" when the run's own config replaced them: a warning is an error here).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [sys.argv[0], "fit", *args, "--resume=true"])
        resumed = main()
    assert run_dir(resumed.trainer) == run_dir(interrupted.trainer)
    assert_same_end_state(reference, resumed)


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
# Lightning (callbacks/model_checkpoint.py) when `test --ckpt_path` restores a ModelCheckpoint's state in a run
# folder of its own: the test writes no checkpoint, so what it does not reload is not needed.
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
def test_stop_at_an_epoch_boundary_resumes_exactly(reference: CLI, tmp_path: Path) -> None:
    args = [*shrunk_args(tmp_path), *EXACT]
    stopped = main(args, run=False)
    stopped.trainer.callbacks.append(StopAfterEpoch(epoch=0))
    stopped.trainer.fit(stopped.model, datamodule=stopped.datamodule)
    assert stopped.trainer.global_step == stopped.trainer.num_training_batches
    last = run_dir(stopped.trainer) / "checkpoints" / "last.ckpt"

    with whole_reads_of(last) as reads:
        resumed = main(["fit", *args, f"--ckpt_path={last}"])  # an explicit path works too
    assert run_dir(resumed.trainer) == run_dir(stopped.trainer)
    assert_same_end_state(reference, resumed)
    # Read once, checked, and that copy restored: not read again by Lightning (a language model's gigabytes).
    assert reads == [str(last)]
    with whole_reads_of(last) as reads:
        main(["test", *args, f"--ckpt_path={last}"])
    assert reads == [str(last)]


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_the_ema_preset_ships_the_averaged_weights_and_resumes_both_exactly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    ema = f"--config={CONFIGS / 'presets' / 'ema.yaml'}"
    with caplog.at_level(logging.INFO):
        straight = main(["fit", *shrunk_args(tmp_path / "straight"), *EXACT, ema])
    steps = straight.trainer.global_step
    assert (  # the run says which weights it validates, and that a short run ends warming up
        "EMA: validation, checkpoints and the test use the moving average of the weights (decay 0.999, warming up "
        f"over 8990 steps; this run's {steps} steps end inside it, then about the last 1000 steps)"
    ) in caplog.text
    best = Path(straight.trainer.checkpoint_callback.best_model_path)
    checkpoint = torch.load(best, map_location="cpu", weights_only=True)
    averaged, live = checkpoint["state_dict"], checkpoint["current_model_state"]
    assert averaged.keys() == live.keys()
    assert any(not torch.equal(averaged[key], live[key]) for key in averaged)  # two sets of weights
    # What make predict, export and serve build from the checkpoint: the averaged weights.
    capsys.readouterr()
    shipped = load_trained(best).model.state_dict()
    assert all(torch.equal(shipped[key], averaged[key]) for key in averaged)
    assert f"{best}: the moving average of the weights (the ema preset's)" in capsys.readouterr().err  # and said

    args = [*shrunk_args(tmp_path / "resumed"), *EXACT, ema]
    stopped = main(args, run=False)
    stopped.trainer.callbacks.append(StopAfterEpoch(epoch=0))
    stopped.trainer.fit(stopped.model, datamodule=stopped.datamodule)
    resumed = main(["fit", *args, "--resume=true"])
    assert_same_end_state(straight, resumed)  # the models end holding the averaged weights
    last, expected = (
        torch.load(run_dir(cli.trainer) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        for cli in (resumed, straight)
    )
    for key in ("state_dict", "current_model_state", "averaging_state"):  # the live ones and the average's count
        assert last[key].keys() == expected[key].keys()
        assert all(torch.equal(last[key][name], expected[key][name]) for name in expected[key]), key
    # A test of the best checkpoint in the fit's Trainer, as the test after fit runs it, measures the averaged
    # weights (Lightning's own callback loaded the live ones over them).
    straight.trainer.test(straight.model, datamodule=straight.datamodule, ckpt_path=str(best), verbose=False)
    tested = straight.model.state_dict()
    assert all(torch.equal(tested[key], averaged[key]) for key in averaged)


def test_the_ema_decay_warms_up_with_the_count_of_updates() -> None:
    # TensorFlow's num_updates rule, min(decay, (1 + n) / (10 + n)): update 1 keeps 2/11 of the average (a
    # fixed 0.999 kept 999/1000 of the random start), update 10,000 the full decay; counts are copied.
    for count, kept in ((1, 2 / 11), (90, 91 / 100), (10_000, 0.999)):
        average, count_buffer = torch.zeros(3), torch.tensor(5)
        warmup_ema_update([average, count_buffer], [torch.ones(3), torch.tensor(7)], torch.tensor(count), decay=0.999)
        torch.testing.assert_close(average, torch.full((3,), 1 - kept))
        assert count_buffer.item() == 7


@contextlib.contextmanager
def whole_reads_of(path: Path) -> Iterator[list[str]]:
    """Every ``torch.load`` of ``path`` inside the block (by its path, or by a file object opened on it)."""
    reads: list[str] = []
    load = torch.load

    def counted(source, *args, **kwargs):
        name = source if isinstance(source, (str, Path)) else getattr(source, "name", getattr(source, "path", None))
        if name is not None and Path(name).resolve() == path.resolve():
            reads.append(str(path))
        return load(source, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "load", counted)
        yield reads


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_users_own_datamodule_resumes_exactly_mid_epoch(tmp_path: Path) -> None:
    # Every data setting named: a switched class_path keeps the old class's values that fit the new one.
    own = ["--data=own_pieces.OwnDataModule", "--data.init_args.batch_size=32", "--trainer.log_every_n_steps=5"]
    reference = main(["fit", *shrunk_args(tmp_path / "reference"), *EXACT, *own])
    args = [*shrunk_args(tmp_path / "own"), *EXACT, *own]
    interrupted = main(args, run=False)
    interrupted.trainer.callbacks.append(SignalAtStep(step=17))  # 210 training rows, 7 steps an epoch: mid epoch 2 of 3
    with pytest.raises(Preempted):
        interrupted.trainer.fit(interrupted.model, datamodule=interrupted.datamodule)
    # As the interrupt says: the run's own config (the class switch is in it). A config is code: the module of the
    # user's own it names is theirs, and the checkpoint may name it too, without --trust.
    config = own_config(run_dir(interrupted.trainer))
    resumed = main(["fit", f"--config={config}", "--resume=true"])
    assert_same_end_state(reference, resumed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the gpu preset)")
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_the_gpu_preset_resumes_exactly_mid_epoch(tmp_path: Path) -> None:
    # Mixed precision ({{ cookiecutter.precision }}), TF32, fused AdamW, pinned memory: the same end state.
    # cuDNN's autotuning (benchmark) may pick another algorithm per run: off, as deterministic asks.
    gpu = [f"--config={CONFIGS / 'presets' / 'gpu.yaml'}", "--trainer.accelerator=gpu", "--trainer.benchmark=false"]
    reference = main(["fit", *shrunk_args(tmp_path / "reference"), *EXACT, *gpu])
    args = [*shrunk_args(tmp_path / "resumed"), *EXACT, *gpu]
    interrupted = main(args, run=False)
    interrupted.trainer.callbacks.append(SignalAtStep(step=15))
    with pytest.raises(Preempted):
        interrupted.trainer.fit(interrupted.model, datamodule=interrupted.datamodule)
    resumed = main(["fit", *args, "--resume=true"])
    assert_same_end_state(reference, resumed)


def test_an_in_memory_split_is_fetched_a_batch_at_a_time_with_the_batches_of_sample_by_sample_collation() -> None:
    features, labels = torch.randn(23, 3, 4), torch.arange(23)
    data = ResumableDataModule(batch_size=5)
    data.train_set = TensorDataset(features, labels)
    for ours, theirs in (
        (data.loader(data.train_set), DataLoader(data.train_set, batch_size=5)),
        (data.train_dataloader(), DataLoader(data.train_set, batch_size=5, sampler=data.train_dataloader().sampler)),
    ):
        assert isinstance(ours.dataset, TensorBatches)  # one index op per tensor for a whole batch
        batches, expected = list(ours), list(theirs)
        assert len(batches) == len(expected) == 5
        for batch, reference in zip(batches, expected, strict=True):
            assert type(batch) is type(reference) is list
            assert all(torch.equal(a, b) for a, b in zip(batch, reference, strict=True))
    data.collate_fn = lambda samples: samples  # a DataModule's own collation is kept, sample by sample
    assert not isinstance(data.loader(data.train_set).dataset, TensorBatches)
