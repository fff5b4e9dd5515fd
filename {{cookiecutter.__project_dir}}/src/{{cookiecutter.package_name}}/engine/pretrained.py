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
import math
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
    # A hub snapshot's files are links into the repository's blobs/ (two folders up): inside it is inside.
    check_data_only(folder, key, root=folder.parent.parent)
    return Pretrained(source, folder, folder.name)


def check_data_only(folder: Path, key: str = "net.model", root: Path | None = None) -> None:
    """Refuse a model folder whose loading would run code from it or read anything outside it.

    Every ``from_pretrained`` of this project passes ``trust_remote_code=False`` and
    ``use_safetensors=True`` too; this names the problem in one line before transformers reads anything.
    Only regular files inside the folder are read: a symlink out of it (``root``: the hub cache's
    repository folder for a snapshot), a FIFO or a device (a read that never ends), and a weight index
    (``model.safetensors.index.json``) naming a file elsewhere are refused.

    Raises:
        ConfigError: ``config.json`` / ``tokenizer_config.json`` maps the model to Python files in the
            folder (``auto_map``) for a ``model_type`` transformers does not implement, the weights
            are pickled only (``pytorch_model.bin``, ``.pt``) with no ``.safetensors`` beside them, or
            a file is not a regular file inside the folder.
    """
    check_files_inside(folder, key, root or folder)
    try:
        from transformers.models.auto import configuration_auto

        implemented = configuration_auto.CONFIG_MAPPING_NAMES
    except ImportError:  # timm's folders without transformers: every auto_map is code to refuse
        implemented = {}

    for name in ("config.json", "tokenizer_config.json"):
        try:
            config = json.loads((folder / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(config, dict) and config.get("auto_map") and config.get("model_type") not in implemented:
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


def check_files_inside(folder: Path, key: str, root: Path) -> None:
    """Every entry of ``folder`` is a regular file (or a folder) that resolves inside ``root``, and every
    shard a ``*.index.json`` names is one of them (see :func:`check_data_only`)."""
    inside = root.resolve()
    for entry in sorted(folder.iterdir()):
        resolved = entry.resolve()
        if not resolved.is_relative_to(inside):
            raise ConfigError(f"{key}: {entry} leads out of {folder} (to {resolved}): only its own files are read")
        if not (resolved.is_file() or resolved.is_dir()):  # a FIFO, a socket, a device
            raise ConfigError(f"{key}: {entry} is not a regular file: only the folder's own files are read")
    for index in sorted(folder.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"{key}: {index} is not a weight index (JSON with a weight_map)") from None
        for shard in sorted(str(name) for name in shards):
            if Path(shard).name != shard or not (folder / shard).is_file():
                raise ConfigError(
                    f"{key}: {index} names the weight file {shard!r}, which is not a file of {folder}: "
                    "only the folder's own files are read"
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


def has_image_preprocessing(folder: Path) -> bool:
    """Whether ``folder`` says how its images were prepared in pretraining (transformers' or timm's file)."""
    return (folder / "preprocessor_config.json").is_file() or _timm_config(folder) is not None


def image_preprocessing(folder: Path, key: str = "data.pretrained") -> dict[str, Any]:
    """How a vision model's images were prepared in pretraining, as the image-folder DataModule's
    settings: ``image_size``, ``crop_size`` (None: no crop), ``mean``, ``std``; from transformers'
    ``preprocessor_config.json`` or else timm's ``config.json`` (its ``pretrained_cfg``), read as data.

    transformers' image processors store it in one of three shapes (no processor class is loaded):
    ``size: {height, width}`` (ViT: every image resized to that square), ``size: {shortest_edge: S}``
    with ``crop_pct`` p (ConvNeXt, ResNet: shorter side to S / p, centre crop S), or ``size:
    {shortest_edge: S}`` with ``crop_size: {height, width}`` (DINOv2, CLIP: shorter side to S, centre
    crop). https://huggingface.co/docs/transformers/main_classes/image_processor. timm's
    ``pretrained_cfg`` gives ``input_size`` [C, S, S] and ``crop_pct`` p: shorter side to floor(S / p),
    centre crop S (``timm.data.create_transform``'s evaluation transform, ``crop_mode`` "center").
    Mean and std are per channel of pixels in [0, 1] (transformers' ``do_normalize`` false: 0 and 1;
    EfficientNet's ``include_top`` divides by std once more: std squared).

    Raises:
        MissingFileError: the folder has neither file.
        ConfigError: a file that is not JSON, a size this DataModule cannot reproduce (not square, not
            whole pixels from 1 to ``MAX_IMAGE_SIDE``, timm's "squash" or "border" crops), or pixels
            not rescaled to [0, 1].
    """
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        timm_config = _timm_config(folder)
        if timm_config is not None:
            return _timm_preprocessing(timm_config, f"{key}: {folder / 'config.json'}")
        raise MissingFileError(
            f"{key}: {folder} has no preprocessor_config.json (transformers) or config.json with a pretrained_cfg "
            "(timm), which say how its images were prepared in pretraining (size, crop, mean, std); copy it "
            "from the model's hub page, or set data.image_size, crop_size, mean and std yourself"
        )
    where = f"{key}: {path}"
    config = json_object(path, where)
    factor = config.get("rescale_factor", 1 / 255)
    rescaled = config.get("do_rescale", True) and not config.get("rescale_offset")
    if not rescaled or not isinstance(factor, int | float) or abs(factor - 1 / 255) > 1e-9:
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
    normalize, image_std = config.get("do_normalize", True), config.get("image_std", [0.5] * 3)
    mean = config.get("image_mean", [0.5] * 3) if normalize else [0.0] * 3
    std = image_std if normalize else [1.0] * 3
    if config.get("include_top") and isinstance(image_std, list) and isinstance(std, list):
        std = [a * b for a, b in zip(std, image_std, strict=False)]  # EfficientNet's: divided by std once more
    return _settings(where, image_size, crop_size, mean, std)


def json_object(path: Path, where: str) -> dict[str, Any]:
    """The JSON object in ``path``, or ConfigError naming ``where`` (not JSON, or not an object)."""
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"{where} is not readable JSON ({error}); copy the file again from the model") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where} is not a JSON object; copy the file again from the model")
    return config


def _timm_config(folder: Path) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg`` from ``folder/config.json`` (a timm hub repository's), or None if it has none."""
    path = folder / "config.json"
    if not path.is_file():
        return None
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # not timm's: image_preprocessing then names the missing file
    return config.get("pretrained_cfg") if isinstance(config, dict) and "architecture" in config else None


def _timm_preprocessing(config: Any, where: str) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: pretrained_cfg is not a JSON object; copy the file again from the model")
    input_size, crop_pct = config.get("input_size"), config.get("crop_pct", 0.875)
    if not (isinstance(input_size, list) and len(input_size) == 3):
        raise ConfigError(f"{where}: pretrained_cfg.input_size {input_size!r} is not [channels, height, width]")
    if input_size[1] != input_size[2]:
        raise ConfigError(f"{where}: input_size {input_size} is not square; this DataModule makes square images")
    if isinstance(crop_pct, bool) or not isinstance(crop_pct, int | float) or not 0.1 <= crop_pct <= 1:
        raise ConfigError(f"{where}: crop_pct {crop_pct!r} must be a number from 0.1 to 1")
    if config.get("crop_mode", "center") != "center":
        raise ConfigError(
            f"{where}: crop_mode {config['crop_mode']!r}: this DataModule reproduces timm's 'center' crop only "
            "(shorter side to input_size / crop_pct, then the centre square); set data.image_size and crop_size "
            "yourself"
        )
    side = input_size[1]
    image_size = math.floor(side / crop_pct) if isinstance(side, int) else side
    return _settings(where, image_size, side, config.get("mean", [0.5] * 3), config.get("std", [0.5] * 3))


def _settings(where: str, image_size: Any, crop_size: Any, mean: Any, std: Any) -> dict[str, Any]:
    """The DataModule's settings, checked: whole pixels within ``MAX_IMAGE_SIDE``, 3 numbers each of mean and std."""
    sides = (image_size, crop_size or 1)
    if not all(isinstance(side, int) and not isinstance(side, bool) and 0 < side <= MAX_IMAGE_SIDE for side in sides):
        raise ConfigError(f"{where}: sizes {image_size}, {crop_size} must be whole pixels from 1 to {MAX_IMAGE_SIDE}")
    for name, values in (("mean", mean), ("std", std)):
        if not (isinstance(values, list) and len(values) == 3 and all(isinstance(v, int | float) for v in values)):
            raise ConfigError(f"{where}: {name} {values!r} is not 3 numbers, one per RGB channel")
    if min(std) <= 0:
        raise ConfigError(f"{where}: std {std} must be above 0 in every channel")
    return {
        "image_size": image_size,
        "crop_size": crop_size,
        "mean": [float(v) for v in mean],
        "std": [float(v) for v in std],
    }


def read_weights(file: Path, architecture: str, key: str = "net.weights") -> dict[str, Any]:
    """A weights file's tensors by name: ``.safetensors``, or a pickle read with ``torch.load(weights_only=True)``
    (PyTorch's restricted unpickler: tensors and plain containers only, no code runs). A checkpoint
    that nests them (``{"state_dict": ...}``, ``{"model": ...}``) is unwrapped.

    Raises:
        MissingFileError: no such file.
        ConfigError: not a weights file, or one that cannot be read without running code.
    """
    import torch

    if not file.is_file():
        raise MissingFileError(f"{key}: {file} does not exist; give the weights file of {architecture}")
    if not file.name.endswith((".safetensors", *PICKLED_SUFFIXES)):
        raise ConfigError(f"{key}: {file} is not a weights file (.safetensors, .pth, .pt, .bin)")
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(file)
        else:
            state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:  # safetensors' and the unpickler's errors share no base class
        raise ConfigError(
            f"{key}: {file} is not a readable weights file ({type(error).__name__}: {str(error)[:200]}); a pickle "
            "that needs code to load is refused: save its state_dict as .safetensors where you trust it"
        ) from None
    for nested in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(nested), dict):
            state = state[nested]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ConfigError(f"{key}: {file} holds no tensors by name (a state_dict); give {architecture}'s weights")
    return state


def load_all_weights(
    model: Any, state: dict[str, Any], file: Path, architecture: str, key: str = "net.weights"
) -> None:
    """Load ``state`` into ``model``, every weight of each or an error: never a half-loaded backbone.

    ``model.load_state_dict(strict=False)`` (what timm's own loader falls back to when the classifier
    differs) would load a file of another model as nothing at all, with a log line at most.

    Raises:
        ConfigError: weights missing from the file, weights the model lacks, or shapes that differ.
    """
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # shapes that differ
        raise ConfigError(f"{key}: {file} does not fit {architecture}: {str(error)[:300]}") from None
    if missing or unexpected:
        raise ConfigError(
            f"{key}: {file} is not {architecture}'s: {len(missing)} of its weights are missing "
            f"({', '.join(missing[:3])}) and {len(unexpected)} unknown ({', '.join(unexpected[:3])})"
        )


def check_preprocessing_fits(net: Any, datamodule: Any) -> None:
    """Refuse to train a pretrained backbone (a net whose ``folder`` says how its images were prepared in
    pretraining) on images prepared otherwise: other sizes or another normalisation would be learnt
    around, silently, instead of using the features the backbone has. Called by ``TrainingModule.setup``
    when fit starts, for every net and DataModule.

    The DataModule says how it prepares images with an ``image_preparation`` property (``image_size``,
    ``crop_size``, ``mean``, ``std``: the image-folder DataModule's); one without it (your own) cannot
    be checked, and the log says what the backbone expects instead.

    Raises:
        ValueError: the DataModule's sizes, mean or std are not the backbone's (names the fix).
    """
    folder = getattr(net, "folder", None)
    if folder is None or datamodule is None or not has_image_preprocessing(folder):
        return
    wanted = image_preprocessing(folder, key="net.model")
    expected = f"{wanted['image_size']} px, crop {wanted['crop_size']}, mean {wanted['mean']}, std {wanted['std']}"
    given = getattr(datamodule, "image_preparation", None)
    if given is None:
        from lightning.pytorch.utilities import rank_zero_info

        rank_zero_info(
            f"net.model {folder} was pretrained on images prepared as {expected}; {type(datamodule).__name__} does "
            "not say how it prepares them (an image_preparation property), so make sure it does the same"
        )
    elif given != wanted:
        raise ConfigError(
            f"net.model {folder} was pretrained on images prepared as its preprocessing file says ({expected}), "
            f"but the data prepares them otherwise ({given['image_size']} px, crop {given['crop_size']}, "
            f"{'its own' if given['mean'] is None else 'another'} mean and std): set data.init_args.pretrained to "
            "the same model as net.model (configs/experiments/transfer-learning.yaml does)"
        )
