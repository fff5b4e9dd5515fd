"""Networks: plain ``nn.Module`` architectures, no Lightning inside.
{% if cookiecutter.task == "tabular" %}
Every net maps encoded table rows (B, F) to outputs (B, out_features).
"""

from .tabular_mlp import TabularMLP

__all__ = ["TabularMLP"]
{%- elif cookiecutter.task == "language-model" %}
Every net maps token ids (B, T) to next-token logits (B, T, vocab_size).
"""
{% if cookiecutter.use_pretrained == "yes" %}
from .causal_lm import HFCausalLM, LoRA
{%- endif %}
from .gpt import GPT

__all__ = ["GPT"{{ ', "HFCausalLM", "LoRA"' if cookiecutter.use_pretrained == "yes" else "" }}]
{%- else %}
Every net maps a float batch of images (B, C, H, W) to class logits (B, num_classes).
"""

from .cnn import CNN
{%- if cookiecutter.use_pretrained == "yes" %}
from .hf import LoRA
from .hf_image import HFImageClassifier
{%- endif %}
from .mlp import MLP
{%- if cookiecutter.use_pretrained == "yes" %}
from .pretrained import PretrainedNet
from .timm_net import TimmNet
{%- endif %}

__all__ = ["CNN", "MLP"{{ ', "HFImageClassifier", "LoRA", "PretrainedNet", "TimmNet"' if cookiecutter.use_pretrained == "yes" else "" }}]
{%- endif %}
