"""Why a prepared image data set keeps decoded pixels: bytes per image and samples/s per core, decoded
records against JPEG and PNG files, at the sizes of transfer learning (256 px squares, cropped to 224).

The images are real photographs: the two that scikit-learn ships (``sklearn.datasets.load_sample_images``,
427 x 640), cut into ``--count`` random crops resized to 256 x 256 (the square ``make prepare`` stores
with ``image_size=256, crop_size=224``). For each form, in one process on one core:

- decoded: uint8 (3, 256, 256) records in one file, read back with ``os.pread`` (what
  ``engine.prepared`` does; the file is in the page cache, as a prepared data set read every epoch is);
- JPEG (quality 90) and PNG files: read and decoded with Pillow into the same array.

    python docs/bench_image_records.py --count 400

Prints one JSON line per form and a Markdown table.
"""

import argparse
import io
import json
import os
import tempfile
import time

import numpy as np
from PIL import Image
from sklearn.datasets import load_sample_images

SIZE = 256


def crops(count: int) -> list[Image.Image]:
    """``count`` random square crops of the sample photographs, resized to SIZE x SIZE (bilinear)."""
    rng = np.random.default_rng(0)
    photos = [Image.fromarray(image) for image in load_sample_images().images]
    out = []
    for index in range(count):
        photo = photos[index % len(photos)]
        side = int(rng.integers(200, min(photo.size)))
        left, top = int(rng.integers(0, photo.width - side)), int(rng.integers(0, photo.height - side))
        out.append(photo.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.Resampling.BILINEAR))
    return out


def decoded_rate(images: list[Image.Image], work: str) -> dict:
    record = 3 * SIZE * SIZE
    path = os.path.join(work, "images.bin")
    with open(path, "wb") as file:
        for image in images:
            file.write(np.ascontiguousarray(np.asarray(image).transpose(2, 0, 1)).tobytes())
    descriptor = os.open(path, os.O_RDONLY)
    try:
        for index in range(len(images)):  # warm the page cache, as a second epoch finds it
            os.pread(descriptor, record, index * record)
        start = time.perf_counter()
        for index in range(len(images)):
            pixels = np.frombuffer(os.pread(descriptor, record, index * record), np.uint8).reshape(3, SIZE, SIZE)
        seconds = time.perf_counter() - start
    finally:
        os.close(descriptor)
    assert pixels.shape == (3, SIZE, SIZE)
    return {"form": "decoded record (uint8)", "bytes_per_image": record, "samples_per_s": len(images) / seconds}


def encoded_rate(images: list[Image.Image], form: str, work: str) -> dict:
    paths = []
    for index, image in enumerate(images):
        buffer = io.BytesIO()
        image.save(buffer, format=form, **({"quality": 90} if form == "JPEG" else {}))
        path = os.path.join(work, f"{index}.{form.lower()}")
        with open(path, "wb") as file:
            file.write(buffer.getvalue())
        paths.append(path)
    for path in paths:  # warm the page cache
        with open(path, "rb") as file:
            file.read()
    start = time.perf_counter()
    for path in paths:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB")).transpose(2, 0, 1)
    seconds = time.perf_counter() - start
    assert pixels.shape == (3, SIZE, SIZE)
    size = sum(os.path.getsize(path) for path in paths) / len(paths)
    return {
        "form": f"{form} file (Pillow decode)",
        "bytes_per_image": round(size),
        "samples_per_s": len(images) / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=400)
    options = parser.parse_args()
    images = crops(options.count)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for row in (decoded_rate(images, work), encoded_rate(images, "JPEG", work), encoded_rate(images, "PNG", work)):
            row["samples_per_s"] = round(row["samples_per_s"])
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| form | bytes per image | samples/s per core |")
    print("|---|---|---|")
    for row in rows:
        print(f"| {row['form']} | {row['bytes_per_image']:,} | {row['samples_per_s']:,} |")


if __name__ == "__main__":
    main()
