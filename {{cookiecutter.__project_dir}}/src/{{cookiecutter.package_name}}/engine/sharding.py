"""FSDP2 for the ``fsdp2`` preset: the net sharded by ``fully_shard`` over the data-parallel mesh of Lightning's
``ModelParallelStrategy``, block by block, then as a whole.

Each module whose class the net names in ``_no_split_modules`` (Hugging Face's attribute for the same
question: which blocks must stay whole on one device) becomes an FSDP unit of its own, so a process
gathers one block's full parameters at a time; the net itself is the last unit (its embeddings, head
and whatever no block holds). Parameters become ``DTensor`` shards: each process keeps ``1/N`` of every
parameter, gradient and optimizer state. References: PyTorch's ``fully_shard``
(https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html) and Lightning's
ModelParallelStrategy (https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/fsdp.html).
:class:`FSDP2Strategy` is that strategy with every process data-parallel and checkpoints written whole
or not at all; :func:`consolidate` gathers such a checkpoint into the one file ``make predict`` and
friends read (``python -m <package>.engine.sharding <run>/checkpoints/last.ckpt``).
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from .checkpoints import (
    AtomicCheckpointIO,
    check_distributed_checkpoint,
    confine_callback_paths,
)


def sharded_units(net: nn.Module) -> list[nn.Module]:
    """The net's blocks that become FSDP units: its modules whose class name is in ``net._no_split_modules``."""
    names = set(getattr(net, "_no_split_modules", None) or ())
    return [module for module in net.modules() if module is not net and type(module).__name__ in names]


def is_sharded(net: nn.Module) -> bool:
    """True once :func:`shard_net` (``fully_shard``) has run on ``net``: Lightning calls configure_model again
    on a module it already set up (validate, test after fit)."""
    return isinstance(net, FSDPModule)


def shard_net(net: nn.Module, mesh: DeviceMesh, precision: str) -> None:
    """Shard ``net`` in place over ``mesh`` (1-D): each of :func:`sharded_units`, then the whole net.

    Under ``bf16-mixed`` the units compute in bfloat16 and reduce gradients in float32
    (``MixedPrecisionPolicy``); parameters and optimizer state stay float32 shards.
    """
    policy = MixedPrecisionPolicy()
    if str(precision).startswith("bf16"):
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for unit in sharded_units(net):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(net, mesh=mesh, mp_policy=policy)


class FSDP2Strategy(ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` for FSDP2 alone: one data-parallel mesh over every process.

    ``ModelParallelStrategy``'s "auto" sizes are data parallel across nodes and tensor parallel within a
    node; without tensor parallelism the data-parallel size is the world size, known only once the
    Trainer has set the devices and nodes. A distributed checkpoint (a folder of shards) is written
    under a temporary name and renamed once every process has written its shard, so a run killed
    while saving leaves the previous checkpoint, never a folder that cannot be resumed.

    Args:
        save_distributed_checkpoint: each process writes its shard into a checkpoint folder (True);
            False gathers the whole state into one file on rank 0 (one process's memory must hold it).
        process_group_backend: "nccl" on GPUs and "gloo" on CPUs by default.
    """

    def __init__(self, save_distributed_checkpoint: bool = True, process_group_backend: str | None = None) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
        )

    def setup_environment(self) -> None:
        self._data_parallel_size = self.num_nodes * self.num_processes
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        path = Path(self.broadcast(str(filepath)))
        partial = path.with_name(f".{path.name}.partial")
        if self.global_rank == 0 and partial.exists():  # what a run killed while saving left
            shutil.rmtree(partial)
        self.barrier("fsdp2_checkpoint_partial")
        super().save_checkpoint(checkpoint, partial, storage_options)
        self.barrier("fsdp2_checkpoint_written")
        if self.global_rank == 0:
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
            os.replace(partial, path)
            if isinstance(self.checkpoint_io, AtomicCheckpointIO):
                self.checkpoint_io.saved_into(path)  # its older checkpoints there may be removed
        self.barrier("fsdp2_checkpoint_renamed")

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        if Path(checkpoint_path).is_dir():
            check_distributed_checkpoint(Path(checkpoint_path))  # torch's reader unpickles its .metadata
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        confine_callback_paths(checkpoint, Path(checkpoint_path).parent)  # data: paths in its own folder only
        return checkpoint


def consolidate(folder: str | Path, out: str | Path | None = None) -> Path:
    """Gather the distributed checkpoint ``folder`` (FSDP2Strategy's shards) into one file, by default
    ``<folder>.consolidated``; return its path. One process, no GPU: torch's ``dcp_to_torch_save`` reads
    every shard. The file has a Lightning checkpoint's layout (``state_dict`` with the unsharded names,
    ``optimizer_states``, the rest of ``meta.pt``), so ``make predict`` and friends load it (CKPT=file).

    The folder's ``.metadata`` is checked first (:func:`engine.checkpoints.check_distributed_checkpoint`): torch's
    reader unpickles it.

    Raises:
        FileNotFoundError: ``folder`` is not a distributed checkpoint (no ``meta.pt`` in it).
        CheckpointError: its ``.metadata`` names code or is corrupt.
    """
    folder = Path(folder)
    if not (folder / "meta.pt").is_file():
        raise FileNotFoundError(f"{folder}: not a distributed checkpoint folder (no meta.pt in it)")
    check_distributed_checkpoint(folder)
    with tempfile.TemporaryDirectory() as scratch:
        gathered = Path(scratch, "state.pt")
        dcp_to_torch_save(folder, gathered)
        state = torch.load(gathered, map_location="cpu", weights_only=True)
    checkpoint = torch.load(folder / "meta.pt", map_location="cpu", weights_only=True)
    checkpoint["state_dict"] = state.pop("state_dict")
    checkpoint["optimizer_states"] = [state[key] for key in sorted(state) if key.startswith("optimizer_")]
    path = Path(out) if out is not None else folder.with_name(folder.name + ".consolidated")
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    torch.save(checkpoint, partial)
    os.replace(partial, path)
    return path


if __name__ == "__main__":
    print(consolidate(*sys.argv[1:3]))
