"""Per-channel pixel statistics of uint8 images, summed exactly in integers: any image DataModule standardises
with them, over all its images at once or a chunk at a time, with the same result."""

import numpy as np

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["channel_stats", "pixel_sums"]


def pixel_sums(images: np.ndarray) -> np.ndarray:
    """Per channel of uint8 images (N, C, H, W): pixel count, sum and sum of squares, (3, C) int64.

    Integers, so sums of chunks equal the sum of the whole.
    """
    channels = [images[:, c] for c in range(images.shape[1])]  # (N, H, W) uint8 each
    return np.array(
        [
            [channel.size for channel in channels],
            [channel.sum(dtype=np.int64) for channel in channels],
            [np.square(channel, dtype=np.uint16).sum(dtype=np.int64) for channel in channels],  # 255**2 fits
        ],
        dtype=np.int64,
    )


def channel_stats(sums: np.ndarray) -> tuple[list[float], list[float]]:
    """Mean and (unbiased) standard deviation per channel, in [0, 1] units, from :func:`pixel_sums`."""
    count, total, squares = (sums[i].astype(np.float64) for i in range(3))
    mean = total / count
    variance = (squares - total * mean) / np.maximum(count - 1, 1)
    return (mean / 255.0).tolist(), np.maximum(np.sqrt(np.maximum(variance, 0.0)) / 255.0, 1e-6).tolist()
