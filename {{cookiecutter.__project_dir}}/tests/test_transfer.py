"""Transfer learning: the backbone stays frozen, then trains at its own learning rate; the torchvision and
timm nets from local weights files (their tests run where torchvision imports beside torch: CI's
.ci/vision environment, where none may skip); the DataModule's pretrained statistics."""

import copy
import json
import pickle
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import (
    CONFIGS,
    assert_fine_tunes_and_ships,
{%- if cookiecutter.use_serving == "yes" %}
    assert_serves_as_predicted,
{%- endif %}
    cached_snapshot,
    colour_folder,
    fit_in_subprocess,
    fit_stopped_by_signal,
    readme_commands,
    resume_as_printed,
    run_readme_training,
    shrunk_args,
)

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import ImageFolderDataModule
from {{ cookiecutter.package_name }}.engine.callbacks.finetuning import BackboneFreeze
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, MissingFileError
from {{ cookiecutter.package_name }}.nets.image_preprocessing import image_preprocessing


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


@pytest.mark.slow  # a subprocess stopped by a signal, then two fits
@pytest.mark.parametrize(
    ("unfreeze_at_epoch", "step"), [(1, 15), (1, 25), (0, 5)], ids=["in-the-unfreeze-epoch", "after-it", "from-0"]
)
def test_a_run_resumed_at_or_after_the_unfreeze_ends_as_the_unbroken_run(
    tmp_path: Path, unfreeze_at_epoch: int, step: int
) -> None:
    """setup() freezes the backbone before a checkpoint loads: the resumed epochs must train it again (and add
    no group twice, and save the groups the checkpoint needs), to the weights of a run never stopped.
    SIGTERM after ``step`` of 3 epochs of 10 steps."""
    init_args = {"unfreeze_at_epoch": unfreeze_at_epoch}
    freeze = {"class_path": f"{BackboneFreeze.__module__}.BackboneFreeze", "init_args": init_args}
    common = ["--test_after_fit=false", "--trainer.max_epochs=3", f"--trainer.callbacks+={json.dumps(freeze)}"]
    unbroken = main(["fit", *shrunk_args(tmp_path / "unbroken"), *common])
    interrupted = fit_stopped_by_signal([*shrunk_args(tmp_path / "stopped"), *common], step=step)
    resumed = main(["fit", *resume_as_printed(interrupted)])
    assert resumed.trainer.global_step == unbroken.trainer.global_step == 30
    assert all(parameter.requires_grad for parameter in resumed.model.net.parameters())
    expected, got = unbroken.model.net.state_dict(), resumed.model.net.state_dict()
    assert expected.keys() == got.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], msg=key)


@pytest.mark.slow
def test_under_ddp_the_unfrozen_backbone_stays_the_same_on_every_process(tmp_path: Path) -> None:
    """DDP syncs only the parameters that needed gradients when it wrapped the model: a backbone unfrozen
    later (Lightning's BaseFinetuning sets requires_grad) would train apart on each process, in silence
    (Lightning issue #20340), unless BackboneFreeze averages its gradients itself."""
    unfreeze, path = {"unfreeze_at_epoch": 1}, {"path": str(tmp_path / "gaps.json")}
    freeze = {"class_path": f"{BackboneFreeze.__module__}.BackboneFreeze", "init_args": unfreeze}
    gaps = {"class_path": "conftest.ReplicaGaps", "init_args": path}
    args = [*shrunk_args(tmp_path), f"--config={CONFIGS / 'presets' / 'ddp.yaml'}", "--trainer.accelerator=cpu"]
    args += ["--trainer.devices=2", "--trainer.max_epochs=3", "--test_after_fit=false"]
    args += [f"--trainer.callbacks+={json.dumps(freeze)}", f"--trainer.callbacks+={json.dumps(gaps)}"]
    fit_in_subprocess(args)
    assert json.loads((tmp_path / "gaps.json").read_text()) == [0.0, 0.0, 0.0]


def test_a_net_without_a_backbone_is_refused_before_training(tmp_path: Path) -> None:
    mlp = "--model.init_args.net={{ cookiecutter.package_name }}.nets.MLP"
    cli = main([*shrunk_args(tmp_path), mlp], run=False)
    cli.trainer.callbacks.append(BackboneFreeze())
    with pytest.raises(ValueError, match="MLP\\) has no `backbone` module"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0


def test_a_strategy_that_cannot_unfreeze_is_refused_before_anything_is_frozen(tmp_path: Path) -> None:
    """FSDP and DeepSpeed fix which parameters train when they wrap the model: the unfreeze would never
    reach the backbone. Lightning builds FSDP on GPUs only, so its setup hook is called as fit would."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy

    cli = main([*shrunk_args(tmp_path)], run=False)
    with pytest.raises(ConfigError, match=r"under FSDPStrategy: .*--config configs/presets/ddp.yaml"):
        BackboneFreeze().setup(SimpleNamespace(strategy=FSDPStrategy()), cli.model, "fit")
    # A DDPStrategy subclass that shards too; built without deepspeed, which this environment lacks.
    deepspeed = DeepSpeedStrategy.__new__(DeepSpeedStrategy)
    with pytest.raises(ConfigError, match=r"under DeepSpeedStrategy: "):
        BackboneFreeze().setup(SimpleNamespace(strategy=deepspeed), cli.model, "fit")
    assert all(parameter.requires_grad for parameter in cli.model.parameters())


EXPERIMENT = CONFIGS / "experiments" / "image-folder.yaml"
NETS = "{{ cookiecutter.package_name }}.nets"
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}  # torchvision's weights' statistics


def _import_error(library: str) -> str | None:
    try:
        __import__(library)
    except (ImportError, RuntimeError) as error:  # e.g. built for another torch: "operator torchvision::nms ..."
        return str(error)
    return None


needs_torchvision = pytest.mark.skipif(
    _import_error("torchvision") is not None,
    reason=f"torchvision does not import beside this torch (make torchvision): {_import_error('torchvision')}",
)
needs_timm = pytest.mark.skipif(
    _import_error("timm") is not None, reason=f"timm does not import here (make timm): {_import_error('timm')}"
)


def timm_weights(architecture: str, path: Path, **model_args) -> Path:
    """A random ``architecture`` with timm's 1000-class classifier, saved as a weights file (safetensors or .pth)."""
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(0)
    state = timm.create_model(architecture, num_classes=1000, **model_args).state_dict()
    if path.suffix == ".safetensors":
        save_file(state, path)
    else:
        torch.save(state, path)
    return path


def torchvision_weights(torchvision, architecture: str, path: Path) -> Path:
    """A random torchvision ``architecture`` whose BatchNorm statistics were measured (on noise at 32 px), as a
    pretrained one's were on its data: with the initial ones (mean 0, variance 1) a few fine-tuning steps
    leave evaluation far from training."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(architecture, weights=None)
    for layer in model.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            layer.reset_running_stats()
            layer.momentum = None  # a cumulative average over the batches below
    with torch.no_grad():
        for _ in range(8):
            model(torch.randn(16, 3, 32, 32))
    torch.save(model.state_dict(), path)
    return path


def timm_hub_folder(folder: Path, architecture: str, pretrained_cfg: dict, **model_args) -> Path:
    """A folder as timm's hub repositories hold one: config.json (architecture, model_args, pretrained_cfg)
    and model.safetensors."""
    folder.mkdir(parents=True)
    timm_weights(architecture, folder / "model.safetensors", **model_args)
    config = {"architecture": architecture, "num_classes": 1000, "model_args": model_args}
    (folder / "config.json").write_text(json.dumps({**config, "pretrained_cfg": pretrained_cfg}))
    return folder


def test_timms_pretrained_cfg_sets_sizes_and_statistics_and_odd_files_are_refused(tmp_path: Path) -> None:
    cfg = {"input_size": [3, 224, 224], "crop_pct": 0.95, "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "resnet50", "pretrained_cfg": cfg}))
    settings = image_preprocessing(tmp_path)  # timm's eval transform: shorter side to floor(224 / 0.95), crop 224
    assert settings == {"image_size": 235, "crop_size": 224, "mean": cfg["mean"], "std": cfg["std"]}
    hostile = {
        "squash": ({**cfg, "crop_mode": "squash"}, "reproduces timm's 'center' crop only"),
        "not square": ({**cfg, "input_size": [3, 224, 160]}, "is not square"),
        "no crop_pct": ({**cfg, "crop_pct": "0.9"}, "crop_pct '0.9' must be a number from 0.1 to 1"),
        "huge": ({**cfg, "input_size": [3, 10**6, 10**6]}, "from 1 to 4096"),
        "two means": ({**cfg, "mean": [0.5, 0.5]}, "mean .* is not 3 numbers"),
        "zero std": ({**cfg, "std": [0.2, 0.0, 0.3]}, "std .* must be above 0"),
    }
    for config, message in hostile.values():
        (tmp_path / "config.json").write_text(json.dumps({"architecture": "resnet50", "pretrained_cfg": config}))
        with pytest.raises(ConfigError, match=message):
            image_preprocessing(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architecture": "resnet50"}))
    with pytest.raises(MissingFileError, match=r"no preprocessor_config.json .* or config.json with a pretrained_cfg"):
        image_preprocessing(tmp_path)


def test_the_datamodules_own_mean_and_std_replace_the_training_splits(tmp_path: Path) -> None:
    images = colour_folder(tmp_path / "images", per_class=10)
    data = ImageFolderDataModule(root=str(images), image_size=36, crop_size=32, batch_size=4, **IMAGENET)
    data.setup("fit")
    assert (data.mean, data.std) == (IMAGENET["mean"], IMAGENET["std"]) and data.num_channels == 3
    grey = ImageFolderDataModule(root=str(images), mean=[0.5], std=[0.25], batch_size=4)
    assert grey.num_channels == 1  # one mean and std: a grey backbone's images
    for wrong, message in {
        "mean alone": ({"mean": [0.5] * 3}, "must both be given"),
        "two values": ({"mean": [0.5] * 2, "std": [0.2] * 2}, "3 values each"),
        "zero std": ({"mean": [0.5], "std": [0.0]}, "data.std=\\[0.0\\] must be above 0"),
        "beside pretrained": ({**IMAGENET, "pretrained": str(tmp_path)}, "set pretrained, or mean and std"),
    }.values():
        with pytest.raises(ConfigError, match=message):
            ImageFolderDataModule(root=str(images), **wrong)


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


@needs_torchvision
def test_a_torchvision_weights_file_of_another_architecture_is_refused_by_name(tmp_path: Path) -> None:
    import torchvision

    from {{ cookiecutter.package_name }}.nets import PretrainedNet

    file = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.get_model("resnet18", weights=None).state_dict(), file)
    net = PretrainedNet("resnet18", num_classes=3, weights=str(file))
    saved = torch.load(file, weights_only=True)
    assert all(torch.equal(value, saved[key]) for key, value in net.backbone.state_dict().items())
    with pytest.raises(ConfigError, match=r"resnet18.pth is not resnet34's: .* of its weights are missing"):
        PretrainedNet("resnet34", num_classes=3, weights=str(file))


@needs_timm
def test_a_timm_weights_file_loads_all_but_the_classifier_and_a_wrong_one_is_refused(tmp_path: Path) -> None:
    from {{ cookiecutter.package_name }}.nets import TimmNet

    file = timm_weights("test_efficientnet", tmp_path / "efficientnet.safetensors")
    net = TimmNet("test_efficientnet", num_classes=3, in_channels=1, weights=str(file)).eval()
    from safetensors.torch import load_file

    saved = load_file(file)
    backbone = net.backbone.state_dict()
    assert backbone and all(torch.equal(value, saved[key]) for key, value in backbone.items())
    assert {key for key in saved if key not in backbone} == {"classifier.weight", "classifier.bias"}
    assert net(torch.rand(2, 1, 32, 32)).shape == (2, 3)  # grey images, repeated to 3 channels
    # Another architecture's file: refused whether timm converts it first (ConvNeXt) or not (GroupNorm
    # layers, which have no BatchNorm statistics).
    with pytest.raises(ConfigError, match=r"efficientnet.safetensors is not test_convnext's"):
        TimmNet("test_convnext", num_classes=3, weights=str(file))
    with pytest.raises(ConfigError, match=r"is not test_efficientnet_gn's: 0 of its weights are missing .* unknown"):
        TimmNet("test_efficientnet_gn", num_classes=3, weights=str(file))
    with pytest.raises(MissingFileError, match="does not exist; give the weights file of test_efficientnet"):
        TimmNet("test_efficientnet", weights=str(tmp_path / "absent.safetensors"))
    with pytest.raises(ConfigError, match="'no_such_net' is not a timm architecture"):
        TimmNet("no_such_net")
    code = tmp_path / "code.pth"  # a pickle that would call a function when loaded: refused, never run
    code.write_bytes(pickle.dumps(Exploit(tmp_path / "ran")))
    with pytest.raises(ConfigError, match=r"not a readable weights file .*a pickle that needs code to load is refused"):
        TimmNet("test_efficientnet", weights=str(code))
    assert not (tmp_path / "ran").exists()
    # A hub folder whose config.json asks timm to load another file (outside the folder): refused.
    folder = timm_hub_folder(tmp_path / "hub", "test_efficientnet", TIMM_CFG)
    config = json.loads((folder / "config.json").read_text())
    config["model_args"] = {"checkpoint_path": str(code)}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"model_args sets checkpoint_path, which choose what timm loads"):
        TimmNet(str(folder), num_classes=3)


class Exploit:
    """Unpickled, it would create ``marker``: what a hostile weights file would do with a shell command."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


TIMM_CFG = {"input_size": [3, 32, 32], "crop_pct": 0.875, "mean": [0.48, 0.46, 0.41], "std": [0.27, 0.26, 0.28]}
LIBRARY_CASES = {  # library-source-architecture: the net
    "timm-hub-folder-vit": "TimmNet",
    "timm-file-efficientnet": "TimmNet",
    "torchvision-file-resnet18": "PretrainedNet",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(LIBRARY_CASES))
def test_a_library_backbone_fine_tunes_exports_and_predicts_offline(case: str, tmp_path: Path) -> None:
    """timm from a hub folder (its pretrained_cfg prepares the images) and from a weights file; torchvision
    from a weights file with ImageNet's statistics given to the DataModule."""
    library = pytest.importorskip(case.split("-")[0], reason="make timm / make torchvision")
    net = LIBRARY_CASES[case]
    images = colour_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--model.init_args.net={NETS}.{net}", "--model.init_args.optimizer.init_args.lr=0.003"]
    args += ["--trainer.max_epochs=4", "--data.init_args.batch_size=16"]
    if case == "timm-hub-folder-vit":
        folder = timm_hub_folder(tmp_path / "vit", "test_vit", TIMM_CFG, img_size=32)
        args += [f"--model.init_args.net.init_args.model={folder}", f"--data.init_args.pretrained={folder}"]
        expected = {"image_size": 36, "crop_size": 32, "mean": TIMM_CFG["mean"], "std": TIMM_CFG["std"]}
    else:
        architecture = case.split("-")[-1]
        if library.__name__ == "timm":
            file = timm_weights(f"test_{architecture}", tmp_path / "weights.safetensors")
            args += [f"--model.init_args.net.init_args.model=test_{architecture}"]
        else:
            file = torchvision_weights(library, architecture, tmp_path / "weights.pth")
            args += [f"--model.init_args.net.init_args.architecture={architecture}"]
        args += [f"--model.init_args.net.init_args.weights={file}", "--data.init_args.image_size=36"]
        args += ["--data.init_args.crop_size=32", f"--data.init_args.mean={IMAGENET['mean']}"]
        args += [f"--data.init_args.std={IMAGENET['std']}"]
        expected = {"image_size": 36, "crop_size": 32, **IMAGENET}
    checkpoint, {{ "moved, rows" if cookiecutter.use_serving == "yes" else "_, _" }} = assert_fine_tunes_and_ships(tmp_path, images, args)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    data = next(value for key, value in state.items() if key.endswith("ImageFolderDataModule"))
{%- if cookiecutter.use_serving == "yes" %}
    assert {key: data[key] for key in expected} == expected  # what predict, export and serve prepare images with
    if case != "timm-file-efficientnet":  # a server per library (the same code serves either file kind)
        assert_serves_as_predicted(checkpoint, tmp_path, moved, rows)
{%- else %}
    assert {key: data[key] for key in expected} == expected  # what predict prepares images with
{%- endif %}


@pytest.mark.slow
@needs_timm
def test_the_readmes_timm_transfer_learning_runs_offline_as_written(tmp_path: Path) -> None:
    """The README's timm commands as written, in a copy of the project: ``make timm`` is what CI's
    .ci/vision ran to make this environment; ``hf download`` is not run (no internet): the test puts a
    tiny timm ResNet (32 px crops of 36 px squares) in a Hugging Face cache of its own under the id the
    README and timm.yaml name, as the download would."""
    install, download, train = readme_commands("Transfer learning from timm")
    assert install == "make timm"
    model_id = download.removeprefix("hf download ").strip()
    config = yaml.safe_load((CONFIGS / "experiments" / "timm.yaml").read_text())
    assert config["model"]["init_args"]["net"]["init_args"]["model"] == model_id
    assert config["data"]["init_args"]["pretrained"] == model_id
    cache = tmp_path / "hf-cache"
    timm_hub_folder(cached_snapshot(cache, model_id), "test_resnet", TIMM_CFG)
    metrics = run_readme_training(tmp_path, train, cache)
    assert metrics["test/acc"] > 0.5  # three classes: chance is 1/3
