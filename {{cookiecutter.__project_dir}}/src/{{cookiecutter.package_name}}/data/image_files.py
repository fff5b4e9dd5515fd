"""Image files as inputs (``make predict INPUTS=``, requests to ``make serve``): their bytes from base64
text, opened only in formats whose size Pillow reads from the header, so nothing is decoded before the
size is checked against a limit."""

import base64
import binascii
import io

from PIL import Image, UnidentifiedImageError

from {{ cookiecutter.package_name }}.engine import DataError


def image_file_bytes(text: str, where: str) -> bytes:
    """The bytes of an image file sent as base64 text (a ``data:image/...;base64,`` URL too).

    Raises:
        ValueError: the text is not base64; names ``where``.
    """
    payload = text.split(",", 1)[1] if text.startswith("data:") else text
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise DataError(f"{where} must be an image file (PNG, JPEG, ...) as base64 text; it is not base64") from None


# The formats whose size Pillow reads from the header alone. Others decode on open: an ICO its
# embedded PNG (a 12,900 x 12,900 one took 4.5 s and 0.5 GB before any size check could refuse it),
# WebP its bitstream (44 ms for an 8000 x 8000 one, against 0.2 ms for the same PNG).
HEADER_SIZED_FORMATS = ("PNG", "JPEG", "GIF", "BMP", "TIFF")


def open_image(data: bytes, where: str, max_pixels: int | None = None) -> Image.Image:
    """A Pillow image of file bytes ``data``, its header read; call ``load()`` or ``convert()`` to decode.

    Only :data:`HEADER_SIZED_FORMATS` are opened, so nothing is decoded before the size is checked.

    Raises:
        ValueError: not a file of those formats, or more than ``max_pixels`` pixels (a decompression
            bomb: a few KB of PNG can claim billions); names ``where`` and the limit.
    """
    try:
        image = Image.open(io.BytesIO(data), formats=HEADER_SIZED_FORMATS)
    except Image.DecompressionBombError:
        image = None
    except (OSError, UnidentifiedImageError):
        formats = ", ".join(HEADER_SIZED_FORMATS[:-1]) + f" or {HEADER_SIZED_FORMATS[-1]}"
        raise DataError(
            f"{where} is not a {formats} image file (the formats whose size is read before anything is decoded)"
        ) from None
    if image is None or (max_pixels is not None and image.width * image.height > max_pixels):
        size = f"{image.width}x{image.height} = {image.width * image.height} pixels" if image else "too many pixels"
        raise DataError(f"{where}: an image of {size}; the server takes at most {max_pixels} (--max_image_pixels)")
    return image


def image_file_pixels(text: str, where: str, schema: dict, pixels: int) -> int:
    """``pixels`` plus those of the image file sent as base64 ``text`` (its header read, nothing decoded).

    Raises:
        ValueError: not an image file of :data:`HEADER_SIZED_FORMATS`, more than ``schema["max_image_pixels"]``
            pixels, or more than ``schema["max_request_pixels"]`` in all with the request's earlier images.
    """
    with open_image(image_file_bytes(text, where), where, schema["max_image_pixels"]) as image:
        pixels += image.width * image.height
    budget = schema.get("max_request_pixels")
    if budget is not None and pixels > budget:
        raise DataError(
            f"the images up to {where} hold {pixels} pixels in all; the server decodes at most {budget} "
            "per request (--max_request_pixels): send fewer or smaller images per request"
        )
    return pixels
