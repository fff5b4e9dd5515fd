"""Optimizer parameter groups and the default learning-rate schedule (linear warm-up, then cosine decay).

The optimizer and the schedule themselves are chosen in the YAML config (``model.init_args.optimizer``
and ``model.init_args.lr_scheduler``, any ``torch.optim`` class); :class:`engine.TrainingModule`
builds them from there with the groups of :func:`parameter_groups`.
"""

import functools
import inspect
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .errors import ConfigError


def parameter_groups(parameters: Iterable[tuple[str, nn.Parameter]]) -> list[dict[str, Any]]:
    """Split trainable parameters into a decayed group (weight matrices, conv kernels, embeddings: ndim >= 2)
    and a group with ``weight_decay=0`` (biases and norm scales: ndim < 2).

    Decaying biases and norm gains only pulls them towards zero without regularising anything (as in
    nanoGPT and timm). The first group takes the optimizer's own ``weight_decay``.
    """
    params = [p for _, p in parameters if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2]},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return [group for group in groups if group["params"]]


class WarmupCosine(LRScheduler):
    """Linear warm-up for ``warmup_ratio`` of the run, then a cosine down to ``min_lr_ratio`` of the peak.

    Step it once per optimizer step (``interval: step``). The factor at step ``s`` (peak lr times it):
    ``1/w + (1 - 1/w) * s / w`` during the ``w = int(warmup_ratio * total_steps)`` warm-up steps, from
    ``1/w`` up to the peak (Goyal et al., 2017,
    arXiv:1706.02677), then ``m + (1 - m) * (1 + cos(pi * (s - w) / (total_steps - w))) / 2`` with
    ``m = min_lr_ratio`` (Loshchilov & Hutter, "SGDR", ICLR 2017).

    Each parameter group follows this shape from its own peak (its ``initial_lr``, else its ``lr``),
    groups added during training too (layers unfrozen by a fine-tuning callback, Lightning's ``BaseFinetuning``):
    torch's own schedulers fail on a group added after they were made.

    Args:
        optimizer: the optimizer whose groups' ``lr`` is the peak learning rate.
        total_steps: optimizer steps of the whole run. :class:`engine.TrainingModule` passes the
            Trainer's ``estimated_stepping_batches``; leave it unset in configs.
        warmup_ratio: share of ``total_steps`` spent warming up, in [0, 1).
        min_lr_ratio: final learning rate as a share of the peak, in [0, 1].

    Raises:
        ValueError: ``total_steps`` is missing or not positive, or a ratio is out of range.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: int | None = None,
        warmup_ratio: float = 0.05,
        min_lr_ratio: float = 0.01,
    ) -> None:
        if total_steps is None or total_steps < 1:
            raise ConfigError(
                f"WarmupCosine.total_steps must be a positive number of optimizer steps, got {total_steps}"
            )
        if not 0.0 <= warmup_ratio < 1.0:
            raise ConfigError(f"lr_scheduler.warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ConfigError(f"lr_scheduler.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        self.total_steps, self.warmup_ratio, self.min_lr_ratio = total_steps, warmup_ratio, min_lr_ratio
        self.warmup_steps = int(warmup_ratio * total_steps)
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        for group in self.optimizer.param_groups[len(self.base_lrs) :]:  # added since the last step
            self.base_lrs.append(group.setdefault("initial_lr", group["lr"]))
        factor = self.factor(self.last_epoch)
        return [base_lr * factor for base_lr in self.base_lrs]

    def factor(self, step: int) -> float:
        """The multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
        warmup = self.warmup_steps
        if step < warmup:
            return 1.0 / warmup + (1.0 - 1.0 / warmup) * step / warmup
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def target_class(factory: Callable[..., Any]) -> type | None:
    """The class a config-made factory builds: the class itself, or the class a ``functools.partial`` wraps.

    jsonargparse turns ``class_path`` + ``init_args`` of a callable type into a partial whose
    arguments hold the class; None when no class is found.
    """
    if isinstance(factory, type):
        return factory
    if isinstance(factory, functools.partial):
        for candidate in (factory.func, *reversed(factory.args)):
            if isinstance(candidate, type):
                return candidate
    return None


def accepts(factory: Callable[..., Any], parameter: str) -> bool:
    """Whether the class ``factory`` builds takes an argument named ``parameter``."""
    cls = target_class(factory)
    if cls is None:
        return False
    try:
        return parameter in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
