"""Save a resumable checkpoint when a run is pre-empted, cancelled or interrupted, then stop (and requeue).

SLURM sends SIGUSR1 to every task some time before it stops a job (``#SBATCH
--signal=SIGUSR1@120``), SIGTERM when it cancels one, and Ctrl-C sends SIGINT. Lightning's own
SLURM auto-requeue saves the checkpoint inside the signal handler, that is at whatever point each
process happens to be. Under DDP that deadlocks: one process enters the checkpoint's barrier while
another waits in the training loop's per-step broadcast, and both wait forever (seen with
Lightning 2.6 and gloo). This callback only records the signal in the handler; the processes
then agree at a batch boundary (one all-reduce a step, read a step later so that no step waits
for the GPU) and all save the same, complete step.
See https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html for Lightning's SLURM
requeue, which this replaces.
"""

import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from ..errors import ConfigError
from ..launch import slurm_job_id
from ..run_folders import run_dir
from ..run_records import own_config
from .finite import HostCopy


class Preempted(SystemExit):
    """Raised on every process once the checkpoint is saved: ends fit and skips the after-fit test.

    Its exit status is 0 when the job was requeued (SLURM runs it again), else 128 + the signal
    number, as for a process the signal had stopped (130 for Ctrl-C, 143 for SIGTERM).
    """


def _signal(name: str, field: str) -> signal.Signals:
    if not name.startswith("SIG") or not hasattr(signal, name):
        raise ConfigError(f"PreemptionCheckpoint.{field}: {name!r} is not a signal name; use e.g. SIGUSR1 or SIGTERM")
    return signal.Signals[name]


def _quiet_about_the_stopped_wandb_service(unraisable: Any, default: Any = sys.__unraisablehook__) -> None:
    """``sys.unraisablehook`` for a requeued job's exit: drop wandb's failure to reach its stopped service.

    The requeue stops every process of the job, wandb's service process too; wandb's exit hook
    (atexit) then fails with ``ConnectionResetError`` and Python prints its traceback (wandb 0.2x,
    0.31). Nothing is lost: the run's files are on disk, and the requeued job continues the same
    wandb run. Anything else goes to Python's own hook.
    """
    module = getattr(unraisable.object, "__module__", None) or ""
    if isinstance(unraisable.exc_value, ConnectionError) and module.split(".")[0] == "wandb":
        return
    default(unraisable)


class PreemptionCheckpoint(Checkpoint):
    """On a signal, save ``checkpoints/interrupted-step<N>.ckpt`` at the next batch boundary, then stop.

    Under DDP and FSDP at the one after: the processes' agreement is read a step late (no step waits for the GPU).

    A ``Checkpoint`` callback, so Lightning runs its hooks after every other callback's: the step it
    saves at is complete (``callbacks.RunPlots`` has recorded that step's logged loss).

    The checkpoint holds the full training state (weights, optimizer, LR scheduler, loops and the
    train loader's position). ``make resume`` (``--resume=true``) continues from it, and a requeued
    SLURM job does so by itself (``runs.latest_checkpoint``). A second Ctrl-C stops at once.

    Args:
        requeue_signal: the scheduler's warning before a time limit or pre-emption
            (SLURM's ``--signal``); under SLURM the job is requeued after saving.
        stop_signals: signals that save and stop without requeueing: SLURM's ``scancel`` and
            most schedulers send SIGTERM, Ctrl-C sends SIGINT.
        requeue: set to false to save and stop on ``requeue_signal`` without requeueing.

    Raises:
        ValueError: a name is not a signal of this platform.
        Preempted: (a ``SystemExit``) on every process once the checkpoint is saved.
    """

    # The command that continues an interrupted run, said once it is saved: a command whose fits are steps
    # of its own (k-fold cross-validation) names itself here; None says `make resume`.
    continue_with: str | None = None

    def __init__(
        self,
        requeue_signal: str = "SIGUSR1",
        stop_signals: list[str] | None = None,
        requeue: bool = True,
    ) -> None:
        self.requeue_signal = _signal(requeue_signal, "requeue_signal")
        names = ["SIGTERM", "SIGINT"] if stop_signals is None else stop_signals
        self.stop_signals = [_signal(name, "stop_signals") for name in names]
        self.requeue = requeue
        self.received: int = 0  # number of the signal to act on, 0 for none
        self.saved_path: Path | None = None
        self._previous: dict[signal.Signals, Any] = {}
        self._agreed: HostCopy | None = None  # the processes' last all-reduced signal, on its way to the host

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum  # acted on at the next batch boundary, never inside the handler
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # a second Ctrl-C stops at once
            print("\nCtrl-C: saving a checkpoint after this step (Ctrl-C again to stop at once)", flush=True)

    def _install(self, signums: list[signal.Signals]) -> None:
        for signum in signums:
            self._previous.setdefault(signum, signal.signal(signum, self._on_signal))

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.received = 0
        # Before the Trainer registers its handlers (it runs callbacks' setup first): Lightning
        # then sees a SIGUSR1 handler and does not add its in-handler auto-requeue.
        self._install([self.requeue_signal])
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False  # this callback requeues

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After the Trainer registered its SIGTERM handler, which broadcasts from inside the
        # handler under DDP; ours replaces it while training runs, and the Trainer restores the
        # original handlers when fit ends.
        self._install(self.stop_signals)
        self._agreed = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.world_size == 1:
            if self.received:
                self._save_and_stop(trainer)
            return
        # Signals reach the processes at slightly different times: any process that got one decides
        # for all, so every process saves the same step. Each step's all-reduce is read at the next
        # step's end, done on the GPU by then: reading it at once would wait for the whole step.
        agreed = int(self._agreed.value()) if self._agreed is not None else 0
        flag = torch.full((), float(self.received), device=pl_module.device)  # a fill, not a host copy
        self._agreed = HostCopy(trainer.strategy.reduce(flag, reduce_op="max"))
        if agreed:
            self.received = agreed
            self._save_and_stop(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A signal after the last training step: last.ckpt already holds the final state.
        if self.received:
            rank_zero_info(f"{signal.Signals(self.received).name} received after training: stopping before the test")
            raise Preempted(128 + self.received)

    def _save_and_stop(self, trainer: L.Trainer) -> None:
        received = signal.Signals(self.received)
        folder = Path(trainer.strategy.broadcast(str(run_dir(trainer)) if trainer.is_global_zero else None))
        path = folder / "checkpoints" / f"interrupted-step{trainer.global_step}.ckpt"
        for logger in trainer.loggers:
            logger.save()  # buffered metrics (CSVLogger flushes every 100 steps) would be lost
        # Every process takes part (sharded strategies need it); the whole training state, said so
        # (Lightning logs "`weights_only` was not set" when left to its default).
        trainer.save_checkpoint(path, weights_only=False)
        self.saved_path = path
        rank_zero_info(f"{received.name} received: saved {path} at global step {trainer.global_step}")
        trainer.strategy.barrier("PreemptionCheckpoint")  # all saved before the requeue stops the job

        job_id = slurm_job_id()
        if received == self.requeue_signal and self.requeue and job_id:
            # The requeue stops this job with SIGTERM right away; the processes exit through
            # Preempted instead of being stopped halfway through their teardown.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            requeued = self._requeue(job_id) if trainer.is_global_zero else False
            if trainer.strategy.broadcast(requeued):
                sys.unraisablehook = _quiet_about_the_stopped_wandb_service
                raise Preempted(0)
            # Not requeued: the job must not end as if it had (exit 0 reads COMPLETED to SLURM).
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        own = own_config(folder) or "<your config>"  # the run's own config, saved when fit started
        command = f"python -m {__name__.split('.')[0]} fit --config {own} --resume=true"
        rank_zero_info(f"Continue this run with {self.continue_with or f'`make resume` ({command})'}")
        raise Preempted(128 + received)

    @staticmethod
    def _requeue(job_id: str, attempts: int = 3) -> bool:
        """``scontrol requeue`` the job; retried, since a busy controller can time out. True when done."""
        for attempt in range(attempts):
            done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
            if done.returncode == 0:
                rank_zero_info(f"Requeued SLURM job {job_id}; it resumes from this checkpoint")
                return True
            if attempt < attempts - 1:
                time.sleep(2**attempt)
        rank_zero_warn(
            f"scontrol requeue {job_id} failed ({done.returncode}, {attempts} tries): {done.stderr.strip()}; "
            "the job stops here without being requeued"
        )
        return False
