"""Transfer learning: the backbone stays frozen, then trains at its own learning rate; the torchvision net."""

import copy
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import shrunk_args

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.callbacks import BackboneFreeze


class Snapshots(L.Callback):
    """The net's state before fit and at the end of each training epoch."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.states.append(copy.deepcopy(pl_module.net.state_dict()))

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.states.append(copy.deepcopy(pl_module.net.state_dict()))


def changed(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], prefix: str) -> bool:
    return any(not torch.equal(before[key], after[key]) for key in before if key.startswith(prefix))


def test_backbone_is_frozen_until_the_unfreeze_epoch_then_trains_at_its_ratio(tmp_path: Path) -> None:
    cli = main([*shrunk_args(tmp_path), "--trainer.max_epochs=3", "--test_after_fit=false"], run=False)
    snapshots = Snapshots()
    cli.trainer.callbacks += [BackboneFreeze(unfreeze_at_epoch=1, backbone_lr_ratio=0.1), snapshots]
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    start, epoch0, *_, end = snapshots.states
    # The CNN's backbone is its convolution stages ("blocks."): weights and BatchNorm statistics
    # untouched in epoch 0 while the head learns, trained from epoch 1.
    assert not changed(start, epoch0, "blocks.") and changed(start, epoch0, "head.")
    assert changed(epoch0, end, "blocks.")
    groups = cli.trainer.optimizers[0].param_groups
    assert len(groups) == 4  # head: decayed, not decayed; backbone: decayed, not decayed
    assert groups[2]["initial_lr"] == pytest.approx(0.1 * groups[0]["initial_lr"])
    assert groups[2]["weight_decay"] > 0 and groups[3]["weight_decay"] == 0
    # The schedule drives the backbone's groups too, with the head's shape: same factor of each peak.
    head_factor = groups[0]["lr"] / groups[0]["initial_lr"]
    assert groups[2]["lr"] / groups[2]["initial_lr"] == pytest.approx(head_factor)


def test_a_net_without_a_backbone_is_refused_before_training(tmp_path: Path) -> None:
    mlp = "--model.init_args.net={{ cookiecutter.package_name }}.nets.MLP"
    cli = main([*shrunk_args(tmp_path), mlp], run=False)
    cli.trainer.callbacks.append(BackboneFreeze())
    with pytest.raises(ValueError, match="MLP\\) has no `backbone` module"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0


def _torchvision_error() -> str | None:
    try:
        import torchvision  # noqa: F401
    except (
        ImportError,
        RuntimeError,
    ) as error:  # e.g. built for another torch: "operator torchvision::nms does not exist"
        return str(error)
    return None


needs_torchvision = pytest.mark.skipif(
    _torchvision_error() is not None, reason=f"torchvision does not import beside this torch: {_torchvision_error()}"
)


@needs_torchvision
def test_pretrained_net_with_random_weights_maps_images_to_logits() -> None:
    from {{ cookiecutter.package_name }}.nets import PretrainedNet

    net = PretrainedNet("resnet18", num_classes=5, in_channels=1, weights=None).eval()
    assert not any(isinstance(m, torch.nn.Linear) for m in net.backbone.modules())  # the old classifier is gone
    with torch.no_grad():
        assert net(torch.randn(2, 1, 64, 64)).shape == (2, 5)


@needs_torchvision
def test_missing_cached_weights_name_the_file_instead_of_downloading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from {{ cookiecutter.package_name }}.nets import PretrainedNet

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=r"not in the local cache .*checkpoints"):
        PretrainedNet("resnet18", weights="DEFAULT")
