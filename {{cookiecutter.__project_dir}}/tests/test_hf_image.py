"""Pretrained Hugging Face vision backbones (nets.HFImageClassifier) with the image-folder DataModule's
``pretrained`` preprocessing: tiny random ViT, ConvNeXt and ResNet folders made with ``save_pretrained``."""

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CONFIGS, shrunk_args
from PIL import Image

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, MissingFileError
from {{ cookiecutter.package_name }}.engine.pretrained import image_preprocessing
from {{ cookiecutter.package_name }}.nets import HFImageClassifier, LoRA
from {{ cookiecutter.package_name }}.predict import predict

transformers = pytest.importorskip("transformers", reason="the finetune extra (make install installs it)")
pytest.importorskip("peft", reason="the finetune extra (make install installs it)")

EXPERIMENT = CONFIGS / "experiments" / "image-folder.yaml"
NET = "{{ cookiecutter.package_name }}.nets.HFImageClassifier"
# Each processor as the hub stores it (keys and values of transformers' own save_pretrained), at 32 px.
STATS = {"image_mean": [0.48, 0.46, 0.41], "image_std": [0.27, 0.26, 0.28]}
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


def colour_folder(root: Path, per_class: int = 30, seed: int = 0) -> Path:
    """root/{red,green,blue}/<n>.png: noisy 40x48 images of one dominant colour each: an easy split."""
    rng = np.random.default_rng(seed)
    for channel, name in enumerate(("red", "green", "blue")):
        (root / name).mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 90, size=(40, 48, 3))
            pixels[..., channel] += 150
            Image.fromarray(pixels.clip(0, 255).astype(np.uint8), mode="RGB").save(root / name / f"{index}.png")
    return root


@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_the_preprocessor_config_sets_sizes_and_statistics(kind: str, tmp_path: Path) -> None:
    folder = tmp_path / kind
    folder.mkdir()
    (folder / "preprocessor_config.json").write_text(json.dumps({"do_rescale": True, **PROCESSORS[kind]}))
    settings = image_preprocessing(folder)
    assert (settings["image_size"], settings["crop_size"]) == SETTINGS[kind]
    assert (settings["mean"], settings["std"]) == (PROCESSORS[kind]["image_mean"], PROCESSORS[kind]["image_std"])


def test_a_folder_without_a_readable_preprocessing_is_named(tmp_path: Path) -> None:
    with pytest.raises(MissingFileError, match=r"has no preprocessor_config\.json"):
        image_preprocessing(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": dict(height=32, width=48)}))
    with pytest.raises(ConfigError, match=r"size \{'height': 32, 'width': 48\} is not square"):
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


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(PROCESSORS))
def test_a_backbone_fine_tunes_above_chance_and_predicts_with_the_images_moved(kind: str, tmp_path: Path) -> None:
    folder = save_tiny(kind, tmp_path / kind)
    images = colour_folder(tmp_path / "images")
    args = [*shrunk_args(tmp_path), f"--config={EXPERIMENT}", f"--data.init_args.root={images}"]
    args += [f"--data.init_args.pretrained={folder}", f"--model.init_args.net={NET}"]
    args += [f"--model.init_args.net.init_args.model={folder}", "--model.init_args.optimizer.init_args.lr=0.003"]
    args += ["--trainer.max_epochs=4", "--data.init_args.batch_size=16"]
    cli = main(["fit", *args])
    assert cli.trainer.callback_metrics["test/acc"] > 0.6  # three classes: chance is 1/3
    checkpoint = Path(cli.trainer.checkpoint_callback.best_model_path)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    data = next(value for key, value in state.items() if key.endswith("ImageFolderDataModule"))
    assert (data["mean"], data["std"]) == (PROCESSORS[kind]["image_mean"], PROCESSORS[kind]["image_std"])
    assert (data["image_size"], data["crop_size"]) == SETTINGS[kind]
    moved = tmp_path / "moved"
    shutil.copytree(images / "blue", moved)
    shutil.rmtree(images)  # the training images are gone: the checkpoint and the backbone folder are enough
    path = predict(ckpt=checkpoint, inputs=str(moved), output=tmp_path / "p.csv", accelerator="cpu")
    with path.open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 30 and sum(row["label"] == "blue" for row in rows) >= 24
