"""``TrainingModule``: the engineering every task shares, so a task module holds only its loss, metrics and predictions.

A task subclasses it and implements :meth:`TrainingModule.shared_step` (batch -> loss, updating the
metrics it is given) and passes its metrics to :meth:`TrainingModule.set_metrics`. What a user reads
of the net's output (``output_head``, ``describe`` and the rest of :class:`engine.contract.ShippableModel`)
defaults to a classifier's; a task with other outputs overrides those. The base provides:

- the optimizer and learning-rate schedule from the config (``optimizer``, ``lr_scheduler``: any
  ``torch.optim`` class; AdamW with warm-up + cosine by default), weight decay on matrices only,
  fused kernels where the precision rules allow them;
- ``torch.compile`` in place (checkpoint keys without ``_orig_mod.``) and channels-last memory;
- gradient clipping that works under FSDP, and with fused AdamW under bf16-mixed;
- logging that costs nothing on steps the logger does not write, and metrics computed once per epoch;
- a fresh run that starts from the net weights of an earlier run's checkpoint (``init_from``).
"""

import logging
from collections.abc import Callable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import WeightAveraging
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torchmetrics import MetricCollection

from .checkpoints import (
    check_fits,
    guard_optimizer_loads,
    net_differences,
    read_checkpoint,
)
from .contract import ShippableModel
from .errors import ConfigError
from .gradients import gradient_norms
from .optim import WarmupCosine, accepts, parameter_groups
from .precision import fused_optimizer_allowed
from .sharding import is_sharded, shard_net

try:  # set while LightningCLI instantiates the model: the net then arrives with its config
    from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
except ImportError:  # pragma: no cover - older or newer Lightning without it
    _given_hyperparameters = None

log = logging.getLogger(__name__)

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


def adamw(params: Any) -> torch.optim.Optimizer:
    """The default optimizer when a module is built in Python: AdamW, lr 1e-3, weight decay 0.05.

    (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019.) Configs name
    ``torch.optim.AdamW`` and its arguments instead.
    """
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.05)


def logger_writes(trainer: L.Trainer, step: int) -> bool:
    """Whether Lightning's logger writes the metrics of optimizer step ``step`` (counted from 1 since the
    fit started): when it is a multiple of ``log_every_n_steps`` (0: never), as Lightning's
    ``should_update_logs`` decides. Inside ``training_step`` that is ``global_step + 1``; in a
    callback's ``on_train_batch_end``, once the optimizer stepped, ``global_step``."""
    every = trainer.log_every_n_steps
    return bool(every) and step % every == 0


class TrainingModule(ShippableModel, L.LightningModule):
    """Base LightningModule: optimizer and schedule from the config, compile, channels-last, FSDP clipping.

    Args:
        net: the network (``nets``), a plain ``nn.Module``.
        optimizer: builds the optimizer from parameter groups, in YAML a ``class_path`` (e.g.
            ``torch.optim.AdamW``) and its ``init_args`` (``lr``, ``weight_decay``, ...).
            Biases and norm scales get ``weight_decay=0``; a class with a ``fused`` argument gets
            ``fused=True`` where :mod:`engine.precision` allows it.
        lr_scheduler: builds the schedule from the optimizer, stepped every optimizer step; None for a
            constant learning rate. A class with a ``total_steps`` argument (:class:`WarmupCosine`,
            ``OneCycleLR``) is given the run's optimizer steps.
        compile: compile the net with ``torch.compile`` when fit starts, in place
            (``nn.Module.compile``), so checkpoint keys carry no ``_orig_mod.``.
        compile_mode: ``torch.compile`` mode: None (default), "reduce-overhead" (CUDA graphs, for
            small batches on GPU) or "max-autotune" (longer compile, faster kernels).
        channels_last: keep 4-D activations in channels-last memory order (NHWC; shapes stay
            (B, C, H, W)), the layout of cuDNN's tensor-core convolutions under bf16/fp16.
            https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html
        init_from: a checkpoint of an earlier run (``best.ckpt``, ``last.ckpt``) whose weights a new
            ``fit`` starts from, e.g. a chat fine-tune of a model pretrained here; the optimizer, schedule,
            data order and step count start fresh (to continue a run instead: ``--ckpt_path``/``make
            resume``, which takes precedence). Read as data (``torch.load(weights_only=True)``) when fit
            starts; the net must be built as the checkpoint's.

    Raises:
        engine.checkpoints.CheckpointError: (at fit) ``init_from`` is unreadable or does not fit the
            net, naming the net arguments that differ from the checkpoint's.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = adamw,
        lr_scheduler: LRSchedulerCallable | None = WarmupCosine,
        compile: bool = False,
        compile_mode: CompileMode | None = None,
        channels_last: bool = False,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        # Through LightningCLI the hyperparameters hold the configs of the net, optimizer and
        # schedule (plain data, so checkpoints load with weights_only=True and rebuild them).
        # Built in Python they would hold the objects themselves: left out, pass them again.
        built_from_config = _given_hyperparameters is not None and _given_hyperparameters.get() is not None
        self.save_hyperparameters(ignore=None if built_from_config else ["net", "optimizer", "lr_scheduler"])
        self.net = net
        self.optimizer_factory: Callable[..., torch.optim.Optimizer] = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.train_metrics = self.val_metrics = self.test_metrics = MetricCollection({})
        self.epoch_tensors: dict[str, torch.Tensor] = {}  # non-scalar results of the last computed metrics
        self._initial_checkpoint: dict[str, Any] | None = None  # init_from's, read once
        self._init_from_done = False

    # ---- what a task module provides ---------------------------------------------------------
    def shared_step(self, batch: Any, metrics: MetricCollection) -> torch.Tensor:
        """The loss of ``batch`` (a scalar tensor); update ``metrics`` with the batch's predictions.

        Used by training, validation and test steps alike, and by any loop that measures the step.
        """
        raise NotImplementedError(f"{type(self).__name__} must implement shared_step(batch, metrics) -> loss")

    def set_metrics(self, metrics: MetricCollection) -> None:
        """Use ``metrics`` for every stage: logged as ``train/<name>``, ``val/<name>``, ``test/<name>``.

        The training metrics' running states are saved in checkpoints (torchmetrics' ``persistent``),
        so a run resumed mid-epoch reports the same epoch metrics as an uninterrupted one.
        """
        self.train_metrics = metrics.clone(prefix="train/")
        self.train_metrics.persistent(True)
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")

    # ---- the net --------------------------------------------------------------------------------
    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The net's output for ``inputs`` (task-specific shapes, see the task module)."""
        if self.hparams.channels_last and inputs.ndim == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.net(inputs)

    def check_init_from(self) -> None:
        """Read ``init_from`` and check it fits this model, so a mistake fails before the run starts.

        Raises:
            engine.checkpoints.CheckpointError: unreadable, another net (its differing arguments
                named), or refused by :meth:`check_initial_checkpoint`.
        """
        path = self.hparams.get("init_from")
        if not path or self._initial_checkpoint is not None:
            return
        checkpoint = read_checkpoint(path)
        differences = net_differences(checkpoint, self.hparams)
        fix = "Build the net as the checkpoint's"
        if differences:  # a value the CLI links from the data (block_size, vocab_size) is set under data.init_args
            fix += f" ({'; '.join(differences)}; a value linked from the data is set as data.init_args.<name>)"
        check_fits(checkpoint, self, f"model.init_from: {path}", fix + ".")
        self.check_initial_checkpoint(checkpoint, f"model.init_from: {path}")
        self._initial_checkpoint = checkpoint

    def check_initial_checkpoint(self, checkpoint: dict[str, Any], where: str) -> None:
        """A task's own check of an ``init_from`` checkpoint (e.g. the same tokenizer); raise CheckpointError."""

    def skip_init_from(self) -> None:
        """Leave ``init_from`` unread: a resumed run restores its own weights (the CLI's ``--ckpt_path``,
        ``--resume``), and the file it started from may be gone. (``Trainer.fit(ckpt_path=...)`` without
        this reads it and then restores the checkpoint's weights over it.)"""
        self._init_from_done = True

    def _start_from_init_from(self) -> None:
        if not self.hparams.get("init_from") or self._init_from_done:
            return
        self.check_init_from()
        self.load_state_dict(self._initial_checkpoint["state_dict"])
        log.info("model.init_from: the net starts from %s's weights", self.hparams.init_from)
        self._initial_checkpoint, self._init_from_done = None, True  # the weights are in the net: free the copy

    def setup(self, stage: str) -> None:
        # A net that needs its data prepared a certain way (a pretrained backbone) checks the DataModule.
        check_data = getattr(self.net, "check_data", None)
        if stage == "fit" and callable(check_data):
            try:
                trainer = self.trainer
            except RuntimeError:  # a module set up by hand is attached to no Trainer, so to no data
                trainer = None
            if trainer is not None:
                check_data(trainer.datamodule)
        if stage == "fit":
            self._start_from_init_from()  # before compile: the compiled net shares these parameters
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)
        if self.hparams.compile and stage == "fit":
            # In place, unlike torch.compile(net): parameter names and checkpoint keys stay those of
            # eager. https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.compile
            self.net.compile(mode=self.hparams.compile_mode)
            if self.hparams.compile_mode == "reduce-overhead" and self.device.type != "cuda":
                rank_zero_info(f"compile_mode=reduce-overhead: on {self.device.type} it compiles without CUDA graphs")

    def configure_model(self) -> None:
        # The fsdp2 preset (ModelParallelStrategy) gives the module a device mesh: shard the net over it.
        if self.device_mesh is None or is_sharded(self.net):
            return
        if any(isinstance(callback, WeightAveraging) for callback in self.trainer.callbacks):
            raise ConfigError(
                "configs/presets/ema.yaml does not combine with the fsdp2 preset: Lightning's WeightAveraging "
                "keeps a whole, unsharded copy of the model on every process; leave one of them out"
            )
        shard_net(self.net, self.device_mesh["data_parallel"], self.trainer.precision)

    # ---- steps and logging ----------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.hparams.compile and self.hparams.compile_mode == "reduce-overhead":
            # CUDA graph trees: the last step's graph outputs are dead, their memory is the next replay's.
            torch.compiler.cudagraph_mark_step_begin()
        loss = self.shared_step(batch, self.train_metrics)
        # Only on the steps the logger writes: each self.log costs Lightning about as much as a small
        # model's step (measured on a 2-core CPU). Not prog_bar=True: Lightning turns a stored progress-bar
        # value into a number at every later batch end, a GPU wait each step (H200 profile); the bar
        # (callbacks.ThrottledRichProgressBar) shows train/loss from the logged values when it reads them.
        if logger_writes(self.trainer, self.trainer.global_step + 1):
            self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss = self.shared_step(batch, self.val_metrics)
        # Epoch-level values are averaged over the processes (one all-reduce per epoch under DDP).
        self.log("val/loss", loss, prog_bar=True, sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        loss = self.shared_step(batch, self.test_metrics)
        self.log("test/loss", loss, sync_dist=True)

    # The metrics are updated in every step (on device, no host sync) and computed once per epoch
    # here. Logging the Metric objects from the steps instead (self.log_dict(metrics)) made
    # Lightning move each metric's state every step: 3.3 ms of a 6 ms step on CPU (measured).
    def on_train_epoch_end(self) -> None:
        self._log_epoch_metrics(self.train_metrics)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # Every run validates at its last step, so it always has a best checkpoint to test, even when
        # that step falls between val_check_interval steps (a short try, a small data set): a stop
        # asked for at a step makes Lightning validate there (its rule for stopping early).
        if self._is_last_training_step(batch_idx):
            self.trainer.should_stop = True

    def _is_last_training_step(self, batch_idx: int) -> bool:
        trainer = self.trainer
        if trainer.fast_dev_run or trainer.limit_val_batches == 0 or trainer.val_dataloaders is None:
            return False
        if trainer.max_steps is not None and 0 < trainer.max_steps <= trainer.global_step:
            return True
        epochs, batches = trainer.max_epochs, trainer.num_training_batches
        last_epoch = epochs is not None and epochs >= 0 and trainer.current_epoch + 1 >= epochs
        return last_epoch and batches != float("inf") and batch_idx + 1 >= batches

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_metrics(self.val_metrics, prog_bar=True)

    def on_test_epoch_end(self) -> None:
        self._log_epoch_metrics(self.test_metrics)

    def _log_epoch_metrics(self, metrics: MetricCollection, prog_bar: bool = False) -> None:
        if not metrics:
            return
        # compute() already gathers the states of every process; sync_dist only quiets Lightning.
        results = metrics.compute()
        scalars = {name: value for name, value in results.items() if value.numel() == 1}
        # Tensors such as a confusion matrix are not logged as numbers: callbacks.RunPlots draws them.
        self.epoch_tensors = {name: value for name, value in results.items() if value.numel() > 1}
        self.log_dict(scalars, prog_bar=prog_bar, sync_dist=True)
        metrics.reset()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The gradient norm before clipping (after AMP unscaling), on the steps the logger writes only;
        # the whole model's under FSDP. Computed once a step with the guard's and clipping's (engine.gradients).
        if logger_writes(self.trainer, self.trainer.global_step + 1):
            norms = gradient_norms(self)
            if norms is not None:
                self.log("train/grad_norm", norms.total)

    # ---- optimisation ---------------------------------------------------------------------------
    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        # By norm from the step's shared norms (engine.gradients), for every optimizer: Lightning's
        # mixed-precision plugin refuses fused AdamW with clipping, a rule for float16's loss scaler,
        # whose unscaling fused optimizers do inside their step (engine.precision allows them only without one).
        # No gradient at all (a training_step that returned None): nothing to clip (torch's clip_grad_value_ fails).
        if not gradient_clip_val or (norms := gradient_norms(self)) is None:
            return
        if gradient_clip_algorithm == "value":
            torch.nn.utils.clip_grad_value_(self.parameters(), gradient_clip_val)
        elif isinstance(self.trainer.model, FullyShardedDataParallel):
            self.trainer.model.clip_grad_norm_(gradient_clip_val)  # FSDP1's own: its flat shards
        else:
            norms.clip_(gradient_clip_val)

    def configure_optimizers(self) -> dict[str, Any]:
        fused = fused_optimizer_allowed(self, str(self.trainer.precision))
        optimizer, scheduler = self.build_optimizer(int(self.trainer.estimated_stepping_batches), fused=fused)
        if scheduler is None:
            return {"optimizer": optimizer}
        schedule = {"scheduler": scheduler, "interval": "step"}
        return {"optimizer": optimizer, "lr_scheduler": schedule}

    def check_optimizer(self) -> None:
        """Build the optimizer and its schedule once, on throwaway objects, so bad arguments fail before fit.

        Raises:
            ConfigError: the optimizer or the schedule refused its arguments (``lr: -1``), naming the key.
        """
        key = "optimizer"
        try:
            optimizer = self._optimizer(fused=False)
            key = "lr_scheduler"
            self._schedule(optimizer, total_steps=1000)
        except (ValueError, TypeError) as error:
            config = self.hparams.get(key)
            class_path = config.get("class_path") if isinstance(config, dict) else ""
            raise ConfigError(
                f"model.init_args.{key} {class_path} refused its arguments: {error}; "
                f"fix model.init_args.{key}.init_args in the config"
            ) from error

    def build_optimizer(
        self, total_steps: int, fused: bool = False
    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler | None]:
        """The configured optimizer over :func:`engine.optim.parameter_groups` and its schedule for ``total_steps``.

        ``fused=True`` asks for the fused kernel when the optimizer class has one, unless the config
        chose the kernel itself (``fused`` or ``foreach`` in the optimizer's ``init_args``).
        """
        optimizer = self._optimizer(fused)
        guard_optimizer_loads(optimizer, self)
        return optimizer, self._schedule(optimizer, total_steps)

    def _optimizer(self, fused: bool) -> torch.optim.Optimizer:
        config = self.hparams.get("optimizer")
        chosen = (config.get("init_args") or {}) if isinstance(config, dict) else {}
        own_choice = any(chosen.get(key) is not None for key in ("fused", "foreach"))
        extra = {"fused": True} if fused and not own_choice and accepts(self.optimizer_factory, "fused") else {}
        return self.optimizer_factory(parameter_groups(self.named_parameters()), **extra)

    def _schedule(
        self, optimizer: torch.optim.Optimizer, total_steps: int
    ) -> torch.optim.lr_scheduler.LRScheduler | None:
        if self.lr_scheduler_factory is None:
            return None
        run_length = {"total_steps": max(1, total_steps)} if accepts(self.lr_scheduler_factory, "total_steps") else {}
        return self.lr_scheduler_factory(optimizer, **run_length)
