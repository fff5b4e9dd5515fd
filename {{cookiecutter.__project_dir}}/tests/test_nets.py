"""Networks: output shapes, gradients and bad sizes."""

import pytest
import torch
from torch import nn

from {{ cookiecutter.package_name }}.nets import CNN, MLP

NETS = {
    "mlp": lambda: MLP(in_channels=1, image_size=8, hidden_sizes=(32, 16), num_classes=10),
    "cnn": lambda: CNN(in_channels=1, channels=(8, 16), num_classes=10),
    "cnn-3-stages": lambda: CNN(in_channels=1, channels=(4, 8, 8), num_classes=10),
}


@pytest.mark.parametrize("name", NETS)
@pytest.mark.parametrize("batch_size", [1, 7])
def test_maps_images_to_logits(name: str, batch_size: int) -> None:
    net = NETS[name]()
    images = torch.randn(batch_size, 1, 8, 8)  # (B, C, H, W)
    assert net(images).shape == (batch_size, 10)  # (B, num_classes)


@pytest.mark.parametrize("name", NETS)
def test_every_parameter_gets_a_gradient(name: str) -> None:
    net: nn.Module = NETS[name]()
    net(torch.randn(4, 1, 8, 8)).sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


@pytest.mark.parametrize(
    "build",
    [
        lambda: MLP(hidden_sizes=(0,)),
        lambda: MLP(dropout=1.0),
        lambda: CNN(channels=()),
        lambda: CNN(num_classes=0),
    ],
)
def test_bad_sizes_are_refused(build) -> None:
    with pytest.raises(ValueError):
        build()
