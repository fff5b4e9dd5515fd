"""The engine's promises kept for a model and data set it has never seen: a toy classifier on
``TrainingModule`` and random tensors on ``ResumableDataModule``, trained on the CPU in seconds."""

import warnings
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import nn
from torch.utils.data import TensorDataset
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from .. import ResumableDataModule, TrainingModule, split_indices


class Points(ResumableDataModule):
    """60 random points (B, 4) whose class is the sign of their first coordinate: (inputs, class) samples."""

    def setup(self, stage: str | None = None) -> None:
        if self.train_set is not None:
            return
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(60, 4, generator=generator)
        labels = (inputs[:, 0] > 0).long()  # (N,)
        rows = split_indices(labels.numpy(), len(labels), 0.2, 0.2, seed=0)
        self.train_set, self.val_set, self.test_set = (TensorDataset(inputs[r], labels[r]) for r in rows.values())


class Classifier(TrainingModule):
    """A linear classifier (B, 4) -> (B, 2) logits: a task module's loss and metrics, nothing else."""

    def __init__(self, **kwargs) -> None:
        super().__init__(nn.Linear(4, 2), **kwargs)
        self.set_metrics(MetricCollection({"acc": MulticlassAccuracy(2)}))

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        inputs, labels = batch
        logits = self(inputs)
        metrics.update(logits, labels)
        return F.cross_entropy(logits, labels)


class StopAt(Callback):
    """Saves a checkpoint to ``path`` after ``step`` optimizer steps, mid-epoch, and stops: a pre-empted job."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)
            trainer.should_stop = True


def fit(root: Path, epochs: int, callbacks: list[Callback] = (), ckpt_path: Path | None = None) -> L.Trainer:
    torch.manual_seed(0)
    model, data = Classifier(), Points(batch_size=4)
    options = {"enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False}
    trainer = L.Trainer(
        max_epochs=epochs, accelerator="cpu", logger=False, default_root_dir=root, callbacks=list(callbacks), **options
    )
    with warnings.catch_warnings():
        # Lightning's notes on a small run (few batches, no workers) and on resuming mid-epoch, which the
        # DataModule's own position makes exact (the test's point).
        warnings.filterwarnings("ignore", message=r".*(num_workers|log_every_n_steps|mid-epoch|before the epoch ended)")
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
    return trainer


def test_a_run_stopped_mid_epoch_resumes_to_the_uninterrupted_runs_weights(tmp_path: Path) -> None:
    straight = fit(tmp_path / "straight", epochs=3)
    checkpoint = tmp_path / "stopped.ckpt"
    fit(tmp_path / "stopped", epochs=3, callbacks=[StopAt(13, checkpoint)])  # 9 batches an epoch: inside epoch 1
    assert torch.load(checkpoint, weights_only=True)["Points"]["batches_done"] == 4
    resumed = fit(tmp_path / "resumed", epochs=3, ckpt_path=checkpoint)
    assert resumed.global_step == straight.global_step == 27
    for (name, expected), actual in zip(
        straight.lightning_module.state_dict().items(), resumed.lightning_module.state_dict().values(), strict=True
    ):
        assert torch.equal(expected, actual), name


def test_the_test_split_is_the_same_whatever_the_training_seed() -> None:
    labels = (torch.arange(100) % 3).numpy()
    first, second = (split_indices(labels, 100, 0.2, 0.2, seed=7) for _ in range(2))
    assert all((first[split] == second[split]).all() for split in ("train", "val", "test"))
    assert sorted([*first["train"], *first["val"], *first["test"]]) == list(range(100))
    assert [int((labels[first["test"]] == c).sum()) for c in range(3)] in ([7, 7, 6], [7, 6, 7], [6, 7, 7])
