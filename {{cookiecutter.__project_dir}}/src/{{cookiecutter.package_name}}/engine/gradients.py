"""An optimizer step's gradient norms, computed once and read by the non-finite guard, clipping and logging.

Each of the three walked every gradient before: ``clip_grad_norm_``'s ``_foreach_norm`` plus an op
per parameter (``aten::to``, 148 a step on a 12-block GPT, counted by torch.profiler), the guard's
own ``_foreach_norm``, and the logged ``train/grad_norm`` a third time. Here each gradient's 2-norm
is computed once a step, on the device, and kept while the gradients are unchanged.
"""

import weakref

import lightning as L
import torch
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.tensor import DTensor


class GradientNorms:
    """The gradients of one optimizer step and their 2-norms, on the device (no host sync).

    Attributes:
        names: the parameters that have a gradient, in ``named_parameters`` order.
        grads: their gradients; under FSDP this process's shard (``DTensor.to_local``, FSDP1's views).
        norms: (N,) float32, each gradient's 2-norm (its local shard's under FSDP). NaN or inf in
            a gradient makes its norm non-finite; so does a finite one whose norm overflows
            float32 (past 3.4e38), a run clipping could not save either.
        total: () float32, the 2-norm of all gradients, every process's shard included under FSDP
            (one all-reduce).
    """

    def __init__(self, names: list[str], grads: list[torch.Tensor], norms: torch.Tensor, total: torch.Tensor) -> None:
        self.names, self.grads, self.norms, self.total = names, grads, norms, total

    def clip_(self, max_norm: float) -> None:
        """Scale the gradients in place so their total 2-norm is at most ``max_norm``.

        The rule of ``torch.nn.utils.clip_grads_with_norm_`` (factor ``max_norm / (total + 1e-6)``,
        at most 1), applied to the local tensors so that FSDP2's shards take it too.
        """
        factor = torch.clamp(max_norm / (self.total + 1e-6), max=1.0)
        torch._foreach_mul_(self.grads, factor)


class _Kept:
    """What :func:`gradient_norms` keeps for one module between calls: its parameters, and norms, not gradients.

    Holding the gradients would keep last step's alive through the next forward pass (twice their memory).
    """

    def __init__(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self.trainer = weakref.ref(trainer)
        # Listed once per trainer, after the strategy wrapped the model: walking named_parameters()
        # every step (metric modules included) cost more than the norms themselves (measured).
        named = list(module.named_parameters())
        self.names = [name for name, _ in named]
        self.params = [param for _, param in named]
        self.sharded = isinstance(trainer.model, FullyShardedDataParallel) or any(
            isinstance(param, DTensor) for param in self.params
        )
        self.norms: tuple[torch.Tensor, torch.Tensor] | None = None  # each gradient's 2-norm, and the total
        self.of: list[weakref.ref] = []  # the gradients the norms were taken of, and their versions
        self.versions: list[int] = []

    def current(self, grads: list[torch.Tensor]) -> bool:
        return (
            self.norms is not None
            and len(grads) == len(self.of)
            and all(ref() is grad for ref, grad in zip(self.of, grads, strict=True))
            and [grad._version for grad in grads] == self.versions
        )


_KEPT: "weakref.WeakKeyDictionary[L.LightningModule, _Kept]" = weakref.WeakKeyDictionary()


def gradient_norms(module: L.LightningModule) -> GradientNorms | None:
    """The current gradients' norms of ``module``, computed on the first call after the gradients change.

    Call it after the backward pass (and AMP unscaling), in ``on_before_optimizer_step`` or
    ``configure_gradient_clipping``: the guard, the logged norm and clipping then share one
    computation. The same gradient tensors, unchanged (their in-place version counters), get the
    same norms; clipping them changes them, so a later call computes the norms afresh.

    Returns:
        None when no parameter has a gradient.
    """
    trainer = module.trainer
    kept = _KEPT.get(module)
    if kept is None or kept.trainer() is not trainer:
        kept = _KEPT[module] = _Kept(trainer, module)
    grads = [param.grad for param in kept.params]
    names = kept.names
    if any(grad is None for grad in grads):  # frozen parameters (fine-tuning), or a branch not taken
        names = [name for name, grad in zip(names, grads, strict=True) if grad is not None]
        grads = [grad for grad in grads if grad is not None]
    if not grads:
        return None
    if kept.sharded:  # FSDP2: this process's shards (outside autograd to_local() is the shard itself)
        with torch.no_grad():
            grads = [grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads]
    if not kept.current(grads):
        with torch.no_grad():
            norms = torch.stack(torch._foreach_norm(grads, 2.0)).float()
            if kept.sharded:
                total = trainer.strategy.reduce(norms.square().sum(), reduce_op="sum").sqrt()
            else:
                total = torch.linalg.vector_norm(norms)
        kept.norms = norms, total
        kept.of = [weakref.ref(grad) for grad in grads]
        kept.versions = [grad._version for grad in grads]
    return GradientNorms(names, grads, *kept.norms)
