"""Image preprocessing as plain tensor operations, exportable inside a model graph: scale and standardize, centre crop.

The DataModules' ``inference_transform`` builds the same module that evaluation applies, so a
prediction{{ ', an export or a request' if cookiecutter.use_serving == 'yes' else '' }} is preprocessed exactly as the test split was.
"""

import torch
from torch import nn


class Standardize(nn.Module):
    """``(inputs * scale - mean) / std`` per channel (dim 1) or for the whole tensor: an exportable normalisation.

    Args:
        mean, std: a number, or one per channel (C,) for inputs (B, C, ...).
        scale: applied first, e.g. 1/255 for 8-bit pixels.
    """

    def __init__(self, mean: float | list[float], std: float | list[float], scale: float = 1.0) -> None:
        super().__init__()
        mean_t, std_t = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)
        self.register_buffer("mean", mean_t)
        self.register_buffer("std", std_t)
        self.scale = scale

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean, self.std
        if mean.ndim == 1:  # per channel: (C,) -> (1, C, 1, ..., 1)
            view = (1, -1) + (1,) * (inputs.ndim - 2)
            mean, std = mean.view(view), std.view(view)
        return (inputs.float() * self.scale - mean) / std


class CenterCrop(nn.Module):
    """The central ``size`` x ``size`` pixels of images (B, C, H, W) -> (B, C, size, size): an exportable crop.

    The evaluation half of the ImageNet recipe (resize, then centre crop; torchvision's ``CenterCrop``,
    https://pytorch.org/vision/stable/generated/torchvision.transforms.CenterCrop.html) as plain
    slicing, so {{ 'ONNX, ``torch.export`` and the server crop' if cookiecutter.use_serving == 'yes' else 'prediction crops' }} exactly as evaluation did.

    Raises:
        ValueError: (at call) images smaller than ``size`` on a side.
    """

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        height, width = images.shape[-2:]
        if height < self.size or width < self.size:
            raise ValueError(f"images of {height}x{width} pixels are smaller than the {self.size}x{self.size} crop")
        top, left = round((height - self.size) / 2), round((width - self.size) / 2)  # torchvision's rounding
        return images[..., top : top + self.size, left : left + self.size]
