"""Checkpoint files: written atomically, and read with errors that name the file and what is wrong.

Lightning 2.6's TorchCheckpointIO serialises the checkpoint in memory, writes it to a temporary
file that fsspec makes in the system's temp folder (``tempfile.mkstemp``) and moves that over the
target. When the temp folder is on another file system than the checkpoints (a node's local
``/tmp``, checkpoints on a shared file system: the usual cluster) the move is a copy into the
target, so a kill or a full disk during it leaves a truncated ``last.ckpt`` where the previous
good one was; and nothing is flushed to disk, so a crash of the machine can lose a save that
seemed done. :class:`AtomicCheckpointIO` writes the temporary file beside the target, fsyncs it,
renames it over the target (``os.replace``, atomic on POSIX and Windows) and fsyncs the folder
(the rename itself is durable only then), so the target is always either the previous checkpoint
or the new one, whole{% if cookiecutter.task == "image-classification" %} (``tests/test_faults.py`` simulates both failures){% endif %}.
"""

import errno
import os
import pickle
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from {{ cookiecutter.package_name }}.engine.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be read or does not fit the model; the message names the file and the fix."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose saves replace the target only once the new file is complete on disk, and
    whose next load of a checkpoint the CLI already read and checked returns that copy (:meth:`hand_over`)."""

    _handed: tuple[str, dict[str, Any]] | None = None

    def hand_over(self, path: _PATH, checkpoint: dict[str, Any]) -> None:
        """The next :meth:`load_checkpoint` of ``path`` returns ``checkpoint`` instead of reading the file again.

        The CLI reads a checkpoint once, on the CPU with ``weights_only=True``, to check it before anything
        is built; Lightning's restore would read the whole file a second time (a language model's
        gigabytes). The copy is handed over once and dropped when taken or replaced.
        """
        self._handed = (os.path.realpath(path), checkpoint)

    def load_checkpoint(
        self, path: _PATH, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        handed, self._handed = self._handed, None
        if handed is not None and "://" not in str(path) and handed[0] == os.path.realpath(path):
            return handed[1]
        if map_location is None:
            return super().load_checkpoint(path, weights_only=weights_only)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # remote storage (s3://, gs://): its own semantics
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
        try:
            with partial.open("wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())
            os.replace(partial, path)
            _fsync_folder(path.parent)
        except (OSError, RuntimeError) as error:
            # torch.save reports a full disk as "unexpected pos ..." (its zip writer), not ENOSPC.
            if _disk_is_full(error, path.parent):
                raise DiskFullError(
                    f"no space left on the disk of {path.parent} while writing {path.name} (the previous "
                    f"{path.name}, if any, is unchanged): free space there, `make resume`"
                ) from error
            raise
        finally:
            partial.unlink(missing_ok=True)


class DiskFullError(UserError, OSError):
    """A checkpoint could not be written for lack of disk space; nothing saved before was touched."""


def _disk_is_full(error: BaseException, folder: Path, margin: int = 64 << 20) -> bool:
    """ENOSPC (or EDQUOT), or a write error while less than ``margin`` bytes are free in ``folder``."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return shutil.disk_usage(folder).free < margin
    except OSError:
        return False


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (a rename into it) to disk; a no-op where folders cannot be opened (Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_checkpoint(path: _PATH) -> dict[str, Any]:
    """Load a checkpoint on CPU with ``torch.load(weights_only=True)``.

    Raises:
        CheckpointError: the file is missing, truncated, corrupt, not a checkpoint, or holds
            Python objects that weights-only loading refuses; the message names the file.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint. `ls {path.parent}` shows the ones there are.")
    if (path / "meta.pt").is_file():  # the fsdp2 preset's distributed checkpoint: shards in a folder
        raise CheckpointError(
            f"{path}: a distributed checkpoint (a folder of shards); gather it into one file first: "
            f"python -m {__package__}.sharding {path} (then give {path}.consolidated)"
        )
    if not path.is_file():  # a FIFO would block the read forever
        raise CheckpointError(f"{path}: not a regular file, so not a checkpoint")
    _check_members(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        message = str(error)
        # torch's message is a page long; the code it refused is named in one of two forms:
        # "Unsupported global: GLOBAL builtins.print", "Trying to load unsupported GLOBAL posix.system ...".
        code = re.search(r"unsupported global:? (?:global )?([\w.]+)", message, flags=re.IGNORECASE)
        if code is None:  # garbage where the pickle should be ("Unsupported operand 110")
            problem = next((line.strip() for line in message.splitlines() if "Unsupported" in line), "")
            raise CheckpointError(
                f"{path}: not a readable checkpoint: corrupt, or not written by torch.save ({problem})"
            ) from error
        raise CheckpointError(
            f"{path}: holds Python code ({code.group(1)}) that weights-only loading (torch.load(weights_only=True)) "
            "refuses to run. Load only checkpoints you trust; this project's own never hold code."
        ) from error
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as error:
        raise CheckpointError(
            f"{path}: not a readable checkpoint: truncated (a save that was interrupted) or corrupt ({error}). "
            "Use another one, e.g. the run's checkpoints/last.ckpt or a best epoch*.ckpt."
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (no 'state_dict' in it)")
    return checkpoint


# torch.save stores every member of its zip file uncompressed: a compressed one is a file made to expand.
def _check_members(path: Path) -> None:
    """Refuse a checkpoint whose zip members are compressed (torch.save never compresses them): a small
    file that would expand to any size in memory. A legacy (non-zip) file is left to ``torch.load``."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as archive:
            packed = [info.filename for info in archive.infolist() if info.compress_type != zipfile.ZIP_STORED]
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # torch.load names what is wrong with it
    if packed:
        raise CheckpointError(
            f"{path}: holds compressed members ({packed[0]}), which torch.save never writes: a file made to "
            "expand in memory, refused"
        )


FITS_FIX = (
    "Use the config the checkpoint was trained with: --config <run>/config.yaml, which is read as data (the classes "
    "it names must be of the declared type; --trust MODULE for a module of yours it names)."
)


def check_fits(checkpoint: dict[str, Any], model: torch.nn.Module, path: _PATH, fix: str = FITS_FIX) -> None:
    """Compare a checkpoint's ``state_dict`` with ``model``'s: same keys, same shapes; ``fix`` ends the message.

    Raises:
        CheckpointError: naming the missing and unexpected keys and the shape mismatches (first
            five of each), e.g. a checkpoint of another net or another number of classes.
    """
    saved, expected = checkpoint["state_dict"], model.state_dict()
    missing = sorted(expected.keys() - saved.keys())
    unexpected = sorted(saved.keys() - expected.keys())
    shapes = [
        f"{key}: checkpoint {tuple(saved[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in sorted(expected.keys() & saved.keys())
        # Entries that are not tensors (a module's get_extra_state) have no shape.
        if isinstance(saved[key], torch.Tensor) and tuple(saved[key].shape) != tuple(expected[key].shape)
    ]
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes))
        if items
    ]
    if problems:
        raise CheckpointError(f"{path} does not fit the configured model: " + "; ".join(problems) + ". " + fix)


def net_differences(checkpoint: dict[str, Any], hparams: Any) -> list[str]:
    """The net's constructor arguments that differ between ``checkpoint``'s config and ``hparams``, as
    ``net.init_args.<name>: <saved> in the checkpoint, <now> here`` (empty when either has no net config)."""

    def arguments(config: Any) -> dict[str, Any]:
        net = config.get("net") if hasattr(config, "get") else None
        init_args = net.get("init_args") if hasattr(net, "get") else None
        return dict(init_args) if hasattr(init_args, "keys") else {}

    saved, now = arguments(checkpoint.get("hyper_parameters") or {}), arguments(hparams)
    return [
        f"net.init_args.{name}: {saved.get(name)!r} in the checkpoint, {now.get(name)!r} here"
        for name in sorted(saved.keys() | now.keys())
        if saved.get(name) != now.get(name)
    ]


def check_optimizer_continues(checkpoint: dict[str, Any], model: torch.nn.Module, path: _PATH) -> None:
    """Refuse to resume ``fit`` when the configured optimizer or schedule class is not the checkpoint's.

    Lightning would load the old optimizer's state into the new one and fail at the first step
    (AdamW -> SGD: ``KeyError: 'momentum'``), or continue a schedule with another one's state.

    Raises:
        CheckpointError: naming both classes and the two ways on.
    """
    saved = checkpoint.get("hyper_parameters") or {}
    configured = getattr(model, "hparams", {})
    for key in ("optimizer", "lr_scheduler"):
        before, now = _class_path(saved.get(key)), _class_path(configured.get(key))
        if before and now and before != now:
            raise CheckpointError(
                f"{path} was trained with model.init_args.{key} {before}, and the config now says {now}: "
                f"the saved {key} state cannot continue in another class. Resume with the run's own config "
                "(--config <run>/config.yaml), or start a new run (without --resume or --ckpt_path)"
            )


def _class_path(config: Any) -> str | None:
    return config.get("class_path") if isinstance(config, dict) else None
