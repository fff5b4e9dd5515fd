"""Save a resumable checkpoint when the scheduler warns of pre-emption or the time limit, then requeue.

SLURM sends SIGUSR1 to every task some time before it stops a job (``#SBATCH
--signal=SIGUSR1@120``). Lightning's own auto-requeue handler saves the checkpoint inside the
signal handler, that is at whatever point each process happens to be. Under DDP that deadlocks:
one process enters the checkpoint's barrier while another waits in the training loop's per-step
broadcast, and both wait forever (seen with Lightning 2.6 and gloo). This callback only records
the signal in the handler; the processes then agree at the next batch boundary (one all-reduce)
and all save the same step. See https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html
for Lightning's SLURM requeue, which this replaces.
"""

import re
import signal
import subprocess
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from {{ cookiecutter.package_name }}.launch import slurm_job_id
from {{ cookiecutter.package_name }}.runs import run_dir


class Preempted(SystemExit):
    """Raised on every process once the pre-emption checkpoint is saved: ends fit, skips the test."""


class PreemptionCheckpoint(L.Callback):
    """On ``signal_name``, save ``hpc_ckpt_<n>.ckpt`` in the run folder at the next batch boundary, requeue, stop.

    The checkpoint holds the full training state (weights, optimizer, LR scheduler, loops), and
    the CLI resumes a requeued SLURM job from it (``runs.latest_checkpoint``). Outside SLURM the
    run stops after saving and prints the ``--ckpt_path`` to resume with.

    Args:
        signal_name: the warning signal, as SLURM's ``--signal`` names it (``SIGUSR1``).
        requeue: under SLURM, requeue the job with ``scontrol requeue`` once the checkpoint is saved.

    Raises:
        ValueError: ``signal_name`` is not a signal of this platform.
        Preempted: (a ``SystemExit`` with status 0) on every process after the checkpoint is saved.
    """

    def __init__(self, signal_name: str = "SIGUSR1", requeue: bool = True) -> None:
        if not hasattr(signal, signal_name) or not signal_name.startswith("SIG"):
            raise ValueError(
                f"PreemptionCheckpoint.signal_name: {signal_name!r} is not a signal name; use e.g. SIGUSR1"
            )
        self.signal = signal.Signals[signal_name]
        self.requeue = requeue
        self.received = False
        self.saved_path: Path | None = None
        self._previous_handler: Any = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.received = True  # acted on at the next batch boundary, never inside the handler

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Installed before the Trainer registers its own signal handlers (it runs callbacks'
        # setup first), so Lightning's in-handler auto-requeue sees a handler and stays off.
        if stage == "fit":
            self.received = False
            self._previous_handler = signal.signal(self.signal, self._on_signal)
            environment = getattr(trainer.strategy, "cluster_environment", None)
            if isinstance(environment, SLURMEnvironment):
                environment.auto_requeue = False  # this callback requeues; Lightning's handlers stay off

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self._previous_handler is not None:
            signal.signal(self.signal, self._previous_handler)
            self._previous_handler = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.world_size > 1:
            # Signals reach the processes at slightly different times: any process that got
            # it decides for all, so every process saves the same step.
            flag = torch.tensor(float(self.received), device=pl_module.device)
            self.received = bool(trainer.strategy.reduce(flag, reduce_op="max") > 0)
        if not self.received:
            return
        folder = Path(trainer.strategy.broadcast(str(run_dir(trainer)) if trainer.is_global_zero else None))
        numbers = [
            int(m.group(1))
            for p in folder.glob("hpc_ckpt_*.ckpt")
            if (m := re.fullmatch(r"hpc_ckpt_(\d+)\.ckpt", p.name))
        ]
        path = folder / f"hpc_ckpt_{max(numbers, default=0) + 1}.ckpt"
        for logger in trainer.loggers:
            logger.save()  # buffered metrics (CSVLogger flushes every 100 steps) would be lost
        trainer.save_checkpoint(path)  # every process takes part (sharded strategies need it)
        self.saved_path = path
        rank_zero_info(f"{self.signal.name} received: saved {path} at global step {trainer.global_step}")
        trainer.strategy.barrier("PreemptionCheckpoint")  # all saved before the requeue stops the job
        job_id = slurm_job_id()
        if job_id and self.requeue:
            # The requeue stops this job with SIGTERM right away; Lightning's SIGTERM handler
            # would then start collectives on half-stopped processes. Exit through Preempted instead.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if trainer.is_global_zero and job_id and self.requeue:
            self._requeue(job_id)
        elif not job_id:
            rank_zero_info(f"Resume with --ckpt_path={path}")
        raise Preempted(0)

    @staticmethod
    def _requeue(job_id: str) -> None:
        done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            rank_zero_info(f"Requeued SLURM job {job_id}; it resumes from this checkpoint")
        else:
            rank_zero_warn(f"scontrol requeue {job_id} failed ({done.returncode}): {done.stderr.strip()}")
