"""Your own images: a folder of class subfolders of PNG/JPEG files, decoded once into memory, augmented on the device.

``--data={{ cookiecutter.package_name }}.data.ImageFolderDataModule --data.init_args.root=DIR`` is all a
folder needs (``configs/experiments/image-folder.yaml`` lists every setting). Layouts::

    DIR/<class>/<image>               one pool: a seeded, stratified train/val/test split
    DIR/{train,val,test}/<class>/...  the splits given (val and test optional: split from train)
    DIR/[data/]<split>-*.parquet      a Hugging Face image dataset (image and label columns): the splits its
    DIR/<split>/data-*.arrow          files name (train, validation, test; save_to_disk's folders), else one pool
    hf://datasets/<owner>/<name>      a dataset on the Hub, read from the local cache (:mod:`data.hub_datasets`)

Class names, their count and the channel count come from the data when training starts (and are saved in
checkpoints: a trained model keeps them, whatever becomes of the folder): classes are the subfolder names in
sorted order; when the images mix grey and colour, all are converted to RGB (the log says so), else one
channel. Every image is decoded with Pillow (https://pillow.readthedocs.io) and resized to ``image_size`` x
``image_size`` once, in ``setup``, into a uint8 tensor in memory (1,000 RGB images of 64x64 take 12 MB), so
loading a batch is indexing, never decoding; on a GPU the loader then always keeps ahead. Training batches are
augmented on the batch's device with kornia (https://kornia.readthedocs.io: random resized crop, horizontal
flip), then all batches are standardised per channel with the training split's statistics, saved in checkpoints.

**Images at real sizes** (``crop_size``, e.g. ``image_size=256, crop_size=224`` for ImageNet-pretrained
nets{% if cookiecutter.use_pretrained == "yes" %}; ``configs/experiments/transfer-learning.yaml``{% endif %}): the recipe of torchvision's reference training
(https://pytorch.org/vision/stable/models.html; Szegedy et al., 2015, "Going deeper with convolutions",
for the random resized crop). Each image is kept at its aspect ratio, its shorter side resized to
``image_size`` and its centre square kept (Pillow's ``ImageOps.fit``), once, in memory{% if cookiecutter.use_prepared == "yes" %} or in a prepared data set{% endif %};
then training batches get a random resized crop of ``crop_scale`` of that square, resized to
``crop_size``, and a flip, on the device (kornia), and evaluation, prediction{{ ', export and serving' if cookiecutter.use_serving == 'yes' else '' }} take
the centre ``crop_size`` square (:class:`data.image_transforms.CenterCrop`): the region torchvision's
``Resize(image_size)`` + ``CenterCrop(crop_size)`` takes. Training crops come from the stored square,
not the whole original image: what is outside the centre square of a wide image is never seen.
{%- if cookiecutter.use_prepared == "yes" %}

A folder too large for memory is prepared once (``make prepare``: :meth:`ImageFolderDataModule.write_prepared`
decodes and resizes every image on every core into a prepared data set, :mod:`engine.prepared`)
and then trained on with ``data.prepared=FOLDER``: batches are read from disk, memory stays flat in
the folder's size, and resume stays exact. Class names, mode and statistics come from the prepared
data set then; the image folder itself may move away.
{%- endif %}
"""

{% if cookiecutter.use_prepared == "yes" -%}
import os
{% endif -%}
from collections.abc import Sequence
{% if cookiecutter.use_prepared == "yes" -%}
from concurrent.futures import ProcessPoolExecutor
{% endif -%}
from pathlib import Path
from typing import Any

import kornia.augmentation as K
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import nn
from torch.utils.data import TensorDataset

from {{ cookiecutter.package_name }}.data.hub_datasets import local_path
{% if cookiecutter.use_serving == "yes" -%}
from {{ cookiecutter.package_name }}.data.image_files import image_file_bytes, open_image
{% endif -%}
from {{ cookiecutter.package_name }}.data.image_transforms import CenterCrop, Standardize
from {{ cookiecutter.package_name }}.engine import (
    ConfigError,
    DataError,
    MissingFileError,
    ResumableDataModule,
    check_folds,
    check_fractions,
    data_files,
    left_out_note,
    listed,
    split_indices,
{%- if cookiecutter.use_serving == "yes" %}
    stack_samples,
{%- endif %}
    written_by_a_tool,
)
from {{ cookiecutter.package_name }}.engine.image_tables import EncodedImage, image_dataset, opened, table_files
from {{ cookiecutter.package_name }}.engine.images import channel_stats, pixel_sums
{%- if cookiecutter.use_prepared == "yes" %}
from {{ cookiecutter.package_name }}.engine.prepared import (
    NAMES,
    ArrayRecords,
    PreparedWriter,
    fingerprint,
    numbers,
    one_of,
    open_prepared,
    prepare_command,
)
{%- endif %}
{%- if cookiecutter.use_pretrained == "yes" %}
from {{ cookiecutter.package_name }}.nets.hub import locate
from {{ cookiecutter.package_name }}.nets.image_preprocessing import image_preprocessing
{%- endif %}

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
SPLITS = ("train", "val", "test")
Source = Path | EncodedImage  # an image file, or an image a dataset's shard holds


# What to do about an unreadable file in the training data (training, prepare): a setting they take.
TRAINING_FIX = "remove or replace the file, or set data.init_args.skip_unreadable=true"


class ImageFolderDataModule(ResumableDataModule):
    """Images from class subfolders, cached decoded, served as (B, C, H, W) batches (see the module docstring).

    Batches leave the loader as ``(images, labels)``: uint8 (B, C, image_size, image_size) and int64
    (B,); after the copy to the device (``transform_batch``) images are float32, augmented in training,
    cropped to (B, C, crop_size, crop_size) with ``crop_size``, and standardised per channel.

    Args:
        root: the image folder, or a Hugging Face image dataset's shards or address (layouts: the module docstring).
        image_column, label_column: a dataset's columns of images and labels (:mod:`engine.image_tables`).
        image_size: side in pixels every image is resized to (bilinear): stretched to a square, or,
            with ``crop_size``, its shorter side, keeping the centre square. Raw inputs of predict{{ ',' if cookiecutter.use_serving == 'yes' else '' }}
            {{ 'export and serve ' if cookiecutter.use_serving == 'yes' else '' }}are (C, image_size, image_size).
        crop_size: side in pixels of what the net sees, cut from the ``image_size`` square: a random
            resized crop in training (with ``augment``), the centre crop otherwise; None: the whole square.
        crop_scale: the share of the square's area a training crop covers, (lowest, highest):
            torchvision's (0.08, 1.0) by default; (0.35, 1.0) is gentler for small data.
        augment: random resized crop (scale 0.8 to 1, or ``crop_scale`` with ``crop_size``) and, with
            ``horizontal_flip``, a random mirror of training batches; False for none.
        horizontal_flip: mirror half the training images (wrong for text or digits).
        val_fraction, test_fraction: shares held out when the folder has no such split.
        split_seed: seed of the split, independent of the training seed.
        num_folds, fold: k-fold cross-validation{{ " (``make cv``)" if cookiecutter.use_sweeps == "yes" and cookiecutter.task != "language-model" else "" }}: validate on fold ``fold`` (from 0) of ``num_folds``
            of the training images (not with a ``val/`` folder); None: ``val_fraction``.
        skip_unreadable: leave out files Pillow cannot read (broken, truncated, decompression
            bombs) instead of stopping, in ``root`` and in ``INPUTS=``; one log line counts them
            and names the first ten.
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: a folder ``make prepare`` wrote from this image folder: read from disk instead of
            decoding ``root`` into memory (``image_size`` must be the one it was prepared with).
{%- endif %}
        batch_size, num_workers, pin_memory, persistent_workers: see :class:`engine.ResumableDataModule`.
{%- if cookiecutter.use_pretrained == "yes" %}
        pretrained: the folder or hub id (local cache) of the pretrained backbone (``net.model`` of
            ``nets.HFImageClassifier`` or ``nets.TimmNet``): its ``preprocessor_config.json``
            (transformers) or its ``config.json``'s ``pretrained_cfg`` (timm) sets ``image_size``,
            ``crop_size`` and the per-channel mean and std (in place of the training split's), as the
            backbone saw images in pretraining (:func:`nets.image_preprocessing.image_preprocessing`), and
            images are RGB. The checkpoint keeps them for predict{{ ', export and serve' if cookiecutter.use_serving == 'yes' else '' }}.
        mean, std: per-channel mean and standard deviation of pixels in [0, 1] that a backbone was
            pretrained with, in place of the training split's (for weights that come without a
            preprocessing file, such as torchvision's: ImageNet's ``[0.485, 0.456, 0.406]`` and
            ``[0.229, 0.224, 0.225]``); 3 values each (images become RGB) or 1 (grey). Set with
            ``image_size`` and ``crop_size``; ``pretrained`` sets all four instead.
{%- endif %}

    Raises:
        ValueError: ``image_size`` below 4, ``crop_size`` larger than ``image_size``, ``crop_scale``
            not within (0, 1]{{ ', ``mean`` without ``std`` (or beside ``pretrained``),' if cookiecutter.use_pretrained == "yes" else "" }}
{%- if cookiecutter.use_pretrained == "yes" %}
            of other lengths or with a ``std`` not above 0
{%- endif %}
            (named when the config is read); ``root`` is missing, holds no images or a single class, a class
            folder has too few images to split, or (without ``skip_unreadable``) a file is not a readable image;
            the message names the folder or the file and the fix.
    """

    def __init__(
        self,
        root: str = "data/images",
        image_column: str = "image",
        label_column: str = "label",
        image_size: int = 32,
        crop_size: int | None = None,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        augment: bool = True,
        horizontal_flip: bool = True,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_folds: int | None = None,
        fold: int = 0,
        skip_unreadable: bool = False,
{%- if cookiecutter.use_prepared == "yes" %}
        prepared: str | None = None,
{%- endif %}
        batch_size: int = 64,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
{%- if cookiecutter.use_pretrained == "yes" %}
        pretrained: str | None = None,
        mean: list[float] | None = None,
        std: list[float] | None = None,
{%- endif %}
    ) -> None:
        super().__init__(batch_size, num_workers, pin_memory, persistent_workers)
        check_fractions(val_fraction, test_fraction)
        check_folds(num_folds, fold)
{%- if cookiecutter.use_prepared == "yes" %}
        if prepared is not None and num_folds is not None:
            raise ConfigError("data.num_folds: a prepared folder keeps the splits it was prepared with; use data.root")
{%- endif %}
{%- if cookiecutter.use_pretrained == "yes" %}
        self.pretrained_stats = given_stats(mean, std, pretrained)
        if pretrained is not None:  # sizes and statistics the backbone was pretrained with, in place of the data's
            preprocessing = image_preprocessing(locate(pretrained, key="data.pretrained").folder)
            image_size, crop_size = preprocessing["image_size"], preprocessing["crop_size"]
            self.pretrained_stats = (preprocessing["mean"], preprocessing["std"])
{%- endif %}
        if image_size < 4:
            raise ConfigError(f"data.image_size must be at least 4 pixels, got {image_size}")
        if crop_size is not None and not 4 <= crop_size <= image_size:
            raise ConfigError(
                f"data.crop_size={crop_size} must be between 4 and data.image_size={image_size} pixels: the crop "
                "is cut from the image_size square; raise image_size or lower crop_size"
            )
        if not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise ConfigError(
                f"data.crop_scale={list(crop_scale)} must be [lowest, highest] with 0 < lowest <= highest <= 1"
            )
        self.save_hyperparameters()
{%- if cookiecutter.use_pretrained == "yes" %}
        if pretrained is not None:  # LightningCLI gives hparams the config's values: set the backbone's
            self.hparams.image_size, self.hparams.crop_size = image_size, crop_size
{%- endif %}
        # Found by scanning root when first asked (the CLI asks while it builds the model), or
        # restored from a checkpoint (load_state_dict), which then never rescans for inference.
        self.files: dict[str, list[tuple[Source, int]]] | None = None
        self._class_names: list[str] | None = None
        self._mode: str | None = None
        self.mean: list[float] | None = None  # per channel, of the training split in [0, 1]
        self.std: list[float] | None = None
        self._stats_on_device: tuple[tuple, torch.Tensor] | None = None  # (device, mean, std) -> (2, 1, C, 1, 1)
        self.skipped: list[Path] = []  # files left out by skip_unreadable, not yet logged
        self.augmentation = None
        self.center_crop = CenterCrop(crop_size) if crop_size is not None else None
        if augment:
            crop, scale = (crop_size, tuple(crop_scale)) if crop_size is not None else (image_size, (0.8, 1.0))
            steps = [K.RandomResizedCrop((crop, crop), scale=scale)]
            steps += [K.RandomHorizontalFlip()] if horizontal_flip else []
            self.augmentation = K.AugmentationSequential(*steps)

    # ---- what the CLI links to the model --------------------------------------------------------
    @property
    def class_names(self) -> list[str]:
        """Class names in label order: the checkpoint's, or the sorted class folders of ``root``."""
        if self._class_names is None:
            self._find_files()
        return self._class_names

    @property
    def mode(self) -> str:
        """Pillow mode every image is converted to: "L" (grey) or "RGB"; the checkpoint's, or the folder's."""
        if self._mode is None:
            self._find_files()
        return self._mode

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_channels(self) -> int:
        return 3 if self.mode == "RGB" else 1
{%- if cookiecutter.use_pretrained == "yes" %}

    @property
    def image_preparation(self) -> dict[str, Any]:
        """How images reach the net: ``image_size``, ``crop_size``, and the ``mean`` and ``std`` given by
        ``pretrained`` or the config (None: the training split's). What a pretrained net is checked against
        (:func:`nets.image_preprocessing.check_preprocessing_fits`)."""
        mean, std = self.pretrained_stats or (None, None)
        return {"image_size": self.hparams.image_size, "crop_size": self.hparams.crop_size, "mean": mean, "std": std}
{%- endif %}

    def _find_files(self) -> None:
        """Scan ``root`` once; a model restored from a checkpoint keeps its own class names and mode.
{%- if cookiecutter.use_prepared == "yes" %}

        With ``prepared`` the prepared data set's manifest gives them instead (``root`` may be gone).
{%- endif %}

        Raises:
            ValueError: the folder's class folders are not the ones the model was trained on.
        """
{%- if cookiecutter.use_prepared == "yes" %}
        if self.hparams.prepared is not None:
            if self._class_names is None:
                state = self._open_prepared().state
                self._class_names, self._mode = state["class_names"], state["mode"]
            return
{%- endif %}
        if self.files is not None:
            return
        files, class_names, mode = self._scan(local_path(self.hparams.root, "data.root"))
        if self._class_names is not None and class_names != self._class_names:
            raise DataError(
                f"data.root={self.hparams.root}: class folders {class_names} are not the classes this model was "
                f"trained on {self._class_names}; restore them, or predict on files (INPUTS=), which needs no folder"
            )
{%- if cookiecutter.use_pretrained == "yes" %}
        # A pretrained backbone's filters see what it was trained on: colour, or grey with one mean and std.
        stats = self.pretrained_stats
        pretrained_mode = None if stats is None else "L" if len(stats[0]) == 1 else "RGB"
        self.files, self._class_names, self._mode = files, class_names, self._mode or pretrained_mode or mode
{%- else %}
        self.files, self._class_names, self._mode = files, class_names, self._mode or mode
{%- endif %}

    # ---- finding the files (headers only: cheap, and every bad file is named before training) -------
    def _scan(self, root: Path) -> tuple[dict[str, list[tuple[Source, int]]], list[str], str]:
        tables = table_files(root)
        if tables:
            found, class_names = image_dataset(root, tables, self.hparams.image_column, self.hparams.label_column)
        else:
            found, class_names = self._class_folders(root)
        files: dict[str, list[tuple[Source, int]]] = {}
        modes: set[str] = set()
        for split, items in found.items():
            files[split] = []
            for source, label in items:
                try:
                    modes.add(_image_mode(source))
                except DataError:
                    if not self.hparams.skip_unreadable:
                        raise
                    self.skipped.append(source)
                    continue
                files[split].append((source, label))
        pool = files.get("train", files.get("all", []))
        if not pool:
            readable = " readable" if self.skipped else ""
            raise DataError(f"data.root={root}: no{readable} images ({', '.join(IMAGE_SUFFIXES)}) in the class folders")
        empty = [name for label, name in enumerate(class_names) if all(y != label for _, y in pool)]
        if empty:
            raise DataError(f"data.root={root}: class(es) {empty} hold no images; add images or remove them")
        mode = "RGB" if modes - {"L"} else "L"
        if len(modes) > 1:
            rank_zero_info(f"data.root={root}: images of modes {sorted(modes)}: all converted to {mode}")
        return files, class_names, mode

    def _class_folders(self, root: Path) -> tuple[dict[str, list[tuple[Source, int]]], list[str]]:
        """Each split's (image file, label), and the class names: the sorted class folders."""
        if not root.is_dir():
            raise DataError(f"data.root={root}: no such folder; give a folder of class subfolders of images")
        given = [name for name in SPLITS if (root / name).is_dir()]
        pools = {name: root / name for name in given} if "train" in given else {"all": root}
        folders = pools.get("train", root).iterdir()
        class_names = sorted(p.name for p in folders if p.is_dir() and not written_by_a_tool(Path(p.name)))
        if len(class_names) < 2:
            raise DataError(
                f"data.root={pools.get('train', root)}: {len(class_names)} class folder(s) found; give one "
                "subfolder of images per class, at least two classes (or a dataset's Parquet or Arrow shards)"
            )
        found: dict[str, list[tuple[Source, int]]] = {}
        for split, folder in pools.items():
            found[split] = [
                (path, y) for y, name in enumerate(class_names) for path in data_files(folder / name, IMAGE_SUFFIXES)
            ]
        return found, class_names

    # ---- decoding, splitting, statistics --------------------------------------------------------
    def setup(self, stage: str | None = None) -> None:
        """Decode every image once, split, and measure the training split's statistics (idempotent).
{%- if cookiecutter.use_prepared == "yes" %}

        With ``prepared``: open the prepared data set (checked: :func:`engine.prepared.open_prepared`) instead.
        """
{%- else %}"""{% endif %}
        if self.train_set is not None:
            return
        if stage == "predict" and self.predict_set is not None:
            return  # your own inputs (use_inputs): the training folder is not needed
{%- if cookiecutter.use_prepared == "yes" %}
        if self.hparams.prepared is not None:
            prepared = self._open_prepared()
            self._class_names, self._mode = prepared.state["class_names"], prepared.state["mode"]
            self.mean, self.std = {{ "self.pretrained_stats or " if cookiecutter.use_pretrained == "yes" else "" }}(prepared.state["mean"], prepared.state["std"])
            splits = {split: prepared.split(split) for split in SPLITS}
            self.train_set, self.val_set, self.test_set = (
                ArrayRecords(splits[split]["images"], splits[split]["labels"]) for split in SPLITS
            )
            self.check_batch_size()
            return
{%- endif %}
        parts = self._split_parts()
        decoded = {split: self._decode(items)[:2] for split, items in parts.items()}
        self._report_skipped(f"data.root={self.hparams.root}")
        if rank_zero_only.rank == 0:  # other processes would stat every file for a line they do not print
            rank_zero_info(self._read_report(parts))
        self.mean, self.std = {{ "self.pretrained_stats or " if cookiecutter.use_pretrained == "yes" else "" }}channel_stats(pixel_sums(decoded["train"][0].numpy()))
        self.train_set, self.val_set, self.test_set = (TensorDataset(*decoded[split]) for split in SPLITS)
        self.check_batch_size()

    def _split_parts(self) -> dict[str, list[tuple[Source, int]]]:
        """The files of each split: the folder's own splits, and seeded, stratified cuts of its pool (the
        whole folder, or ``train/``) for the splits it lacks."""
        self._find_files()
        hp = self.hparams
        if hp.num_folds is not None and "val" in self.files:
            raise ConfigError(f"data.num_folds: {hp.root} has its own val/ folder; move its images into train/")
        parts = dict(self.files)
        pool = parts.pop("all", None) or parts["train"]
        cut = [split for split in ("val", "test") if split not in parts]
        if cut:
            labels = np.array([label for _, label in pool])
            counts = np.bincount(labels, minlength=self.num_classes)
            if counts.min() <= len(cut):  # each cut takes one image of each class, and training keeps one
                rare = [self.class_names[i] for i in np.flatnonzero(counts <= len(cut))]
                few = f"fewer than {len(cut) + 1} images"
                raise DataError(f"data.root: class folder(s) {rare} have {few}, too few to split")
            folds = (hp.num_folds, hp.fold)
            rows = split_indices(labels, len(pool), hp.val_fraction, hp.test_fraction, hp.split_seed, *folds, cut=cut)
            parts.update({split: [pool[i] for i in rows[split]] for split in rows})
        return parts
{%- if cookiecutter.use_prepared == "yes" %}

    # ---- a prepared data set: decoded once, on every core, read from disk ---------------------------
    def _open_prepared(self):
        """The checked prepared data set (its source, when still at its place, must be unchanged), opened once."""
        if getattr(self, "_prepared", None) is None:
            prepared = open_prepared(
                self.hparams.prepared,
                type(self).__name__,
                self._prepared_settings(),
                source_files,
                source=self.hparams.root,
                fields={"images": ("|u1",), "labels": ("<i8",)},
                state={
                    "class_names": NAMES,
                    "mode": one_of("L", "RGB"),
                    "mean": numbers(),
                    "std": numbers(positive=True),
                },
                splits=SPLITS,
            )
            prepared.check_below("labels", len(prepared.state["class_names"]), "the number of classes")
            channels = 1 if prepared.state["mode"] == "L" else 3
            for key in ("mean", "std"):
                value = prepared.state[key]
                if value is not None and len(value) != channels:
                    remake = prepare_command(type(self).__name__)
                    raise DataError(
                        f"data.prepared={self.hparams.prepared}: state.{key} has {len(value)} values for "
                        f"{prepared.state['mode']} images of {channels} channel(s); run `{remake}`"
                    )
            self._prepared = prepared
        return self._prepared

    def _prepared_settings(self) -> dict[str, Any]:
        hp = self.hparams
        # crop_size decides how images became squares (stretched, or fitted: see resize).
        return {"image_size": hp.image_size, "crop_size": hp.crop_size, "val_fraction": hp.val_fraction,
                "test_fraction": hp.test_fraction, "split_seed": hp.split_seed}  # fmt: skip
{%- endif %}

    @property
    def resize(self) -> str:
        """How images become ``image_size`` squares: ``stretch``; with ``crop_size``, ``fit`` (see :func:`resized`)."""
        return "stretch" if self.hparams.crop_size is None else "fit"
{%- if cookiecutter.use_prepared == "yes" %}

    def write_prepared(self, out: str | Path, workers: int | None = None, chunk: int = 256) -> dict[str, Any]:
        """Decode and resize every image of ``root`` once, on ``workers`` processes (default: every
        core), into a prepared data set at ``out``: uint8 images (N, C, H, W) and int64 labels (N,)
        per split, with the class names, mode and the training split's per-channel mean and std.

        Memory holds ``workers * chunk`` images at a time, whatever the folder's size. Unreadable
        files stop it, or with ``skip_unreadable`` are left out and counted.

        Returns:
            the manifest's counts: ``{split: images}`` and ``skipped``.

        Raises:
            ValueError: see :meth:`setup`'s folder errors; a write that fails (nothing is left at ``out``).
        """
        parts = self._split_parts()
        size, mode, resize = self.hparams.image_size, self.mode, self.resize
        workers = workers or os.cpu_count() or 1
        sums = np.zeros((3, self.num_channels), dtype=np.int64)  # exact: see pixel_sums
        skipped = 0
        root = local_path(self.hparams.root, "data.root")
        source = fingerprint(root, source_files(root))
        kind = type(self).__name__
        with (
            PreparedWriter(out, kind, self._prepared_settings(), source) as writer,
            ProcessPoolExecutor(workers) as pool,
        ):
            for split in SPLITS:
                items = parts[split]
                chunks = [items[i : i + chunk] for i in range(0, len(items), chunk)]
                jobs = pool.map(_decode_chunk, chunks, [mode] * len(chunks), [size] * len(chunks),
                                [resize] * len(chunks), [self.hparams.skip_unreadable] * len(chunks))  # fmt: skip
                for images, labels, left_out in jobs:
                    skipped += len(left_out)
                    self.skipped += left_out
                    writer.append(split, images=images, labels=labels)
                    if split == "train":
                        sums += pixel_sums(images)
            self.mean, self.std = {{ "self.pretrained_stats or " if cookiecutter.use_pretrained == "yes" else "" }}channel_stats(sums)
            writer.state(class_names=self.class_names, mode=mode, mean=self.mean, std=self.std, skipped=skipped)
            self._report_skipped(f"data.root={self.hparams.root}")
        return {split: writer.manifest["splits"][split]["count"] for split in SPLITS} | {"skipped": skipped}
{%- endif %}

    def _decode(
        self, items: Sequence[tuple[Source, int]], fix: str = TRAINING_FIX
    ) -> tuple[torch.Tensor, torch.Tensor, list[tuple[Source, int]]]:
        """(images (N, C, H, W) uint8, labels (N,), the N items decoded); with skip_unreadable N may be fewer.
        An unreadable file stops it with ``fix``, the advice that fits the command that reads it."""
        size = self.hparams.image_size
        images = torch.empty(len(items), self.num_channels, size, size, dtype=torch.uint8)
        kept: list[tuple[Source, int]] = []
        for path, label in items:
            try:
                with Image.open(opened(path)) as image:
                    images[len(kept)] = self._pixels(image)
            except UNREADABLE as error:
                if not self.hparams.skip_unreadable:
                    raise unreadable(path, error, fix) from None
                self.skipped.append(path)
                continue
            kept.append((path, label))
        labels = torch.tensor([label for _, label in kept], dtype=torch.int64)
        return (images if len(kept) == len(items) else images[: len(kept)].clone()), labels, kept

    def _pixels(self, image: Image.Image) -> torch.Tensor:
        """An opened image as the model takes it: converted to ``mode``, resized (bilinear), (C, H, W) uint8."""
        return torch.from_numpy(resized(image, self.mode, self.hparams.image_size, self.resize))

    def _read_report(self, parts: dict[str, list[tuple[Source, int]]]) -> str:
        """What training reads: files, bytes, classes, where each split came from, images per class.

        For example::

            Images of data.root=photos: 412 files (18.3 MB), 3 classes, decoded as RGB at 64 px
              splits: train 330 (train/ less the cuts), val 41, test 41 (seeded stratified cuts of train/, split_seed=0)
              images per class (train/val/test): cat 110/14/14, dog 111/13/14, fox 109/14/13
        """
        hp = self.hparams
        sources = [source for items in parts.values() for source, _ in items]
        shards, files = isinstance(sources[0], EncodedImage), len(sources)
        size = sum(len(x.data) if isinstance(x, EncodedImage) else x.stat().st_size for x in sources) / 1e6
        given = [split for split in SPLITS if split in self.files]
        cut = [split for split in SPLITS if split not in self.files]
        named = (lambda split: f"the {split} shards") if shards else (lambda split: f"{split}/")
        pool = ("the dataset" if shards else "the folder") if "all" in self.files else named("train")
        less = " less the cuts" if cut else ""
        origins = [f"{split} {len(parts[split])} ({named(split)}{less if split == 'train' else ''})" for split in given]
        if cut:
            counted = ", ".join(f"{split} {len(parts[split])}" for split in cut)
            origins.append(f"{counted} (seeded stratified cuts of {pool}, split_seed={hp.split_seed})")
        counts = {
            split: np.bincount([y for _, y in items], minlength=self.num_classes) for split, items in parts.items()
        }
        per_class = [
            f"{name} {'/'.join(str(counts[split][label]) for split in SPLITS)}"
            for label, name in enumerate(self.class_names)
        ]
        return (
            f"Images of data.root={hp.root}: {files} {'images' if shards else 'files'} ({size:.1f} MB)"
            f"{left_out_note(local_path(hp.root, 'data.root'), IMAGE_SUFFIXES)}, {self.num_classes} classes, "
            f"decoded as {self.mode} at {hp.image_size} px\n"
            f"  splits: {', '.join(origins)}\n"
            f"  images per class (train/val/test): {listed(per_class)}"
        )

    def _report_skipped(self, where: str) -> None:
        """One log line for the files skip_unreadable left out since the last report: their count, the first ten."""
        if not self.skipped:
            return
        named = ", ".join(str(path) for path in self.skipped[:10])
        more = f" and {len(self.skipped) - 10} more" if len(self.skipped) > 10 else ""
        rank_zero_info(
            f"{where}: left out {len(self.skipped)} unreadable file(s) (data.skip_unreadable): {named}{more}"
        )
        self.skipped = []

    # ---- on the device: augmentation and normalisation of whole batches ----------------------------
    def transform_batch(self, batch: Any, training: bool) -> Any:
        images, *rest = batch  # (B, C, H, W) uint8
        images = images.float() / 255.0
        if training and self.augmentation is not None:
            images = self.augmentation(images)  # with crop_size: (B, C, crop_size, crop_size)
        elif self.center_crop is not None:
            images = self.center_crop(images)
        return (self.normalize(images), *rest)

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """Standardise float images (B, C, H, W) in [0, 1] per channel with the training split's statistics.

        Raises:
            RuntimeError: before :meth:`setup` (or loading a checkpoint) measured the statistics.
        """
        if self.mean is None or self.std is None:
            raise RuntimeError("ImageFolderDataModule.normalize needs the train statistics: call setup() first")
        # Made once per device, not per batch: a tensor from a list is a host-to-device copy (a sync on CUDA).
        key = (images.device, tuple(self.mean), tuple(self.std))
        if self._stats_on_device is None or self._stats_on_device[0] != key:
            stats = torch.tensor([self.mean, self.std], device=images.device).view(2, 1, -1, 1, 1)
            self._stats_on_device = (key, stats)
        mean, std = self._stats_on_device[1]
        return (images - mean) / std

    # ---- inference: 8-bit pixels at image_size, as _decode makes them ------------------------------
    def inference_transform(self) -> nn.Module:
        """Raw images (B, C, image_size, image_size), pixel values 0-255 -> the standardised images the net
        trained on, centre-cropped to (B, C, crop_size, crop_size) with ``crop_size``."""
        if self.mean is None or self.std is None:
            raise RuntimeError(
                "ImageFolderDataModule.inference_transform needs the train statistics: call setup() first"
            )
        standardize = Standardize(self.mean, self.std, scale=1.0 / 255.0)
        return standardize if self.center_crop is None else nn.Sequential(self.center_crop, standardize)
{%- if cookiecutter.use_serving == "yes" %}

    def raw_inputs(self, split: str = "test") -> tuple[torch.Tensor, torch.Tensor]:
        """Images (N, C, image_size, image_size) float32 0-255 of ``split`` and their labels (N,)."""
        images, labels = stack_samples({"train": self.train_set, "val": self.val_set, "test": self.test_set}[split])
        return images.float(), labels

    def raw_description(self) -> str:
        size, crop = self.hparams.image_size, self.hparams.crop_size
        how = f"resized to {size}x{size} (bilinear)"
        if crop is not None:
            how = f"shorter side resized to {size} (bilinear), centre square kept; the model crops {crop}x{crop}"
        return f"{self.mode} images {how}, channels first, pixel values 0-255"

    def request_schema(self) -> dict[str, Any]:
        size = self.hparams.image_size
        shape = [self.num_channels, size, size]
        return {"kind": "array", "shape": shape, "min": 0.0, "max": 255.0, "image_files": True}

    def inputs_from_json(self, inputs: list[Any]) -> torch.Tensor:
        """Raw images (B, C, H, W) float32 0-255 from a request: each a nested list as the model takes it,
        or an image file as base64 text, decoded and resized as ``INPUTS=`` files are.

        Raises:
            ValueError: an image file that Pillow cannot decode (its header passed the server's check).
        """
        images = []
        for index, item in enumerate(inputs):
            if not isinstance(item, str):
                images.append(torch.tensor(item, dtype=torch.float32))
                continue
            where = f"inputs[{index}]"
            try:
                with open_image(image_file_bytes(item, where), where) as image:
                    images.append(self._pixels(image).float())
            except UNREADABLE as error:  # a header that promises more than the file holds
                raise DataError(f"{where}: the image file does not decode ({error})") from None
        return torch.stack(images)
{%- endif %}

    def read_inputs(self, path: str) -> tuple[list[str], torch.Tensor]:
        """Every image under folder ``path`` (or one image file), decoded and resized as in training.

        Ids are the paths relative to ``path``.

        Raises:
            FileNotFoundError: no such file or folder.
            ValueError: no (readable) image in it, or, without ``skip_unreadable``, a file that is not
                a readable image.
        """
        root = Path(path)
        if not root.exists():
            raise MissingFileError(f"INPUTS={path}: no such file or folder of images")
        files = [root] if root.is_file() else data_files(root, IMAGE_SUFFIXES)
        if not files:
            raise DataError(f"INPUTS={path}: no images ({', '.join(IMAGE_SUFFIXES)})")
        fix = f"remove or replace the file in INPUTS={path}"  # predict takes no data settings
        images, _, kept = self._decode([(file, 0) for file in files], fix=fix)
        self._report_skipped(f"INPUTS={path}")
        if not kept:
            raise DataError(f"INPUTS={path}: no readable images")
        ids = [file.name if root.is_file() else file.relative_to(root).as_posix() for file, _ in kept]
        return ids, images.float()

    def state_dict(self) -> dict[str, Any]:
        """Class names, mode and statistics (for inference) and, from the base, where a resumed run's data starts."""
        stats = {"class_names": self.class_names, "mode": self.mode, "mean": self.mean, "std": self.std}
        sizes = {"image_size": self.hparams.image_size, "crop_size": self.hparams.crop_size}
        return {**super().state_dict(), **stats, **sizes}
{%- if cookiecutter.use_pretrained == "yes" %}

    def _sizes(self) -> tuple[int, int | None]:
        return self.hparams.image_size, self.hparams.crop_size
{%- endif %}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the classes, mode and statistics the model was trained with: inference never rescans the folder."""
        super().load_state_dict(state_dict)
{%- if cookiecutter.use_pretrained == "yes" %}
        trained_at = (state_dict.get("image_size"), state_dict.get("crop_size"))
        if self.hparams.pretrained is not None and "image_size" in state_dict and trained_at != self._sizes():
            raise ConfigError(
                f"data.pretrained={self.hparams.pretrained}: its preprocessing file now gives image_size and "
                f"crop_size {self._sizes()}, but the model was trained at {trained_at}: restore that folder's file"
            )
{%- endif %}
        self.mean, self.std = state_dict["mean"], state_dict["std"]
        self._class_names, self._mode = list(state_dict["class_names"]), state_dict["mode"]
{%- if cookiecutter.use_pretrained == "yes" %}


def given_stats(
    mean: list[float] | None, std: list[float] | None, pretrained: str | None
) -> tuple[list[float], list[float]] | None:
    """``(mean, std)`` given in the config, checked; None to use the training split's (or ``pretrained``'s).

    Raises:
        ValueError: one without the other, beside ``pretrained``, not 1 or 3 values each, or a std not above 0.
    """
    if mean is None and std is None:
        return None
    if pretrained is not None:
        raise ConfigError(
            "data.mean and data.std come from data.pretrained's preprocessing file: set pretrained, or mean and std"
        )
    if mean is None or std is None or len(mean) != len(std) or len(mean) not in (1, 3):
        raise ConfigError(
            f"data.mean={mean} and data.std={std} must both be given, 3 values each (RGB) or 1 (grey): "
            "the per-channel statistics of pixels in [0, 1] the backbone was pretrained with"
        )
    if min(std) <= 0:
        raise ConfigError(f"data.std={std} must be above 0 in every channel")
    return [float(v) for v in mean], [float(v) for v in std]
{%- endif %}


def resized(image: Image.Image, mode: str, size: int, resize: str = "stretch") -> np.ndarray:
    """``image`` converted to ``mode`` and made ``size`` x ``size`` (bilinear): (C, H, W) uint8.

    ``resize="stretch"`` resizes the whole image to the square; ``"fit"`` keeps the aspect ratio: the
    shorter side resized to ``size``, the centre square kept (torchvision's ``Resize(size)`` then
    ``CenterCrop(size)``, through Pillow's ``ImageOps.fit``).
    """
    image = image.convert(mode)
    if resize == "fit":
        image = ImageOps.fit(image, (size, size), Image.Resampling.BILINEAR)
    else:
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    pixels = np.array(image)  # a writable copy: torch.from_numpy warns on read-only arrays
    return np.ascontiguousarray(pixels.reshape(size, size, -1).transpose(2, 0, 1))
{%- if cookiecutter.use_prepared == "yes" %}


def _decode_chunk(
    items: Sequence[tuple[Source, int]], mode: str, size: int, resize: str, skip_unreadable: bool
) -> tuple[np.ndarray, np.ndarray, list[Path]]:
    """Prepare's work in one process: images (N, C, size, size) uint8, labels (N,) int64, files left out."""
    images, labels, left_out = [], [], []
    for path, label in items:
        try:
            with Image.open(opened(path)) as image:
                images.append(resized(image, mode, size, resize))
        except UNREADABLE as error:
            if not skip_unreadable:
                raise unreadable(path, error) from None
            left_out.append(path)
            continue
        labels.append(label)
    channels = 3 if mode == "RGB" else 1
    stacked = np.stack(images) if images else np.zeros((0, channels, size, size), np.uint8)
    return stacked, np.asarray(labels, dtype=np.int64), left_out
{%- endif %}


{%- if cookiecutter.use_prepared == "yes" %}


def source_files(root: Path) -> list[Path]:
    """The files a data set at ``root`` is read from: a dataset's shards, else the image files of its folders."""
    return table_files(root) or data_files(root, IMAGE_SUFFIXES)
{%- endif %}


def _image_mode(path: Source) -> str:
    """'L' for grey images, 'RGB' for anything with colour; reads the header only.

    Raises:
        ValueError: the file is not an image Pillow can identify, or claims more pixels than
            ``PIL.Image.MAX_IMAGE_PIXELS`` allows (a decompression bomb); names it and the fix.
    """
    try:
        with Image.open(opened(path)) as image:
            mode = image.mode
    except UNREADABLE as error:
        raise unreadable(path, error) from None
    return "L" if mode in ("1", "L", "I", "I;16", "F") else "RGB"


# What Pillow raises for a file it will not decode; DecompressionBombError is none of the others.
UNREADABLE = (OSError, UnidentifiedImageError, Image.DecompressionBombError)


def unreadable(path: Path, error: Exception, fix: str = TRAINING_FIX) -> DataError:
    """The one-line error naming ``path`` for an ``UNREADABLE`` error of Pillow, and ``fix``."""
    if isinstance(error, Image.DecompressionBombError):  # a few KB of PNG can claim billions of pixels
        return DataError(
            f"{path}: {error.args[0].split(',')[0]}, Pillow's guard against decompression bombs; {fix} "
            "(or raise PIL.Image.MAX_IMAGE_PIXELS if you trust it)"
        )
    return DataError(f"{path}: not a readable image ({error}); {fix}")
