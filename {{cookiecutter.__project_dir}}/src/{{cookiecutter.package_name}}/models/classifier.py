"""Image classification: cross-entropy, torchmetrics, AdamW with linear warm-up and cosine decay."""

from collections.abc import Iterable
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities.types import OptimizerLRSchedulerConfig
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, LRScheduler, SequentialLR
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

try:  # set while LightningCLI instantiates the model: the net then arrives with its config
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
except ImportError:  # pragma: no cover - older or newer Lightning without it
    _given_hyperparameters = None


class ImageClassifier(L.LightningModule):
    """Trains any ``net`` mapping images (B, C, H, W) to logits (B, num_classes).

    Logs ``{train,val,test}/loss`` and, per epoch, ``{train,val,test}/acc`` (micro accuracy) and
    ``{train,val,test}/f1`` (macro F1) from torchmetrics. Metrics are updated on the device each
    step and computed once per epoch, so logging costs no host-device synchronisation per step.

    Optimisation: AdamW (Loshchilov & Hutter, 2019, "Decoupled Weight Decay Regularization"),
    weight decay on weight matrices and conv kernels only, a learning rate rising linearly for
    ``warmup_ratio`` of the run (Goyal et al., 2017) then following a cosine to
    ``lr * min_lr_ratio`` (Loshchilov & Hutter, 2017, SGDR), stepped every optimizer step.

    Built by LightningCLI, the checkpoint records the net's ``class_path`` and ``init_args``, so
    ``ImageClassifier.load_from_checkpoint(path)`` rebuilds it. Built in Python, pass the net
    again: ``ImageClassifier.load_from_checkpoint(path, net=MLP())``.

    Args:
        net: the network (see ``nets``); its output width must equal ``num_classes``.
        num_classes: number of classes (linked from the DataModule by the CLI).
        lr: peak learning rate.
        weight_decay: AdamW decoupled weight decay.
        warmup_ratio: share of all optimizer steps spent warming up, in [0, 1).
        min_lr_ratio: final learning rate as a share of ``lr``, in [0, 1].
        label_smoothing: cross-entropy label smoothing (Szegedy et al., 2016), in [0, 1).
        compile: compile the net with ``torch.compile`` when training starts. It compiles the
            net in place (``nn.Module.compile``), so checkpoint keys carry no ``_orig_mod.``.
        compile_mode: ``torch.compile`` mode: None (default), "reduce-overhead" (CUDA graphs,
            for small batches on GPU) or "max-autotune" (longer compile, faster kernels).
        channels_last: keep 4-D activations in channels-last memory order (NHWC; shapes stay
            (B, C, H, W)), the layout cuDNN's tensor-core convolutions use under bf16/fp16.
            The gpu preset turns it on. https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html

    Raises:
        ValueError: if a hyperparameter is out of range.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int = 10,
        lr: float = 6e-3,
        weight_decay: float = 0.05,
        warmup_ratio: float = 0.05,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.0,
        compile: bool = False,
        compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"model.num_classes must be at least 2, got {num_classes}")
        if lr <= 0:
            raise ValueError(f"model.lr must be positive, got {lr}")
        if not 0.0 <= warmup_ratio < 1.0:
            raise ValueError(f"model.warmup_ratio must be in [0, 1), got {warmup_ratio}")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(f"model.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"model.label_smoothing must be in [0, 1), got {label_smoothing}")
        # Through LightningCLI the hyperparameters hold the net's config (plain data); built in
        # Python they would hold the module itself, which the state_dict already carries.
        built_from_config = _given_hyperparameters is not None and _given_hyperparameters.get() is not None
        self.save_hyperparameters(ignore=None if built_from_config else ["net"])
        self.net = net

        metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, average="micro"),
                "f1": MulticlassF1Score(num_classes, average="macro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Images (B, C, H, W) -> logits (B, num_classes)."""
        if self.hparams.channels_last and images.ndim == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return self.net(images)

    def setup(self, stage: str) -> None:
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.hparams.compile and stage == "fit":
            # In place, unlike torch.compile(net): parameter names and checkpoint keys stay
            # the same as eager. https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.compile
            self.net.compile(mode=self.hparams.compile_mode)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        images, labels = batch  # (B, C, H, W), (B,)
        logits = self(images)  # (B, num_classes)
        loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
        metrics.update(logits.detach(), labels)
        return loss

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, self.train_metrics)
        # Only on the steps the logger writes: each self.log costs Lightning about as much as a small
        # model's step (make bench). Lightning writes when its count of optimizer steps since the
        # start of the fit, plus one, is a multiple of log_every_n_steps (0: never).
        every = self.trainer.log_every_n_steps
        if every and (self.trainer.global_step + 1) % every == 0:
            self.log("train/loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self._shared_step(batch, self.val_metrics)
        # Epoch-level values are averaged over the processes (one all-reduce per epoch under DDP).
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss = self._shared_step(batch, self.test_metrics)
        self.log("test/loss", loss, sync_dist=True)

    # The metrics are updated in every step (on device, no host sync) and computed once per epoch
    # here. Logging the Metric objects from the steps instead (self.log_dict(metrics)) made
    # Lightning move each metric's state every step: 3.3 ms of a 6 ms step on CPU (make bench).
    def on_train_epoch_end(self) -> None:
        self._log_epoch_metrics(self.train_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics(self.val_metrics, prog_bar=True)

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics(self.test_metrics)

    def _log_epoch_metrics(self, metrics: MetricCollection, prog_bar: bool = False) -> None:
        # compute() already gathers the states of every process; sync_dist only quiets Lightning.
        self.log_dict(metrics.compute(), prog_bar=prog_bar, sync_dist=True)
        metrics.reset()

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """Class probabilities (B, num_classes) for the images of ``batch``."""
        return self(batch[0]).softmax(dim=-1)

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # Under FSDP each process holds a shard of the gradients, so only the FSDP module can
        # compute their global norm; Lightning's FSDP precision plugin refuses norm clipping.
        # https://pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.FullyShardedDataParallel.clip_grad_norm_
        if isinstance(self.trainer.model, FullyShardedDataParallel) and gradient_clip_val:
            if gradient_clip_algorithm not in (None, "norm"):
                raise ValueError(f"trainer.gradient_clip_algorithm={gradient_clip_algorithm!r}: FSDP clips by norm")
            self.trainer.model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> OptimizerLRSchedulerConfig:
        hp = self.hparams
        total_steps = max(1, int(self.trainer.estimated_stepping_batches))
        # Fused AdamW on GPU: one kernel for every parameter's update. Not with mixed precision:
        # Lightning's AMP plugin refuses fused optimizers with gradient clipping, and its FSDP
        # plugin would skip unscaling the gradients before clipping them; those runs keep torch's
        # CUDA default (foreach: a few kernels per parameter group).
        on_cuda = all(p.is_cuda for p in self.parameters())
        fused = on_cuda and not str(self.trainer.precision).endswith("-mixed")
        optimizer, scheduler = adamw_warmup_cosine(
            self.parameters(), hp.lr, hp.weight_decay, hp.warmup_ratio, hp.min_lr_ratio, total_steps, fused=fused
        )
        scheduler_config = {"scheduler": scheduler, "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": scheduler_config}


def adamw_warmup_cosine(
    parameters: Iterable[nn.Parameter],
    lr: float,
    weight_decay: float,
    warmup_ratio: float,
    min_lr_ratio: float,
    total_steps: int,
    fused: bool = False,
) -> tuple[torch.optim.AdamW, LRScheduler]:
    """AdamW with decoupled weight decay on weight matrices and kernels only, and its per-step schedule.

    The learning rate rises linearly over the first ``warmup_ratio * total_steps`` steps, then
    follows a cosine down to ``lr * min_lr_ratio`` (Loshchilov & Hutter, "Decoupled Weight Decay
    Regularization", ICLR 2019; "SGDR", ICLR 2017). Biases and norm scales (1-D) are not decayed.
    Step the scheduler once per optimizer step. ``fused=True`` selects PyTorch's fused AdamW
    kernel (CUDA tensors; https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html).
    """
    params = [p for p in parameters if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=lr, fused=fused or None)
    warmup_steps = int(warmup_ratio * total_steps)
    cosine = CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps), eta_min=lr * min_lr_ratio)
    if warmup_steps == 0:
        return optimizer, cosine
    warmup = LinearLR(optimizer, start_factor=1.0 / warmup_steps, total_iters=warmup_steps)
    return optimizer, SequentialLR(optimizer, [warmup, cosine], milestones=[warmup_steps])
