"""Pretrained files offline: a local folder or the local Hugging Face cache, never a download during a run.

A pretrained model is named either by a folder (``save_pretrained``'s output, or a copy of a hub
snapshot) or by a Hugging Face hub id (``HuggingFaceTB/SmolLM2-135M``, ``gpt2``) that must already be
in the local cache (``HF_HOME``, default ``~/.cache/huggingface``). Fetch it once where there is
internet: ``hf download <id>`` (huggingface_hub's CLI), then copy the cache to the cluster if the
compute nodes are offline. https://huggingface.co/docs/huggingface_hub/guides/download

:func:`fingerprint` identifies a base model's weights, so a checkpoint that holds only adapters
(LoRA) can refuse to load onto another base.
"""

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from {{ cookiecutter.package_name }}.engine.errors import ConfigError, MissingFileError

# The files whose bytes are a model: its config and its weights (safetensors, or PyTorch's .bin).
WEIGHT_SUFFIXES = (".safetensors", ".bin")
# Weights as a pickle: loading one can run code, so only safetensors are loaded.
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
MAX_IMAGE_SIDE = 4096  # pixels: a preprocessor_config.json asking for more is refused, not decoded into memory
HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")


@dataclass(frozen=True)
class Pretrained:
    """Where a pretrained model's files are: ``folder``, and the hub ``revision`` (commit) when from the cache."""

    source: str
    folder: Path
    revision: str | None


def locate(source: str, revision: str | None = None, key: str = "net.model") -> Pretrained:
    """The local folder of pretrained model ``source``: a folder, or a hub id found in the local cache.

    Args:
        source: a folder holding ``config.json``, or a Hugging Face hub id.
        revision: a branch, tag or commit of a hub id (default: the cached ``main``).
        key: the config key named in errors.

    Raises:
        MissingFileError: neither a folder nor in the local cache (names the command that fetches it).
        ConfigError: a folder without ``config.json``, or one that is code (:func:`check_data_only`).
    """
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"{key}: {path} has no config.json; give the folder that save_pretrained wrote (config.json, "
                "model.safetensors, tokenizer files) or a hub snapshot folder"
            )
        check_data_only(path, key)
        return Pretrained(source, path, None)
    if not HUB_ID.match(source):
        raise MissingFileError(f"{key}: {path} does not exist; give a model folder or a Hugging Face hub id")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(source, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        at = f" --revision {revision}" if revision else ""
        raise MissingFileError(
            f"{key}: {source} is neither a folder nor in the local Hugging Face cache (HF_HOME); runs never "
            f"download. Fetch it once where there is internet: `hf download {source}{at}`, or give its folder"
        ) from None
    check_data_only(folder, key)
    return Pretrained(source, folder, folder.name)


def check_data_only(folder: Path, key: str = "net.model") -> None:
    """Refuse a model folder whose loading would run code from it: custom model code, or pickled weights.

    Every ``from_pretrained`` of this project passes ``trust_remote_code=False`` and
    ``use_safetensors=True`` too; this names the problem in one line before transformers reads anything.

    Raises:
        ConfigError: ``config.json`` / ``tokenizer_config.json`` maps the model to Python files in the
            folder (``auto_map``) for a ``model_type`` transformers does not implement, or the weights
            are pickled only (``pytorch_model.bin``, ``.pt``) with no ``.safetensors`` beside them.
    """
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING_NAMES:
            raise ConfigError(
                f"{key}: {folder / name} maps model_type {config.get('model_type')!r} to Python code in the folder "
                "(auto_map), which this project never runs (trust_remote_code=False): use a model transformers "
                "implements, or load it yourself only if you trust that code"
            )
    weights = [file.name for file in folder.iterdir() if file.is_file() and file.name.endswith(WEIGHT_SUFFIXES)]
    pickled = [name for name in weights if name.endswith(PICKLED_SUFFIXES)]
    if pickled and len(pickled) == len(weights):
        raise ConfigError(
            f"{key}: {folder} holds its weights as a pickle ({', '.join(sorted(pickled)[:3])}), which can run code "
            "when loaded: only .safetensors are loaded. Convert them where you trust the file: "
            "`AutoModelForCausalLM.from_pretrained(folder).save_pretrained(new_folder)` writes model.safetensors"
        )


def fingerprint(folder: Path) -> str:
    """SHA-256 over the names and bytes of ``config.json`` and the weight files of ``folder`` (hex).

    Reads every weight file once: about 1 s per GB on one core.
    """
    digest = hashlib.sha256()
    files = [folder / "config.json", *sorted(f for f in folder.iterdir() if f.name.endswith(WEIGHT_SUFFIXES))]
    for file in files:
        digest.update(file.name.encode())
        with file.open("rb") as stream:
            while chunk := stream.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def image_preprocessing(folder: Path, key: str = "data.pretrained") -> dict[str, Any]:
    """How a vision model's images were prepared in pretraining, from its ``preprocessor_config.json``, as
    the image-folder DataModule's settings: ``image_size``, ``crop_size`` (None: no crop), ``mean``, ``std``.

    transformers' image processors store it in one of three shapes (read as data; no processor class
    is loaded): ``size: {height, width}`` (ViT: every image resized to that square), ``size:
    {shortest_edge: S}`` with ``crop_pct`` p (ConvNeXt, ResNet: shorter side to S / p, centre crop S),
    or ``size: {shortest_edge: S}`` with ``crop_size: {height, width}`` (DINOv2, CLIP: shorter side
    to S, centre crop). Mean and std are per channel of pixels in [0, 1] (``do_normalize`` false: 0
    and 1). https://huggingface.co/docs/transformers/main_classes/image_processor

    Raises:
        MissingFileError: the folder has no ``preprocessor_config.json``.
        ConfigError: a size this DataModule cannot reproduce (not square), or pixels not rescaled to [0, 1].
    """
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        raise MissingFileError(
            f"{key}: {folder} has no preprocessor_config.json, which says how its images were prepared in "
            "pretraining (size, crop, mean, std); copy it from the model's hub page or set data.image_size yourself"
        )
    where = f"{key}: {path}"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{where} is not readable JSON ({error}); copy the file again from the model") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where} is not a JSON object; copy the file again from the model")
    if not config.get("do_rescale", True) or abs(config.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-9:
        raise ConfigError(f"{where} does not rescale pixels to [0, 1] (rescale_factor 1/255), as this DataModule does")
    size, crop = config.get("size", {}), config.get("crop_size")
    if isinstance(size, int):  # older processors: one number, the square's side
        size = {"height": size, "width": size}
    if isinstance(crop, int):
        crop = {"height": crop, "width": crop}
    if "height" in size:
        if size["height"] != size.get("width"):
            raise ConfigError(f"{where}: size {size} is not square; this DataModule makes square images")
        image_size, crop_size = size["height"], None
    elif "shortest_edge" in size:
        edge = size["shortest_edge"]
        if not isinstance(edge, int) or edge < 1:
            raise ConfigError(f"{where}: shortest_edge {edge!r} must be whole pixels from 1 to {MAX_IMAGE_SIDE}")
        if config.get("do_center_crop", crop is not None) and crop:
            if crop["height"] != crop.get("width"):
                raise ConfigError(f"{where}: crop_size {crop} is not square; this DataModule crops squares")
            image_size, crop_size = edge, crop["height"]
        elif config.get("crop_pct") and edge < 384:  # ConvNeXt's rule: from 384 px on, no crop
            image_size, crop_size = int(edge / config["crop_pct"]), edge
        elif config.get("crop_pct"):
            image_size, crop_size = edge, None
        else:
            image_size, crop_size = edge, edge  # the shorter side to S, then its centre square
    else:
        raise ConfigError(f"{where}: no size this DataModule understands (height and width, or shortest_edge)")
    if not all(isinstance(side, int) and 0 < side <= MAX_IMAGE_SIDE for side in (image_size, crop_size or 1)):
        raise ConfigError(f"{where}: sizes {image_size}, {crop_size} must be whole pixels from 1 to {MAX_IMAGE_SIDE}")
    normalize = config.get("do_normalize", True)
    mean = [float(v) for v in config.get("image_mean", [0.5] * 3)] if normalize else [0.0] * 3
    std = [float(v) for v in config.get("image_std", [0.5] * 3)] if normalize else [1.0] * 3
    return {"image_size": image_size, "crop_size": crop_size, "mean": mean, "std": std}
