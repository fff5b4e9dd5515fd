"""How a pretrained image backbone's inputs were prepared in pretraining (size, crop, mean, std), read as
data from its folder: transformers' ``preprocessor_config.json`` or timm's ``config.json``. The
image-folder DataModule prepares images the same way (``data.init_args.pretrained``), and a pretrained
net refuses, when fit starts, data prepared otherwise (:func:`check_preprocessing_fits`).
"""

import json
import math
from pathlib import Path
from typing import Any

from {{ cookiecutter.package_name }}.engine import ConfigError, MissingFileError
from {{ cookiecutter.package_name }}.nets.hub import json_object

MAX_IMAGE_SIDE = 4096  # pixels: a preprocessor_config.json asking for more is refused, not decoded into memory


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
