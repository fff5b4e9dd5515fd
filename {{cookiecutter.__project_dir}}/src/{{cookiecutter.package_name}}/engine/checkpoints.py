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
or the new one, whole (the image task's fault tests simulate both failures).
"""

import builtins
import collections
import contextlib
import dataclasses
import enum
import errno
import io
import os
import pickle
import re
import shutil
import socket
import warnings
import zipfile
from pathlib import Path, PurePath
from typing import IO, Any

import torch
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from .errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be read or does not fit the model; the message names the file and the fix."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose saves replace the target only once the new file is complete on disk, whose
    next load of a checkpoint the CLI already read and checked returns that copy (:meth:`hand_over`), and
    which removes only checkpoints in a folder this process saves checkpoints into (:meth:`remove_checkpoint`).
    """

    _handed: tuple[str, dict[str, Any]] | None = None
    _saved_into: set[str] | None = None

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
            checkpoint = handed[1]
        elif map_location is None:
            checkpoint = super().load_checkpoint(path, weights_only=weights_only)
        else:
            checkpoint = super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if "://" not in str(path):
            confine_callback_paths(checkpoint, Path(path).parent)
        return checkpoint

    def saved_into(self, path: _PATH) -> None:
        """Note that a checkpoint was saved at ``path``: its folder's checkpoints may be removed (a strategy that
        writes its own files, FSDP2's shards, calls this)."""
        if self._saved_into is None:
            self._saved_into = set()
        self._saved_into.add(_folder_key(path))

    def remove_checkpoint(self, path: _PATH) -> None:
        """Remove the checkpoint ``path`` (ModelCheckpoint replacing one of its best or last) only when it lies in a
        folder this process has saved a checkpoint into; anything else is left alone, said in one line.

        A checkpoint's callback states name paths, and a received file is data: a ``best_model_path`` of
        ``local:///home/me`` made Lightning's own removal (recursive) delete that folder. A local file or
        link is unlinked (a link's target is kept); a local folder only when it is a distributed checkpoint.
        """
        if _folder_key(path) not in (self._saved_into or set()):
            warnings.warn(f"{path}: not removed: not in a folder this run saves checkpoints into", stacklevel=2)
            return
        if "://" in str(path):  # remote storage (s3://, gs://) the config chose: its own semantics
            super().remove_checkpoint(path)
            return
        path = Path(path)
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir() and (path / "meta.pt").is_file():
            shutil.rmtree(path)

    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        if "://" in str(path):  # remote storage (s3://, gs://): its own semantics
            super().save_checkpoint(checkpoint, path, storage_options)
            self.saved_into(path)
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if _folder_key(path) not in (self._saved_into or set()):
            remove_stale_partials(path.parent)  # the first save of this process here: what killed writers left
        partial = path.with_name(f".{path.name}{_PARTIAL}{socket.gethostname()}-{os.getpid()}")
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
        self.saved_into(path)


def _folder_key(path: _PATH) -> str:
    """The folder of ``path`` as one string: a local folder's real path, a URL's part before its last ``/``."""
    text = str(path)
    if "://" in text:
        return text.rstrip("/").rsplit("/", 1)[0]
    return os.path.realpath(Path(text).absolute().parent)


# A save in progress: ``.<name>.partial-<host>-<pid>`` beside its target (``.<name>.partial-<pid>`` before 2026-12).
_PARTIAL = ".partial-"
_PARTIAL_NAME = re.compile(r"\.(?P<target>.+)\.partial-(?:(?P<host>.+)-)?(?P<pid>\d+)")


def remove_stale_partials(folder: Path) -> list[Path]:
    """Remove the partial checkpoint files in ``folder`` whose writer is gone (a process of this host that no
    longer runs: killed while saving), and return them. A partial file of another host is left alone, as is
    anything else: only regular files with the name :class:`AtomicCheckpointIO` gives its saves in progress.
    """
    removed = []
    for path in folder.glob(f".*{_PARTIAL}*"):
        match = _PARTIAL_NAME.fullmatch(path.name)
        if match is None or path.is_symlink() or not path.is_file():
            continue
        if match["host"] not in (None, socket.gethostname()) or _is_running(int(match["pid"])):
            continue
        path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def _is_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


# The path fields of ModelCheckpoint's state (lightning/pytorch/callbacks/model_checkpoint.py, state_dict).
_CHECKPOINT_PATH_FIELDS = ("best_model_path", "kth_best_model_path", "last_model_path")


def confine_callback_paths(checkpoint: dict[str, Any], folder: Path) -> None:
    """Make every path a checkpoint's ModelCheckpoint states name a checkpoint in ``folder``, the checkpoint's own
    folder, in place: a path elsewhere becomes the file of the same name in ``folder`` when there is one (a run
    folder moved), else nothing (``""``). Lightning would delete such a path when a better checkpoint comes, and
    test a ``best_model_path`` after fit: a received checkpoint is data, and cannot name what a run touches.
    """
    folder = Path(os.path.realpath(folder))
    for state in (checkpoint.get("callbacks") or {}).values():
        if not isinstance(state, dict) or "best_model_path" not in state:
            continue
        for field in _CHECKPOINT_PATH_FIELDS:
            if field in state:
                state[field] = _inside(state[field], folder)
        if isinstance(state.get("best_k_models"), dict):
            kept = {_inside(path, folder): score for path, score in state["best_k_models"].items()}
            state["best_k_models"] = {path: score for path, score in kept.items() if path}


def _inside(path: Any, folder: Path) -> str:
    """``path`` when it names an entry of ``folder``, else ``folder`` / its name when that exists, else ``""``."""
    if not isinstance(path, str) or not path or "://" in path:
        return ""
    if Path(os.path.realpath(Path(path).absolute().parent)) == folder:
        return path
    moved = folder / Path(path).name
    return str(moved) if Path(path).name and os.path.lexists(moved) else ""


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
    checkpoint = _load_checked(path)
    if "state_dict" not in checkpoint:
        raise CheckpointError(f"{path}: not a Lightning checkpoint (no 'state_dict' in it)")
    return checkpoint


def read_distributed_state(folder: Path) -> dict[str, Any]:
    """What a distributed checkpoint folder holds besides its shards (``meta.pt``: the arguments, loop,
    callback and DataModule states), read as :func:`read_checkpoint` reads a file once the folder passed
    :func:`check_distributed_checkpoint`: the states a resume checks before Lightning restores them.

    Raises:
        CheckpointError: as both of those do, naming the folder or its ``meta.pt``.
    """
    check_distributed_checkpoint(folder)
    return _load_checked(folder / "meta.pt")


def _load_checked(path: Path) -> dict[str, Any]:
    """A regular file read with ``torch.load(weights_only=True)`` on the CPU, its members and tensors checked."""
    check_members(path)
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
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path}: not a Lightning checkpoint (it holds a {type(checkpoint).__name__})")
    check_tensors(checkpoint, path)
    return checkpoint


def check_tensors(checkpoint: Any, path: _PATH) -> None:
    """Refuse a tensor anywhere in a loaded checkpoint (weights, optimizer and callback states) that spans more
    elements than its storage holds: a stride-0 or overlapping view, which ``torch.save`` keeps as written. Such a
    tensor is a few bytes in the file and its shape is any size: a model built to fit it, or a copy of it,
    allocates the whole shape (5.6 KB made ``predict`` take a gigabyte more).

    Raises:
        CheckpointError: naming the tensor's key, its shape and its storage's size.
    """
    stack: list[tuple[Any, str, int]] = [(checkpoint, "", 0)]
    seen: set[int] = set()  # a container shared many times (a 1.7 KB file of 10^12 values) is walked once
    while stack:
        value, where, depth = stack.pop()
        if depth > 64:
            raise CheckpointError(f"{path}: nested more than 64 levels deep at {where}: not a checkpoint")
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage().nbytes() if value.device.type != "meta" else 0
            if value.numel() and value.device.type != "meta" and storage < _span(value):
                raise CheckpointError(
                    f"{path}: the tensor {where} of shape {tuple(value.shape)} is a view of {storage} bytes "
                    "(strides that repeat elements): a file made to expand in memory, refused"
                )
        elif isinstance(value, dict | list | tuple) and id(value) not in seen:
            seen.add(id(value))
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend((item, f"{where}.{key}" if where else str(key), depth + 1) for key, item in items)


def _span(tensor: torch.Tensor) -> int:
    """Bytes a tensor's elements would take laid out one after another (what a copy of it allocates)."""
    return tensor.numel() * tensor.element_size()


class _DistributedMetadataUnpickler(pickle.Unpickler):
    """Unpickles a distributed checkpoint's ``.metadata`` admitting only what torch writes there: the dataclasses
    and enums of ``torch.distributed.checkpoint``, ``torch.Size``, dtypes, layouts and paths. Torch's own reader
    (``FileSystemReader.read_metadata``) unpickles it with plain ``pickle.load``, which runs any code."""

    def find_class(self, module: str, name: str) -> Any:
        found = super().find_class(module, name) if module.split(".")[0] in ("torch", "pathlib") else None
        if module.startswith("torch.distributed.checkpoint.") and (
            dataclasses.is_dataclass(found) or (isinstance(found, type) and issubclass(found, enum.Enum))
        ):
            return found
        if found is torch.Size or isinstance(found, torch.dtype) or found is torch.serialization._get_layout:
            return found
        if isinstance(found, type) and issubclass(found, PurePath):
            return found
        if (module, name) in _PLAIN_CONTAINERS:  # containers whose constructors only hold what they are given
            return collections.OrderedDict if module == "collections" else getattr(builtins, name)
        if (module, name) == ("builtins", "getattr"):  # how some Python 3.11 releases pickle an enum member
            return _enum_member
        raise pickle.UnpicklingError(f"unsupported global {module}.{name}")


def _enum_member(cls: Any, name: Any) -> enum.Enum:
    """``getattr(cls, name)`` for a member of an admitted enum, nothing else."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError("getattr of anything but an enum member")


_PLAIN_CONTAINERS = {("collections", "OrderedDict"), *(("builtins", n) for n in ("set", "frozenset", "complex"))}


def check_distributed_checkpoint(folder: Path) -> None:
    """Refuse a distributed checkpoint folder (FSDP2's shards) unless every part of it is data, before torch reads it.

    torch's reader unpickles the ``.metadata`` with plain ``pickle.load``: it may name only the metadata
    classes torch writes. It then reads each item from the file and span the metadata names, undoes any
    transform named there, and unpickles an item stored as bytes (an optimizer's ``param_groups``) with
    ``weights_only=False``: each item must lie within a regular file of the folder, untransformed, as a
    ``torch.save`` archive of stored (never compressed) members, and a bytes item must load with
    ``weights_only=True``. The folder needs its ``meta.pt`` too.

    Raises:
        CheckpointError: naming the folder and what it holds.
    """
    metadata = folder / ".metadata"
    if not (folder / "meta.pt").is_file() or not metadata.is_file() or metadata.is_symlink():
        raise CheckpointError(f"{folder}: not a distributed checkpoint (no regular meta.pt and .metadata files in it)")
    try:
        with metadata.open("rb") as file:
            read = _DistributedMetadataUnpickler(file).load()
    except Exception as error:  # any reason the file is not torch's metadata: refused, named
        raise CheckpointError(
            f"{metadata}: not the metadata torch writes ({type(error).__name__}: {str(error)[:120]}): a distributed "
            "checkpoint is data, and this one names code or is corrupt; refused"
        ) from error
    problem = _distributed_items_problem(folder, read)
    if problem is not None:
        raise CheckpointError(f"{folder}: {problem}: a distributed checkpoint is data; refused")


def _distributed_items_problem(folder: Path, metadata: Any) -> str | None:
    """What is wrong with the items a distributed checkpoint's ``metadata`` points torch's reader at, or None."""
    from torch.distributed.checkpoint.metadata import Metadata

    tables = (getattr(metadata, "storage_data", None), getattr(metadata, "state_dict_metadata", None))
    if not isinstance(metadata, Metadata) or not all(isinstance(table, dict) for table in tables):
        return "its .metadata does not hold torch's Metadata with its storage table"
    sizes: dict[str, int] = {}
    for index, stored in metadata.storage_data.items():
        item, name = getattr(index, "fqn", index), getattr(stored, "relative_path", None)
        if not isinstance(name, str) or name in ("", ".", "..") or PurePath(name).name != name or "\\" in name:
            return f"item {item} is stored in {name!r}, not in a file of the folder"
        if name not in sizes:
            path = folder / name
            if path.is_symlink() or not path.is_file():
                return f"item {item} is stored in {name}, not a regular file of the folder"
            sizes[name] = path.stat().st_size
        start, length = getattr(stored, "offset", None), getattr(stored, "length", None)
        if not (type(start) is int and type(length) is int and start >= 0 and 0 <= length <= sizes[name] - start):
            return f"item {item} spans bytes {start!r}+{length!r} of {name}, which has {sizes[name]:,}"
        if getattr(stored, "transform_descriptors", None):
            return f"item {item} is stored transformed ({stored.transform_descriptors!r}), which expands when undone"
    with contextlib.ExitStack() as stack:  # each file opened once, however many items it holds
        files = {name: stack.enter_context((folder / name).open("rb")) for name in sizes}
        return _unsafe_item(metadata, files)


def _unsafe_item(metadata: Any, files: dict[str, IO[bytes]]) -> str | None:
    """The first item of ``metadata``'s (checked) storage table whose bytes in ``files`` are not plain data."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    for index, stored in metadata.storage_data.items():
        named = isinstance(index, MetadataIndex) and index == MetadataIndex(index.fqn)  # how bytes are looked up
        pickled = named and isinstance(metadata.state_dict_metadata.get(index.fqn), BytesStorageMetadata)
        span = _Span(files[stored.relative_path], stored.offset, stored.length)
        item = io.BytesIO(span.read()) if pickled else span  # a pickled item is small: read once, in memory
        packed = _compressed_member(item)
        if packed is not None:
            return f"item {getattr(index, 'fqn', index)} holds a compressed member ({packed}), made to expand"
        if pickled:
            try:
                item.seek(0)
                torch.load(item, map_location="cpu", weights_only=True)
            except Exception as error:  # torch would unpickle it with weights_only=False: code, or corrupt
                return f"item {index.fqn} is not plain data ({type(error).__name__}: {str(error)[:120]})"
    return None


class _Span(io.RawIOBase):
    """``length`` bytes of ``file`` from ``start``, as a file of their own (what zipfile and torch.load read)."""

    def __init__(self, file: IO[bytes], start: int, length: int) -> None:
        super().__init__()
        self.file, self.start, self.length, self.position = file, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.length}[whence]
        self.position = max(0, base + offset)
        return self.position

    def readinto(self, buffer: Any) -> int:
        self.file.seek(self.start + self.position)
        data = self.file.read(max(0, min(len(buffer), self.length - self.position)))
        buffer[: len(data)] = data
        self.position += len(data)
        return len(data)


# torch.save stores every member of its zip file uncompressed: a compressed one is a file made to expand.
def check_members(path: Path) -> None:
    """Refuse a checkpoint whose zip members are compressed (torch.save never compresses them): a small
    file that would expand to any size in memory. A legacy (non-zip) file is left to ``torch.load``."""
    with open(path, "rb") as file:
        packed = _compressed_member(file)
    if packed is not None:
        raise CheckpointError(
            f"{path}: holds compressed members ({packed}), which torch.save never writes: a file made to "
            "expand in memory, refused"
        )


def _compressed_member(file: IO[bytes]) -> str | None:
    """The name of a compressed member of the zip archive ``file``, or None (none, or not a zip: torch.load
    names what is wrong with it)."""
    try:
        if not zipfile.is_zipfile(file):
            return None
        with zipfile.ZipFile(file) as archive:
            return next((i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED), None)
    except (zipfile.BadZipFile, OSError, ValueError):
        return None


FITS_FIX = (
    "Use the config the checkpoint was trained with: --config <run>/config.yaml (a config is code: read one you "
    "received before you run it)."
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
        f"{key}: checkpoint {_shape(saved[key])} vs model {tuple(expected[key].shape)}"
        for key in sorted(expected.keys() & saved.keys())
        # Entries that are not tensors in the model (a module's get_extra_state) have no shape.
        if isinstance(expected[key], torch.Tensor) and _shape(saved[key]) != tuple(expected[key].shape)
    ]
    problems = [
        f"{label} ({len(items)}): {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
        for label, items in (("missing keys", missing), ("unexpected keys", unexpected), ("shape mismatches", shapes))
        if items
    ]
    if problems:
        raise CheckpointError(f"{path} does not fit the configured model: " + "; ".join(problems) + ". " + fix)


def _shape(value: Any) -> tuple[int, ...] | str:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else f"a {type(value).__name__}, not a tensor"


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


def check_training_state(checkpoint: dict[str, Any], trainer: Any, path: _PATH, optimizer: Any = None) -> None:
    """Refuse to resume from a checkpoint whose loop progress, callback, optimizer or schedule states differ in
    kind from what this run's own loops, callbacks and (``optimizer``: a throwaway ``(optimizer, schedule)``
    built as fit builds them) optimizer and schedule write, before Lightning restores them.

    Lightning loads these states as given: a counter that is text, a progress that is a list, a random
    state of another shape fails in the middle of its restore with a traceback, or later in training.
    Each is compared, position by position, with the state the live object gives now (the reference):
    a mapping where it has a mapping, with every key its loops need; numbers where it has numbers,
    text where text, tensors of its dtype where tensors.

    An optimizer has no per-parameter state before its first step: its reference is that of a copy of it
    stepped once over meta-device stand-ins of its parameters (no memory, no change to the live one). Step
    counts' shapes are compared too; a moment's shape is not, as it depends on which parameter a position
    holds, which a run that adds parameter groups (a backbone unfrozen mid-run) changes: the load compares
    them once it has paired them (:func:`guard_optimizer_loads`).
    An optimizer that cannot step on the meta device (``LBFGS``' closure, ``Adafactor``'s ``.item()``)
    is compared in its parameter groups only.

    Raises:
        CheckpointError: names the first position that differs, what it holds and what was expected.
    """
    loops = {name: getattr(trainer, name).state_dict() for name in ("fit_loop", "validate_loop", "test_loop")}
    callbacks = {callback.state_key: callback.state_dict() for callback in trainer.callbacks}
    saved_callbacks = checkpoint.get("callbacks") or {}
    problem = _unlike(checkpoint.get("loops"), loops, "loops", every_key=True) if "loops" in checkpoint else None
    version = checkpoint.get(VERSION_KEY)
    if problem is None and version is not None and not _is_version(version):  # Lightning's migration parses it
        problem = f"{VERSION_KEY} holds {type(version).__name__} {str(version)[:40]!r}, not a version"
    for key, live in zip(("optimizer_states", "lr_schedulers"), optimizer or (), strict=False):
        if problem is None and live is not None and key in checkpoint:
            reference = _stepped_state(live) if key == "optimizer_states" else live.state_dict()
            problem = _unlike(checkpoint[key], [reference], key, every_key=False, shapes=key == "optimizer_states")
    if problem is None and isinstance(saved_callbacks, dict):
        shared = {key: callbacks[key] for key in saved_callbacks.keys() & callbacks.keys()}
        problem = _unlike({key: saved_callbacks[key] for key in shared}, shared, "callbacks", every_key=False)
    if problem is not None:
        raise CheckpointError(
            f"{path}: {problem}; this is not a training state a run of this project writes: resume from a checkpoint "
            "`make train` wrote, or start a new run (without --resume or --ckpt_path)"
        )


def guard_optimizer_loads(optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> None:
    """Make every ``optimizer.load_state_dict`` (a resume's) refuse a per-parameter state of another shape.

    torch's load pairs saved states with parameters by position and keeps what it is given: a moment
    of another shape fails at the first step, in the middle of the kernel. :func:`check_training_state`
    cannot compare moments' shapes before the run is built (which parameter a position holds is known
    only then); this post-load hook does once the pairing is made, against the state a copy of the
    optimizer stepped on meta-device stand-ins would hold (so factored states, Adafactor's, are right too).

    Raises (from the load):
        CheckpointError: names the parameter, the state's key and both shapes.
    """

    def check(loaded: torch.optim.Optimizer) -> None:
        reference = _stepped_state(loaded)["state"]  # by position, as the load paired them
        names = {id(parameter): name for name, parameter in module.named_parameters()}
        parameters = [parameter for group in loaded.param_groups for parameter in group["params"]]
        for position, parameter in enumerate(parameters):
            expected = reference.get(position, {})
            for key, value in loaded.state.get(parameter, {}).items():
                shape = getattr(expected.get(key), "shape", None)
                if torch.is_tensor(value) and shape is not None and value.shape != shape:
                    raise CheckpointError(
                        f"the checkpoint's optimizer state {key!r} of parameter {names.get(id(parameter), position)} "
                        f"has shape {tuple(value.shape)}, where this run's has {tuple(shape)}; this is not a training "
                        "state a run of this project writes: resume from a checkpoint `make train` wrote, or start a "
                        "new run"
                    )

    optimizer.register_load_state_dict_post_hook(check)


VERSION_KEY = "pytorch-lightning_version"
# The versions Lightning writes (2.6.0, 2.6.0rc1, 2.7.0.dev20260101, 2.6.0+local): a subset of PEP 440's, all of which
# its migration's packaging.version.Version parses.
_VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?")


def _is_version(value: Any) -> bool:
    return isinstance(value, str) and _VERSION.fullmatch(value) is not None


def _stepped_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``optimizer``'s state after one step of a copy of it over meta-device stand-ins of its parameters (zero
    gradients: no memory is allocated, the live optimizer is untouched), or its state now where that fails."""
    groups = []
    for group in optimizer.param_groups:
        stand_ins = [torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad) for p in group["params"]]
        for stand_in in stand_ins:
            stand_in.grad = torch.empty_like(stand_in)
        kernel = {"fused": None} if group.get("fused") else {}  # the same state, from kernels that run on meta
        groups.append({**group, "params": stand_ins, **kernel})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            copy = type(optimizer)(groups)
            copy.step()
        state = copy.state_dict()
    except Exception:  # closures and .item() do not run on meta: the parameter groups only
        return optimizer.state_dict()
    return {**state, "param_groups": optimizer.state_dict()["param_groups"]}


def _unlike(saved: Any, reference: Any, where: str, every_key: bool, shapes: bool = False) -> str | None:
    """The first position (``where`` + keys) at which ``saved`` differs in kind from ``reference``, else None.

    ``every_key``: a key of a reference mapping must be in ``saved`` too (the loops read every one).
    ``shapes``: tensors must have the reference's shape too, but for meta-device ones (an optimizer's moments)."""
    stack = [(saved, reference, where)]
    while stack:
        saved, reference, where = stack.pop()
        kind = type(saved).__name__
        if isinstance(reference, dict):
            if not isinstance(saved, dict):
                return f"{where} holds {kind}, not a mapping"
            for key, value in reference.items():
                if key in saved:
                    stack.append((saved[key], value, f"{where}.{key}"))
                elif every_key:
                    return f"{where} has no {key!r}"
        elif isinstance(reference, list | tuple):
            if not isinstance(saved, list | tuple):
                return f"{where} holds {kind}, not a list"
            if reference:  # an item beyond the reference's last is of its last item's kind
                last = len(reference) - 1
                stack += [(item, reference[min(i, last)], f"{where}[{i}]") for i, item in enumerate(saved)]
        elif isinstance(reference, torch.Tensor):  # a score may be logged in another float width: floats match
            same = isinstance(saved, torch.Tensor) and (
                saved.is_floating_point() if reference.is_floating_point() else saved.dtype == reference.dtype
            )
            if not same:
                return f"{where} holds {getattr(saved, 'dtype', kind)}, not a tensor of {reference.dtype}"
            if shapes and not reference.is_meta and saved.shape != reference.shape:  # meta: a moment (above)
                return f"{where} holds a tensor of shape {tuple(saved.shape)}, not {tuple(reference.shape)}"
        elif reference is None:  # not set yet in the live object (a best score before any): plain values only
            if not (saved is None or isinstance(saved, bool | int | float | str | torch.Tensor)):
                return f"{where} holds {kind}, not a value"
        elif isinstance(reference, bool) or not isinstance(reference, int | float):
            if type(saved) is not type(reference):
                return f"{where} holds {kind}, not {type(reference).__name__}"
        elif isinstance(saved, bool) or not isinstance(saved, int if isinstance(reference, int) else int | float):
            return f"{where} holds {kind}, not a number ({type(reference).__name__})"
    return None


def _class_path(config: Any) -> str | None:
    return config.get("class_path") if isinstance(config, dict) else None
