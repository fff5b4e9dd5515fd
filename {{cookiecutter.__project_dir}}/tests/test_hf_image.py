"""Pretrained Hugging Face vision backbones (nets.HFImageClassifier) with the image-folder DataModule's
``pretrained`` preprocessing: tiny random ViT, ConvNeXt and ResNet folders made with ``save_pretrained``."""

{% if cookiecutter.use_serving == "yes" -%}
import importlib.util
{% endif -%}
import json
import logging
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
    readme_commands,
    run_readme_training,
    shrunk_args,
    user_error,
)

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.data import ImageFolderDataModule
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, MissingFileError
{%- if cookiecutter.use_serving == "yes" %}
from {{ cookiecutter.package_name }}.engine.export import ExportError, export_all
{%- endif %}
{% if cookiecutter.use_serving == "yes" -%}
from {{ cookiecutter.package_name }}.engine.inference import load_trained
{% endif -%}
from {{ cookiecutter.package_name }}.nets import HFImageClassifier, LoRA
from {{ cookiecutter.package_name }}.nets.image_preprocessing import check_preprocessing_fits, image_preprocessing

transformers = pytest.importorskip("transformers", reason="the finetune extra (make install installs it)")
pytest.importorskip("peft", reason="the finetune extra (make install installs it)")

EXPERIMENT = CONFIGS / "experiments" / "image-folder.yaml"
NET = "{{ cookiecutter.package_name }}.nets.HFImageClassifier"
TRANSFER = CONFIGS / "experiments" / "transfer-learning.yaml"
# Each processor as the hub stores it (keys and values of transformers' own save_pretrained), at 32 px.
STATS = {"image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28]}
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
PROCESSORS = {
    "vit": {"size": {"height": 32, "width": 32}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3},
    "convnext": {"size": {"shortest_edge": 28}, "crop_pct": 0.875, **STATS},
    "resnet": {
        "size": {"shortest_edge": 36},
        "crop_size": {"height": 32, "width": 32},
        "do_center_crop": True,
        **STATS,
    },
}
SETTINGS = {  # what the DataModule makes of each: (image_size, crop_size)
    "vit": (32, None),
    "convnext": (32, 28),  # shorter side to 28 / 0.875, centre crop 28
    "resnet": (36, 32),
}
# Two more architectures, whose processors are ViT's shape (EfficientNet's divides by std twice).
PROCESSORS["swin"], SETTINGS["swin"] = PROCESSORS["vit"], SETTINGS["vit"]
PROCESSORS["efficientnet"] = {"size": {"height": 32, "width": 32}, "include_top": True, **STATS}
SETTINGS["efficientnet"] = (32, None)
# Fine-tuned below. Not EfficientNet: a tiny random one from transformers does not learn the colours
# even in a plain PyTorch loop (the loss stays at ln 3 for 40 steps, at widths 0.1 and 0.25).
FINE_TUNED = ("convnext", "resnet", "swin", "vit")


def save_tiny(kind: str, folder: Path, classifier_labels: int | None = None) -> Path:
    """A tiny random backbone of ``kind`` (a classifier for ``classifier_labels`` classes when given) and its
    preprocessor_config.json, as ``save_pretrained`` writes them."""
    configs = {
        "vit": lambda: transformers.ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
        ),
        "convnext": lambda: transformers.ConvNextConfig(hidden_sizes=[8, 16], depths=[1, 1], num_stages=2),
        "resnet": lambda: transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1]),
        "swin": lambda: transformers.SwinConfig(
            image_size=32, patch_size=4, embed_dim=8, depths=[1, 1], num_heads=[1, 2], window_size=4
        ),
        # width 0.1 of EfficientNet-B0's: its last layer has 128 channels, not 1,280
        "efficientnet": lambda: transformers.EfficientNetConfig(
            image_size=32, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128
        ),
    }
    config = configs[kind]()
    torch.manual_seed(0)
    if classifier_labels is None:
        transformers.AutoModel.from_config(config).save_pretrained(folder)
    else:
        config.num_labels = classifier_labels
        transformers.AutoModelForImageClassification.from_config(config).save_pretrained(folder)
    processor = {"do_normalize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_resize": True}
    (folder / "preprocessor_config.json").write_text(json.dumps({**processor, **PROCESSORS[kind]}))
    return folder


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_the_preprocessor_config_sets_sizes_and_statistics(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps({"do_rescale": True, **PROCESSORS[kind]}))
    settings = image_preprocessing(folder)
    assert (settings["image_size"], settings["crop_size"]) == SETTINGS[kind]
    assert (settings["mean"], settings["std"]) == expected_statistics(kind)


def expected_statistics(kind: str) -> tuple[list[float], list[float]]:
    """The mean and std of ``kind``'s processor: EfficientNet's (``include_top``) divides by std twice."""
    mean, std = PROCESSORS[kind]["image_mean"], PROCESSORS[kind]["image_std"]
    return mean, [s * s for s in std] if PROCESSORS[kind].get("include_top") else std


def test_a_folder_without_a_readable_preprocessing_is_named(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match=r"has no preprocessor_config\.json"):
        image_preprocessing(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": dict(height=32, width=48)}))
    with pytest.raises(ConfigError, match=r"size \{'height': 32, 'width': 48\} is not square"):
        image_preprocessing(tmp_path)
    hostile = {  # a file that is not what transformers writes: named in one line, never decoded into memory
        "not JSON": ("{size", "is not readable JSON"),
        "a list": ("[]", "is not a JSON object"),
        "a size in text": (json.dumps({"size": dict(height="32", width="32")}), "must be whole pixels"),
        "a million pixels a side": (json.dumps({"size": dict(height=10**6, width=10**6)}), "from 1 to 4096"),
    }
    hostile["an edge in text"] = (json.dumps({"size": dict(shortest_edge="x"), "crop_pct": 0.9}), "whole pixels")
    hostile["pixels to [-1, 1]"] = (json.dumps({"size": 32, "rescale_offset": True}), "does not rescale pixels to")
    hostile["a factor in text"] = (json.dumps({"size": 32, "rescale_factor": "1/255"}), "does not rescale pixels to")
    for text, message in hostile.values():
        (tmp_path / "preprocessor_config.json").write_text(text)
        with pytest.raises(ConfigError, match=message):
            image_preprocessing(tmp_path)


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_a_backbone_gets_a_new_head_for_the_datas_classes(kind: str, tmp_path: Path) -> None:
    folder = save_tiny(kind, tmp_path / kind, classifier_labels=5)  # a classifier for 5 classes of its own
    own = transformers.AutoModelForImageClassification.from_pretrained(folder)
    net = HFImageClassifier(str(folder), num_classes=5, in_channels=1).eval()
    logits = net(torch.rand(2, 1, 32, 32))  # grey images, repeated to the backbone's 3 channels
    assert logits.shape == (2, 5) and logits.dtype == torch.float32
    head = [p for name, p in net.named_parameters() if ".classifier." in f".{name}"]
    own_head = [p for name, p in own.named_parameters() if name.startswith("classifier.")]
    assert head and not any(torch.equal(a, b) for a, b in zip(head, own_head, strict=True))  # a new head
    assert not any("classifier" in name for name, _ in net.backbone.named_parameters())  # what BackboneFreeze freezes


def test_lora_trains_the_adapters_and_the_head_and_its_state_holds_only_them(tmp_path: Path) -> None:
    folder = save_tiny("vit", tmp_path / "vit")
    lora = LoRA(r=4, dropout=0.0, target_modules=["q_proj", "v_proj"])
    net = HFImageClassifier(str(folder), num_classes=3, lora=lora)
    trainable = {name for name, p in net.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name or "classifier" in name for name in trainable)
    assert sum("classifier" in name for name in trainable) == 2  # the new head's weight and bias
    weights = {key for key, value in net.state_dict().items() if isinstance(value, torch.Tensor)}
    assert weights == trainable  # the adapters and the head, not the frozen base
    again = HFImageClassifier(str(folder), num_classes=3, lora=lora)
    again.load_state_dict(net.state_dict())
    images = torch.rand(2, 3, 32, 32)
    assert torch.equal(again.eval()(images), net.eval()(images))


def test_a_backbone_on_images_not_prepared_as_in_its_pretraining_is_refused_before_training(tmp_path: Path) -> None:
    folder = save_tiny("convnext", tmp_path / "convnext")
    images = colour_folder(tmp_path / "images", per_class=10)
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--model.init_args.net={NET}", f"--model.init_args.net.init_args.model={folder}"]  # no data.pretrained
    cli = main([*args, "--data.init_args.image_size=32", "--data.init_args.batch_size=8"], run=False)
    expected = r"\(32 px, crop 28, mean .*\), but the data prepares them otherwise \(32 px, crop None, its own mean"
    with pytest.raises(ConfigError, match=expected + r".*set data.init_args.pretrained"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 0


def test_the_backbones_preparation_given_by_hand_passes_and_an_own_datamodule_is_told_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = save_tiny("convnext", tmp_path / "convnext")
    net = HFImageClassifier(str(folder), num_classes=3)
    images = colour_folder(tmp_path / "images", per_class=10)
    stats = {"mean": STATS["image_mean"], "std": STATS["image_std"]}
    check_preprocessing_fits(net, ImageFolderDataModule(str(images), image_size=32, crop_size=28, **stats))
    with pytest.raises(ConfigError, match=r"otherwise \(32 px, crop 28, another mean and std\)"):
        check_preprocessing_fits(net, ImageFolderDataModule(str(images), image_size=32, crop_size=28, **IMAGENET))
    with caplog.at_level(logging.INFO):
        check_preprocessing_fits(net, OwnImages())  # says nothing of its preparation: told, not refused
    assert "prepared as 32 px, crop 28, mean [0.48, 0.46, 0.41], std [0.27, 0.26, 0.28]; OwnImages" in caplog.text


class OwnImages(L.LightningDataModule):
    """A user's DataModule, which has no ``image_preparation``."""


@pytest.mark.slow
@pytest.mark.parametrize("kind", FINE_TUNED)
def test_a_backbone_fine_tunes_above_chance_and_predicts_with_the_images_moved(kind: str, tmp_path: Path) -> None:
    folder = save_tiny(kind, tmp_path / kind)
    images = colour_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--data.init_args.pretrained={folder}", f"--model.init_args.net={NET}"]
    args += [f"--model.init_args.net.init_args.model={folder}", "--model.init_args.optimizer.init_args.lr=0.003"]
    args += ["--trainer.max_epochs=4", "--data.init_args.batch_size=16"]
{%- if cookiecutter.use_serving == "yes" %}
    # transformers' Swin: torch.export (model.pt2) converts it, the ONNX exporter does not (see below).
    checkpoint, moved, rows = assert_fine_tunes_and_ships(tmp_path, images, args, onnx=kind != "swin")
    if kind == "swin" and importlib.util.find_spec("onnxruntime") is not None:
        with pytest.raises(ExportError, match=r"ONNX exporter cannot convert HFImageClassifier .*--onnx false"):
            export_all(load_trained(checkpoint), tmp_path / "onnx", onnx=True)
{%- else %}
    checkpoint, _, _ = assert_fine_tunes_and_ships(tmp_path, images, args)
{%- endif %}
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    data = next(value for key, value in state.items() if key.endswith("ImageFolderDataModule"))
    assert (data["mean"], data["std"]) == expected_statistics(kind)
    assert (data["image_size"], data["crop_size"]) == SETTINGS[kind]
{%- if cookiecutter.use_serving == "yes" %}
    if kind == "vit":  # the server (one architecture: it adds a server start to the test) answers as predict does
        assert_serves_as_predicted(checkpoint, tmp_path, moved, rows)
{%- endif %}


@pytest.mark.slow
def test_under_ddp_a_backbone_frozen_then_unfrozen_fine_tunes_as_one_model(tmp_path: Path) -> None:
    """Two gloo processes fine-tune the tiny ViT, frozen for epoch 0 then unfrozen (BackboneFreeze): the
    copies stay equal each epoch (DDP alone would let the unfrozen backbone drift, Lightning issue #20340)
    and the test split, shared out, is classified above chance."""
    folder = save_tiny("vit", tmp_path / "vit")
    images = colour_folder(tmp_path / "images")
    freeze = {"class_path": "{{ cookiecutter.package_name }}.engine.callbacks.finetuning.BackboneFreeze"}
    freeze["init_args"] = {"unfreeze_at_epoch": 1}
    path = {"path": str(tmp_path / "gaps.json")}
    gaps = {"class_path": "conftest.ReplicaGaps", "init_args": path}
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--data.init_args.pretrained={folder}", f"--model.init_args.net={NET}"]
    args += [f"--model.init_args.net.init_args.model={folder}", "--model.init_args.optimizer.init_args.lr=0.003"]
    args += [f"--config={CONFIGS / 'presets' / 'ddp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    args += ["--trainer.max_epochs=4", "--data.init_args.batch_size=8"]
    args += [f"--trainer.callbacks+={json.dumps(freeze)}", f"--trainer.callbacks+={json.dumps(gaps)}"]
    fit_in_subprocess(args)
    assert json.loads((tmp_path / "gaps.json").read_text()) == [0.0] * 4
    summary = json.loads(next((tmp_path / "logs").rglob("test_metrics.json")).read_text())
    assert summary["world_size"] == 2
    assert summary["metrics"]["test/acc"] > 0.6  # three colours: chance is 1/3


@pytest.mark.slow
def test_a_lora_fine_tune_from_the_command_line_checkpoints_only_the_adapters_and_the_head(tmp_path: Path) -> None:
    """The README's ``lora: {r: 8, target_modules: [q_proj, v_proj]}``, given on the command line: the
    checkpoint holds the adapters and the new head, not the frozen ViT, and still {{ "exports and predicts" if cookiecutter.use_serving == "yes" else "predicts" }}."""
    folder = save_tiny("vit", tmp_path / "vit")
    images = colour_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--data.init_args.pretrained={folder}", f"--model.init_args.net={NET}"]
    args += [f"--model.init_args.net.init_args.model={folder}", "--model.init_args.optimizer.init_args.lr=0.003"]
    args += ["--model.init_args.net.init_args.lora={r: 8, target_modules: [q_proj, v_proj]}"]
    args += ["--trainer.max_epochs=4", "--data.init_args.batch_size=16"]
    checkpoint, _, _ = assert_fine_tunes_and_ships(tmp_path, images, args)
    weights = torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]
    net = {key for key, value in weights.items() if key.startswith("net.") and isinstance(value, torch.Tensor)}
    assert net and all("lora_" in key or ".classifier." in key for key in net)
    adapters = [key for key in net if "lora_B" in key]  # B starts at zero: non-zero once trained
    assert len(adapters) == 4 and all(weights[key].abs().sum() > 0 for key in adapters)  # q and v, 2 layers


def test_lora_with_backbone_freeze_is_refused_before_training(tmp_path: Path) -> None:
    # transfer-learning.yaml adds BackboneFreeze; its unfreeze would train base weights a LoRA checkpoint
    # never saves: test/acc 0.70 after training, 0.35 for every reload of the same checkpoint.
    folder = save_tiny("vit", tmp_path / "vit")
    images = colour_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--config={TRANSFER}", f"--data.init_args.root={images}"]
    args += [f"--data.init_args.pretrained={folder}", f"--model.init_args.net.init_args.model={folder}"]
    args += ["--model.init_args.net.init_args.lora={r: 4, target_modules: [q_proj, v_proj]}"]
    args += ["--data.init_args.batch_size=16"]
    with user_error(r"^BackboneFreeze with LoRA .*remove the callback \(LoRA alone\), or drop lora"):
        main(["fit", *args])
    assert not list((tmp_path / "logs").rglob("*.ckpt"))


@pytest.mark.slow
def test_the_lora_experiment_config_fine_tunes_and_every_reload_scores_as_tested(tmp_path: Path) -> None:
    """configs/experiments/lora.yaml with a tiny ViT: {% if cookiecutter.use_serving == "yes" %}the export's fresh load of the best checkpoint scores
    the test split as the run did after training{% else %}it trains above chance and a fresh load of the best
    checkpoint predicts{% endif %} (assert_fine_tunes_and_ships)."""
    folder = save_tiny("vit", tmp_path / "vit")
    images = colour_folder(tmp_path / "images")
    lora = CONFIGS / "experiments" / "lora.yaml"
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--config={lora}"]
    args += [f"--data.init_args.root={images}", f"--data.init_args.pretrained={folder}"]
    args += [f"--model.init_args.net.init_args.model={folder}", "--trainer.max_epochs=4"]
    args += ["--data.init_args.batch_size=16"]
    assert_fine_tunes_and_ships(tmp_path, images, args)


@pytest.mark.slow
def test_the_readmes_transfer_learning_runs_offline_as_written(tmp_path: Path) -> None:
    """The README's transfer-learning commands, run as written in a copy of the project.

    `hf download` is the one command not run (no internet): the test puts a tiny DINOv2 (32 px crops
    of 36 px squares, so it runs in seconds) in a Hugging Face cache of its own under the id the
    README and transfer-learning.yaml name, as the download would; ARGS gets 8 epochs of batches of 16
    (the backbone trains from the third).
    """
    download, train = readme_commands("Transfer learning")
    model_id = download.removeprefix("hf download ").strip()
    config = yaml.safe_load((CONFIGS / "experiments" / "transfer-learning.yaml").read_text())
    assert config["model"]["init_args"]["net"]["init_args"]["model"] == model_id
    assert config["data"]["init_args"]["pretrained"] == model_id

    cache = tmp_path / "hf-cache"
    snapshot = cached_snapshot(cache, model_id)
    torch.manual_seed(0)
    small = transformers.Dinov2Config(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2)
    small.num_attention_heads, small.intermediate_size = 4, 64
    transformers.AutoModel.from_config(small).save_pretrained(snapshot)
    processor = {"size": {"shortest_edge": 36}, "crop_size": {"height": 32, "width": 32}, "do_center_crop": True}
    (snapshot / "preprocessor_config.json").write_text(json.dumps({**processor, **STATS}))
    metrics = run_readme_training(tmp_path, train, cache)
    assert metrics["test/acc"] > 0.5  # three classes: chance is 1/3
