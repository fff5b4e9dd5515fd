"""Transfer learning: train a new head on a frozen backbone, then unfreeze the backbone at a lower learning rate."""

import lightning as L
import torch
from lightning.pytorch.callbacks import BaseFinetuning
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, SingleDeviceStrategy
from torch import nn

from ..errors import ConfigError
from ..optim import parameter_groups

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = ["BackboneFreeze"]


class BackboneFreeze(BaseFinetuning):
    """Freeze ``model.net.backbone`` until ``unfreeze_at_epoch``, then train it at ``backbone_lr_ratio`` of the peak lr.

    The usual schedule for a pretrained backbone (Howard & Ruder, 2018, "Universal Language Model
    Fine-tuning", gradual unfreezing; Yosinski et al., 2014, "How transferable are features"):
    first only the new head learns, so its random initial gradients do not wreck the pretrained
    features, then the backbone joins with a smaller learning rate. Built on Lightning's
    ``BaseFinetuning`` (https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.callbacks.BaseFinetuning.html),
    which also restores the optimizer's groups when a run resumes after the unfreeze. The backbone's
    parameters join as two groups, weight matrices decayed and biases and norms not (as
    ``engine.optim.parameter_groups``), with ``initial_lr`` set so ``engine.WarmupCosine`` schedules
    them with the same shape.

    Any net with a ``backbone`` module works (the bundled image nets have one: a CNN's convolution stages, a
    pretrained model's body).

    Under DDP the unfrozen backbone's gradients are averaged over the processes here: DDP syncs only
    the parameters that needed gradients when it wrapped the model, and the backbone was frozen then,
    so each process would otherwise train its own backbone apart from the others, in silence (Lightning
    issue #20340; the image task's transfer-learning tests check every process ends with the same parameters).
    Other strategies (FSDP, DeepSpeed, model parallel) are refused when fit starts: they fix which
    parameters train when they wrap the model (FSDP flattens each wrapped block's parameters into one
    tensor whose ``requires_grad`` is set then), so the later unfreeze would not reach them.

    Args:
        unfreeze_at_epoch: the first epoch (0-based) in which the backbone trains.
        backbone_lr_ratio: the backbone groups' peak learning rate as a share of the first group's.
        train_bn: keep the frozen backbone's BatchNorm layers updating their statistics (False: frozen too).

    Raises:
        ValueError: when fit starts, if the model's net has no ``backbone`` module, is under LoRA (its
            checkpoints leave out the base this would unfreeze), or the strategy is not single-device or
            of the DDP family (DeepSpeed, a DDPStrategy subclass, is refused too).
    """

    def __init__(self, unfreeze_at_epoch: int = 1, backbone_lr_ratio: float = 0.1, train_bn: bool = False) -> None:
        super().__init__()
        if unfreeze_at_epoch < 0 or not 0.0 < backbone_lr_ratio <= 1.0:
            raise ConfigError(
                f"BackboneFreeze: unfreeze_at_epoch must be >= 0 and backbone_lr_ratio in (0, 1], "
                f"got {unfreeze_at_epoch} and {backbone_lr_ratio}"
            )
        self.unfreeze_at_epoch, self.backbone_lr_ratio, self.train_bn = unfreeze_at_epoch, backbone_lr_ratio, train_bn

    @staticmethod
    def backbone(pl_module: L.LightningModule) -> nn.Module:
        backbone = getattr(getattr(pl_module, "net", None), "backbone", None)
        if not isinstance(backbone, nn.Module):
            raise ConfigError(
                f"BackboneFreeze: model.net ({type(getattr(pl_module, 'net', None)).__name__}) has no `backbone` "
                "module to freeze; use a net with one or remove the callback"
            )
        return backbone

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        strategy = trainer.strategy  # DeepSpeedStrategy is a DDPStrategy subclass, which shards like FSDP
        if not isinstance(strategy, SingleDeviceStrategy | DDPStrategy) or isinstance(strategy, DeepSpeedStrategy):
            raise ConfigError(
                f"BackboneFreeze cannot unfreeze a backbone under {type(strategy).__name__}: it fixes "
                "which parameters train when it wraps the model; train with the ddp preset "
                "(--config configs/presets/ddp.yaml), or remove the callback to fine-tune every weight from the start"
            )
        if getattr(getattr(pl_module, "net", None), "base_keys", None):  # a LoRA net: its checkpoints omit the base
            raise ConfigError(
                "BackboneFreeze with LoRA (model.init_args.net.init_args.lora): LoRA keeps the pretrained base "
                "frozen and its checkpoints leave it out, so the weights this callback unfreezes would train and "
                "never be saved (a reload would not be the model tested); remove the callback (LoRA alone), "
                "or drop lora"
            )
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: L.LightningModule) -> None:
        self.freeze(self.backbone(pl_module), train_bn=self.train_bn)

    def finetune_function(self, pl_module: L.LightningModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        """From ``unfreeze_at_epoch`` on, the backbone trains; its groups join the optimizer once.

        A run resumed at or after that epoch was frozen again by ``setup`` (before the checkpoint loads),
        while ``BaseFinetuning`` put the backbone's saved groups back in the optimizer: the backbone is
        made trainable again (by :meth:`on_train_start`, as a run resumed mid-epoch starts no epoch),
        and no group is added twice.
        """
        if epoch < self.unfreeze_at_epoch:
            return
        backbone = self.backbone(pl_module)
        self.make_trainable(backbone)
        in_optimizer = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
        if any(id(parameter) in in_optimizer for parameter in backbone.parameters()):
            return  # unfrozen in an earlier epoch, or restored from the checkpoint of a resumed run
        first = optimizer.param_groups[0]
        peak = first.get("initial_lr", first["lr"]) * self.backbone_lr_ratio
        for group in parameter_groups(backbone.named_parameters()):
            group.setdefault("weight_decay", first.get("weight_decay", 0.0))
            optimizer.add_param_group({**group, "lr": peak, "initial_lr": peak})

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A resumed run continues unfrozen from where it stopped: Lightning restores the epoch before this hook."""
        for optimizer in trainer.optimizers:
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Average the unfrozen backbone's gradients over the DDP processes, once an optimizer step.

        Runs before gradient clipping, as DDP's own sync does. Gradients DDP has synced already (a
        backbone that was never frozen when DDP wrapped the model) are equal everywhere, so their mean
        leaves them as they are.
        """
        if not isinstance(trainer.strategy, DDPStrategy) or trainer.world_size == 1:
            return
        grads = [p.grad for p in self.backbone(pl_module).parameters() if p.requires_grad and p.grad is not None]
        for dtype in sorted({grad.dtype for grad in grads}, key=str):  # one all-reduce a dtype, not a tensor
            same = [grad for grad in grads if grad.dtype == dtype]
            mean = trainer.strategy.reduce(torch.cat([grad.flatten() for grad in same]), reduce_op="mean")
            for grad, synced in zip(same, mean.split([grad.numel() for grad in same]), strict=True):
                grad.copy_(synced.view_as(grad))
