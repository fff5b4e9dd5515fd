"""Networks: plain ``nn.Module`` architectures, no Lightning inside.

Every net maps a float batch of images (B, C, H, W) to class logits (B, num_classes).
"""

from .cnn import CNN
from .mlp import MLP

__all__ = ["CNN", "MLP"]
