"""Who started the processes (srun, torchrun or Lightning itself), and the checks that keep them consistent.

Under SLURM, ``srun`` starts one task per device and Lightning's SLURMEnvironment reads each
task's rank from the environment; under torchrun, TorchElasticEnvironment does the same. In
both cases the processes exist before the Trainer does, so the Trainer's ``num_nodes x devices``
must equal the number of processes started, or every process trains alone on its own copy of the
model. Lightning catches some of these mismatches, not all (``srun -n1`` with ``devices=2``
trains silently with world size 1): :func:`check_world_size` catches the rest.
"""

import os

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

from .errors import LaunchError


def slurm_job_id() -> str | None:
    """The id of the SLURM job this process belongs to, ``<array job>_<task>`` for array jobs.

    It stays the same when the job is requeued, so it names the run across pre-emptions. None
    outside SLURM and in interactive allocations (``salloc`` then ``bash``), where Lightning
    does not use SLURM either (``SLURMEnvironment.detect()``).
    """
    if not SLURMEnvironment.detect():
        return None
    array_job, array_task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return os.environ.get("SLURM_JOB_ID")


def check_world_size(trainer: L.Trainer) -> None:
    """Stop when an external launcher started a different number of processes than the Trainer asks for.

    Args:
        trainer: a Trainer built in this process (before fit, validate, test or predict).

    Raises:
        RuntimeError: under srun or torchrun, ``trainer.num_nodes * trainer.num_devices`` differs
            from the world size the launcher set up (``SLURM_NTASKS`` or ``WORLD_SIZE``).
    """
    # Checked from the environment, not the strategy: with devices=1 the Trainer picks a
    # single-device strategy that has no cluster environment, yet srun may have started several.
    if SLURMEnvironment.detect():
        launcher, started = "srun (SLURM_NTASKS)", int(os.environ["SLURM_NTASKS"])
    elif TorchElasticEnvironment.detect():
        launcher, started = "torchrun (WORLD_SIZE)", int(os.environ["WORLD_SIZE"])
    else:
        return  # Lightning starts the processes itself, so they match by construction
    asked = trainer.num_nodes * trainer.num_devices
    if asked == started:
        return
    raise LaunchError(
        f"trainer.num_nodes={trainer.num_nodes} x trainer.devices={trainer.num_devices} asks for {asked} processes, "
        f"but {launcher} started {started}. Start one task per device (sbatch --nodes=N --ntasks-per-node=D, "
        f"or torchrun --nnodes=N --nproc-per-node=D) and set --trainer.num_nodes=N --trainer.devices=D to match."
    )
