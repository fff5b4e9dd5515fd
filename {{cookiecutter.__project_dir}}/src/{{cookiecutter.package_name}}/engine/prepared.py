"""Prepared data sets: a task's data decoded, tokenized or encoded once (``make prepare``), then read
from disk by every training process with memory flat in the data set's size.

A prepared data set is a folder::

    manifest.json                 what it is: kind, settings, source fingerprint, counts, fields, state
    train/<field>-00000.bin ...   fixed-size records of one field, in shards of about ``shard_bytes``
    val/...  test/...

Each field is a raw little-endian array of ``(N, *shape)`` records of one NumPy dtype (the layout of
nanoGPT's ``train.bin``: https://github.com/karpathy/nanoGPT/blob/master/data/openwebtext/prepare.py),
cut into shards so that it can be copied, synced or checked a piece at a time. :class:`DiskArray`
reads records with ``os.pread``: nothing is memory-mapped, so the pages a long run touches count in
the kernel's page cache (shared, evictable), never in a process's resident memory. Any index can be
read at any time, so a prepared split is a map-style data set and :class:`engine.ResumableDataModule`'s
order function (seed, epoch, rank, batches done) resumes it exactly, under DDP too, with each rank
reading only its share.

LitData (``litdata.optimize`` / ``StreamingDataset``) was considered: it installs torchvision, which
breaks ``import lightning`` beside a CPU torch (measured when this was chosen: ``import lightning``
fails with ``operator torchvision::nms does not exist``), and its loader state is reported not to be
restored on resume (Lightning-AI/litData#775); an order function over fixed-size records needs no
loader state at all.

:class:`PreparedWriter` makes the folder atomically: everything is written into a hidden
``.<name>.partial-<pid>`` folder beside it and renamed into place only after the manifest is
written and every file is flushed to disk; an interrupted or failed prepare (disk full, a bad file,
Ctrl-C, a kill) leaves at most that hidden folder, which training never reads and the next prepare
removes. :func:`open_prepared` checks the manifest, every shard's size and the source's
fingerprint before training starts.

**A prepared folder is data, checked before training** (:func:`open_prepared`). Every field of the
manifest is validated (one line naming the field when not): the kind and settings, the splits and
fields the DataModule reads, each dtype (a plain number type the DataModule expects, never an
object), shapes of positive sizes, counts that add up. Shard names are plain file names, and each
shard must be a regular file inside the folder (no ``..``, no absolute path, no symlink out of it).
Each shard's SHA-256 is recorded at prepare; every run hashes every shard in full when the whole set
is at most ``FULL_CHECK_BYTES`` (1 GiB, about 1.6 s at the 670 MB/s one core hashes here), and
otherwise every shard up to ``SMALL_SHARD_BYTES`` in full (labels, targets, row numbers) and the
first, middle and last MiB of larger ones. ``python -m <package>.prepare --verify <folder>`` hashes
everything, on every core. Labels and token ids are checked against the number of classes or the
vocabulary (:meth:`Prepared.check_below`). The source's fingerprint is compared only when the
source the run's config names is the one recorded (a manifest cannot make a run walk another folder).
"""

import hashlib
import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConfigError, DataError, MissingFileError
from .files import read_text

# The names other code may import from this module: its lid (see engine/__init__.py).
__all__ = [
    "COUNT",
    "MAPPING",
    "NAMES",
    "ArrayRecords",
    "DiskArray",
    "PreparedWriter",
    "fingerprint",
    "is_preparing",
    "numbers",
    "one_of",
    "open_prepared",
    "prepare_command",
    "preparing",
    "verify",
]

MANIFEST = "manifest.json"
# A manifest lists shards and their hashes: a few KB for any data set prepare writes; more is not one of ours.
MANIFEST_LIMIT = 64 << 20
FORMAT_VERSION = 2  # 2: each shard's SHA-256 and sampled SHA-256
SHARD_BYTES = 256 * 2**20  # large enough for few files, small enough to copy or check one at a time
FULL_CHECK_BYTES = 2**30  # a prepared set up to this size is hashed in full on every run
SMALL_SHARD_BYTES = 64 * 2**20  # larger sets: shards up to this size in full, larger ones sampled
SAMPLE_BYTES = 2**20  # the sampled hash: this many bytes at the start, the middle and the end
MAX_RECORD_BYTES = 2**30
SPLIT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*")
SHARD_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.bin")
SHA256 = re.compile(r"[0-9a-f]{64}")
NUMBER_KINDS = "biuf"  # bool, signed and unsigned integers, floats: never objects, strings or void
_preparing = False


@contextmanager
def preparing() -> Iterator[None]:
    """While ``make prepare`` builds the configured classes: a DataModule reads no data eagerly (the CLI
    builds the model too, from sizes linked from the data, but prepare never uses it), so the source
    is read only by ``write_prepared``, a block at a time."""
    global _preparing
    _preparing = True
    try:
        yield
    finally:
        _preparing = False


def is_preparing() -> bool:
    """Inside :func:`preparing`."""
    return _preparing


def prepare_command(kind: str) -> str:
    """The command that (re-)prepares a data set, for error messages (``kind``: the DataModule's class name)."""
    return f'make prepare OUT=<folder> ARGS="<the --config and --data options of this run ({kind})>"'


# ---- the source's fingerprint ---------------------------------------------------------------------
def fingerprint(root: str | Path, files: Iterable[Path]) -> dict[str, Any]:
    """A record of ``files`` under ``root`` that changes when one is added, removed, resized or touched.

    Returns ``{"root", "files", "bytes", "sha256"}``; the hash is of every file's path relative to
    ``root``, size in bytes and modification time in ns (a stat, never the contents: cheap for a
    million files).
    """
    root = Path(root).resolve()
    digest, count, total = hashlib.sha256(), 0, 0
    for file in sorted(Path(f).resolve() for f in files):
        stat = file.stat()
        relative = file.relative_to(root).as_posix() if file.is_relative_to(root) else file.name
        digest.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        count, total = count + 1, total + stat.st_size
    return {"root": str(root), "files": count, "bytes": total, "sha256": digest.hexdigest()}


# ---- reading ------------------------------------------------------------------------------------
class DiskArray:
    """A read-only ``(N, *shape)`` array of one dtype stored in shard files, read with ``os.pread``.

    ``array[i]`` is one record (``shape``), ``array[a:b]`` records a to b (``(b - a, *shape)``, across
    shards as needed), both fresh NumPy arrays. File descriptors are opened on first read in each
    process (DataLoader workers fork: a descriptor shared across a fork would share its offset; pread
    has none, but each process still opens its own so that a worker never relies on the parent's).

    Args:
        files: the shard files, in order.
        counts: records in each shard.
        dtype, shape: of one record (``shape=()`` for a scalar per record, e.g. a label or a token).
    """

    def __init__(self, files: Sequence[Path], counts: Sequence[int], dtype: np.dtype, shape: Sequence[int]) -> None:
        self.files, self.counts = [Path(f) for f in files], list(counts)
        self.dtype, self.record_shape = np.dtype(dtype), tuple(shape)
        self.record_bytes = self.dtype.itemsize * int(np.prod(self.record_shape, dtype=np.int64))
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)  # (shards + 1,)
        self._fds: list[int] | None = None
        self._pid: int | None = None

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self), *self.record_shape)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise IndexError("DiskArray slices take step 1")
            return self.read(start, max(start, stop))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} is out of range for {len(self)} records")
        return self.read(index, index + 1).reshape(self.record_shape)  # a writable array, even of shape ()

    def read(self, start: int, stop: int) -> np.ndarray:
        """Records ``start`` to ``stop`` (``(stop - start, *shape)``), one pread per shard touched."""
        if self._pid != os.getpid():
            self._fds, self._pid = [os.open(f, os.O_RDONLY) for f in self.files], os.getpid()
        out = np.empty((stop - start, *self.record_shape), dtype=self.dtype)
        view = out.reshape(-1).view(np.uint8)
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        done = 0
        while start + done < stop:
            first = start + done - self.starts[shard]  # record within the shard
            take = min(stop - start - done, self.counts[shard] - first)
            nbytes = take * self.record_bytes
            chunk = os.pread(self._fds[shard], nbytes, int(first) * self.record_bytes)
            if len(chunk) != nbytes:
                raise DataError(f"{self.files[shard]}: shorter than its manifest says; re-run make prepare")
            view[done * self.record_bytes : done * self.record_bytes + nbytes] = np.frombuffer(chunk, np.uint8)
            done, shard = done + take, shard + 1
        return out

    def __getstate__(self) -> dict[str, Any]:  # descriptors stay with their process
        return {**self.__dict__, "_fds": None, "_pid": None}

    def __del__(self) -> None:
        if self._fds is not None and self._pid == os.getpid():
            for fd in self._fds:
                os.close(fd)


class ArrayRecords:
    """A map-style data set of aligned arrays: item i is ``tuple(torch.from_numpy(array[i]) for array)``.

    The disk twin of ``torch.utils.data.TensorDataset``.
    """

    def __init__(self, *arrays: DiskArray) -> None:
        if len({len(array) for array in arrays}) != 1:
            raise ValueError(f"ArrayRecords: arrays of different lengths {[len(a) for a in arrays]}")
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index: int) -> tuple:
        import torch

        return tuple(torch.from_numpy(array[index]) for array in self.arrays)


class Prepared:
    """An opened, checked prepared data set: ``manifest``, ``state`` and ``split(name)`` -> fields."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path, self.manifest = path, manifest

    @property
    def state(self) -> dict[str, Any]:
        """What the DataModule saved with the data (class names, statistics, vocabulary, ...)."""
        return self.manifest["state"]

    @property
    def settings(self) -> dict[str, Any]:
        return self.manifest["settings"]

    def count(self, split: str) -> int:
        return self.manifest["splits"][split]["count"]

    def check_below(self, field: str, limit: int, what: str) -> None:
        """Every value of ``field`` in every split lies in ``[0, limit)`` (labels, token ids), read a block at a time.

        Raises:
            ValueError: naming the split, the field, the value found and ``what`` the limit is.
        """
        if not _natural(limit):
            raise DataError(f"data.prepared={self.path}/{MANIFEST}: state gives {limit!r} as {what}, not a count")
        for split in self.manifest["splits"]:
            array = self.split(split).get(field)
            if array is None or (array.dtype.kind == "u" and np.iinfo(array.dtype).max < limit):
                continue  # absent, or no value of its type can reach the limit (bytes below 256): nothing to read
            step = max(1, (16 << 20) // max(1, array.record_bytes))
            for start in range(0, len(array), step):
                block = array.read(start, min(len(array), start + step))
                low, high = block.min(initial=0), block.max(initial=0)
                if low < 0 or high >= limit:
                    bad = low if low < 0 else high
                    raise DataError(
                        f"data.prepared={self.path}: {split}/{field} holds {bad}, outside 0..{limit - 1} ({what}); "
                        f"the folder was altered since prepare: run `{prepare_command(self.manifest['kind'])}`"
                    )

    def split(self, name: str) -> dict[str, DiskArray]:
        """The fields of split ``name``, each a :class:`DiskArray`."""
        entry = self.manifest["splits"][name]
        return {
            field: DiskArray(
                [self.path / name / shard["file"] for shard in spec["shards"]],
                [shard["count"] for shard in spec["shards"]],
                spec["dtype"],
                spec["shape"],
            )
            for field, spec in entry["fields"].items()
        }


def open_prepared(
    path: str | Path,
    kind: str,
    settings: dict[str, Any],
    source_files: Callable[[Path], Iterable[Path]] | None = None,
    source: str | Path | None = None,
    fields: dict[str, Sequence[str]] | None = None,
    state: dict[str, "StateCheck"] | None = None,
    splits: Sequence[str] = (),
) -> Prepared:
    """Open the prepared data set at ``path`` after checking, before any training, that it can be trained on.

    Args:
        path: the folder ``make prepare`` wrote (``data.prepared``).
        kind: what the DataModule reads (its class name); another kind is refused.
        settings: the DataModule's settings that shaped the data (image size, tokenizer, ...): each
            must equal the manifest's.
        source_files: lists the source's files under a folder, as prepare fingerprinted them.
        source: the source the run's config names (``data.root``, ``data.path``): its files are
            compared with the fingerprint when it is the source the manifest records and is still
            there (data that moved after prepare is not checked: the prepared copy suffices). None:
            no check.
        fields: the fields the DataModule reads in every split and the dtypes each may have (NumPy
            ``dtype.str``, e.g. ``"|u1"``); a field it does not list is refused, one it lists but marks
            optional by a leading ``"?"`` in its name may be absent.
            None: any numeric fields, any splits.
        state: what the DataModule reads from the manifest's ``state``: each key and a check of its
            value (:data:`NAMES`, :func:`one_of`, :func:`numbers`, :data:`COUNT`, :data:`MAPPING`).
        splits: the splits the DataModule reads ("train", "val", "test").

    Raises:
        FileNotFoundError: no such folder (names ``data.prepared`` and the command that makes it).
        ValueError: not a prepared data set, of another kind or version, made with other settings, a
            malformed manifest field, a shard outside the folder, missing, of the wrong size or with
            other contents than prepare wrote, or a source that changed since (each names the file
            or field and the fix).
    """
    path = Path(path).expanduser()
    remake = prepare_command(kind)
    if not path.is_dir():
        raise MissingFileError(f"data.prepared={path}: no such folder; make it with `{remake}`")
    try:
        manifest = json.loads(read_text(path / MANIFEST, MANIFEST_LIMIT, f"data.prepared={path}"))
    except FileNotFoundError:
        raise DataError(
            f"data.prepared={path}: not a prepared data set (no {MANIFEST}: an interrupted prepare?); run `{remake}`"
        ) from None
    except DataError:  # not a regular file, or too large: named as it is
        raise
    except (OSError, ValueError, RecursionError) as error:  # RecursionError: JSON nested deeper than Python goes
        problem = "nested too deep" if isinstance(error, RecursionError) else str(error)
        raise DataError(f"data.prepared={path}/{MANIFEST} does not read ({problem}); run `{remake}`") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION or manifest.get("kind") != kind:
        found = manifest if isinstance(manifest, dict) else {}
        raise DataError(
            f"data.prepared={path}: prepared for {found.get('kind')} (format {found.get('format')}), "
            f"not {kind} (format {FORMAT_VERSION}); run `{remake}`"
        )
    _check_manifest(manifest, path, remake, fields, state or {}, splits)
    for key, value in settings.items():
        made = manifest["settings"].get(key)
        if _jsonable(value) != made:
            raise ConfigError(
                f"data.{key}={value!r}, but data.prepared={path} was prepared with {key}={made!r}: set data.{key} "
                f"to {made!r}, or prepare again with the new value (`{remake}`)"
            )
    shards = []
    for split, entry in manifest["splits"].items():
        for field, spec in entry["fields"].items():
            record = np.dtype(spec["dtype"]).itemsize * int(np.prod(spec["shape"], dtype=np.int64))
            for shard in spec["shards"]:
                file = _shard_file(path, split, shard["file"], remake)
                expected = shard["count"] * record
                if file.stat().st_size != expected:
                    raise DataError(
                        f"data.prepared: {file} has {file.stat().st_size} bytes, the manifest says {expected} "
                        f"({field}: {shard['count']} records; truncated or overwritten); run `{remake}`"
                    )
                shards.append((file, shard))
    full = sum(file.stat().st_size for file, _ in shards) <= FULL_CHECK_BYTES
    for file, shard in shards:
        if full or file.stat().st_size <= SMALL_SHARD_BYTES:
            check_shard(file, shard, remake)
        elif sampled_sha256(file) != shard["sample_sha256"]:
            raise _altered(file, "sampled SHA-256", remake)
    recorded = manifest["source"] if isinstance(manifest.get("source"), dict) else {}
    root = recorded.get("root")
    same = source is not None and isinstance(root, str) and Path(source).expanduser().resolve() == Path(root)
    if source_files is not None and same and Path(root).exists():
        now = fingerprint(recorded["root"], source_files(Path(recorded["root"])))
        if now["sha256"] != recorded["sha256"]:
            raise DataError(
                f"data.prepared={path}: its source {recorded['root']} changed since prepare "
                f"({recorded['files']} files, {recorded['bytes']} bytes then; {now['files']} files, "
                f"{now['bytes']} bytes now): prepare again (`{remake}`), or move the source away to train on the "
                "prepared copy as it is"
            )
    return Prepared(path, manifest)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _check_manifest(
    manifest: dict[str, Any],
    path: Path,
    remake: str,
    fields: dict[str, Sequence[str]] | None,
    state: dict[str, "StateCheck"],
    required_splits: Sequence[str] = (),
) -> None:
    """Every manifest field a reader relies on, well-formed; raises DataError naming the first that is not."""

    def bad(where: str, problem: str) -> DataError:
        return DataError(f"data.prepared={path}/{MANIFEST}: {where} {problem}; run `{remake}`")

    for key in ("settings", "state", "splits"):
        if not isinstance(manifest.get(key), dict):
            raise bad(key, "is missing or not a mapping")
    missing_state = [key for key in state if key not in manifest["state"]]
    if missing_state:
        raise bad("state", f"lacks {', '.join(missing_state)}")
    for key, check in state.items():
        wanted = check(manifest["state"][key])
        if wanted is not None:
            raise bad(f"state.{key}", f"is {str(manifest['state'][key])[:80]!r}, not {wanted}")
    splits = manifest["splits"]
    expected = None if fields is None else {name.lstrip("?"): dtypes for name, dtypes in fields.items()}
    required = set() if fields is None else {name for name in fields if not name.startswith("?")}
    for split in required_splits:
        if split not in splits:
            raise bad("splits", f"has no {split!r} split")
    for split, entry in splits.items():
        if not isinstance(split, str) or not SPLIT_NAME.fullmatch(split):
            raise bad(f"splits.{split!r}", "is not a plain folder name")
        if not isinstance(entry, dict) or not isinstance(entry.get("fields"), dict) or not entry["fields"]:
            raise bad(f"splits.{split}.fields", "is missing or empty")
        count = entry.get("count")
        if not _natural(count):
            raise bad(f"splits.{split}.count", f"is {count!r}, not a count")
        absent = required - entry["fields"].keys()
        if absent:
            raise bad(f"splits.{split}.fields", f"lacks {', '.join(sorted(absent))}")
        for field, spec in entry["fields"].items():
            where = f"splits.{split}.fields.{field}"
            if expected is not None and field not in expected:
                raise bad(where, f"is not a field this DataModule reads ({', '.join(sorted(expected))})")
            if not isinstance(spec, dict):
                raise bad(where, "is not a mapping")
            try:
                dtype = np.dtype(spec.get("dtype"))
            except TypeError:
                raise bad(f"{where}.dtype", f"is {spec.get('dtype')!r}, not a NumPy dtype") from None
            allowed = expected.get(field) if expected is not None else None
            if dtype.kind not in NUMBER_KINDS or dtype.hasobject or (allowed and dtype.str not in allowed):
                wanted = ", ".join(allowed) if allowed else "a number type"
                raise bad(f"{where}.dtype", f"is {spec.get('dtype')!r}; this DataModule reads {wanted}")
            shape = spec.get("shape")
            if not isinstance(shape, list) or not all(_natural(size) and size > 0 for size in shape):
                raise bad(f"{where}.shape", f"is {shape!r}, not a list of positive sizes")
            if dtype.itemsize * math.prod(shape) > MAX_RECORD_BYTES:  # exact: int64 would overflow to 0
                raise bad(f"{where}.shape", f"is {shape!r}: a record over {MAX_RECORD_BYTES} bytes")
            shards = spec.get("shards")
            if not isinstance(shards, list):
                raise bad(f"{where}.shards", "is not a list")
            for index, shard in enumerate(shards):
                at = f"{where}.shards[{index}]"
                if not isinstance(shard, dict) or not _natural(shard.get("count")):
                    raise bad(at, "needs a file name and a count")
                if not isinstance(shard.get("file"), str) or not SHARD_NAME.fullmatch(shard["file"]):
                    raise bad(f"{at}.file", f"is {shard.get('file')!r}, not a plain file name of this folder")
                for key in ("sha256", "sample_sha256"):
                    if not isinstance(shard.get(key), str) or not SHA256.fullmatch(shard[key]):
                        raise bad(f"{at}.{key}", "is missing or not a SHA-256")
            if sum(shard["count"] for shard in shards) != count:
                raise bad(f"{where}.shards", f"hold {sum(s['count'] for s in shards)} records, the split {count}")


# ---- checks of the manifest's ``state``: each returns None, or what the value should have been ------------
StateCheck = Callable[[Any], str | None]


def NAMES(value: Any) -> str | None:  # noqa: N802 -- used as a constant
    """A non-empty list of distinct, non-empty strings (class names)."""
    ok = isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)
    return None if ok and len(set(value)) == len(value) else "a list of distinct names"


def COUNT(value: Any) -> str | None:  # noqa: N802
    """A whole number >= 0 (a count of samples, a size)."""
    return None if _natural(value) else "a count"


def MAPPING(value: Any) -> str | None:  # noqa: N802
    """A mapping (a dict of further state, checked by its own reader)."""
    return None if isinstance(value, dict) else "a mapping"


def one_of(*choices: Any) -> StateCheck:
    """One of ``choices`` exactly (a mode, a kind)."""

    def check(value: Any) -> str | None:
        return None if value in choices else "one of " + ", ".join(map(repr, choices))

    return check


def numbers(positive: bool = False) -> StateCheck:
    """A non-empty list of finite numbers (``positive``: each above 0), or None."""

    def check(value: Any) -> str | None:
        if value is None:
            return None
        items = value if isinstance(value, list) else []
        finite = [isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in items]
        ok = isinstance(value, list) and value and all(finite) and (not positive or all(v > 0 for v in value))
        return None if ok else f"a list of finite{' positive' if positive else ''} numbers"

    return check


def _natural(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shard_file(path: Path, split: str, name: str, remake: str) -> Path:
    """The shard ``split/name`` of the prepared folder, a regular file inside it (no link leads out)."""
    folder = path / split
    file = folder / name
    if not file.is_file() and not file.is_symlink():
        raise DataError(f"data.prepared: {file} is missing (deleted since prepare?); run `{remake}`")
    inside = path.resolve()
    if folder.is_symlink() or file.is_symlink() or not file.resolve().is_relative_to(inside) or not file.is_file():
        raise DataError(
            f"data.prepared: {file} is a link or not a regular file of the folder ({file.resolve()}); prepare "
            f"writes plain files only: run `{remake}`"
        )
    return file


def file_sha256(file: Path) -> str:
    """SHA-256 of a whole file (hex), read 16 MiB at a time."""
    digest = hashlib.sha256()
    with open(file, "rb") as stream:
        while chunk := stream.read(16 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def sampled_sha256(file: Path) -> str:
    """SHA-256 of the file's size and of SAMPLE_BYTES at its start, middle and end (hex): a constant-cost check."""
    size = file.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(file, "rb") as stream:
        for offset in sorted({0, max(0, size // 2 - SAMPLE_BYTES // 2), max(0, size - SAMPLE_BYTES)}):
            stream.seek(offset)
            digest.update(stream.read(SAMPLE_BYTES))
    return digest.hexdigest()


def check_shard(file: Path, shard: dict[str, Any], remake: str) -> None:
    """Raise DataError when ``file``'s SHA-256 is not the one prepare recorded."""
    if file_sha256(file) != shard["sha256"]:
        raise _altered(file, "SHA-256", remake)


def _altered(file: Path, check: str, remake: str) -> DataError:
    return DataError(
        f"data.prepared: {file} has another {check} than prepare recorded (overwritten or damaged since, though "
        f"of the same size); run `{remake}`"
    )


def verify(path: str | Path, workers: int | None = None) -> tuple[int, int]:
    """Hash every shard of the prepared data set at ``path`` in full, on ``workers`` threads (hashlib frees the GIL).

    Returns:
        ``(shards, bytes)`` checked.

    Raises:
        ValueError: the first shard whose SHA-256 differs, or a malformed manifest (see :func:`open_prepared`).
    """
    path = Path(path).expanduser()
    try:
        manifest = json.loads(read_text(path / MANIFEST, MANIFEST_LIMIT, f"--verify {path}"))
    except DataError:  # not a regular file, or too large: named as it is
        raise
    except (OSError, ValueError, RecursionError) as error:
        raise DataError(f"--verify {path}: no readable {MANIFEST} ({type(error).__name__})") from None
    kind = manifest.get("kind") if isinstance(manifest, dict) else None
    remake = prepare_command(str(kind))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        raise DataError(f"--verify {path}: not a prepared data set of format {FORMAT_VERSION}; run `{remake}`")
    _check_manifest(manifest, path, remake, None, {})
    shards = [
        (_shard_file(path, split, shard["file"], remake), shard)
        for split, entry in manifest["splits"].items()
        for spec in entry["fields"].values()
        for shard in spec["shards"]
    ]
    with ThreadPoolExecutor(workers or os.cpu_count()) as pool:
        list(pool.map(lambda item: check_shard(item[0], item[1], remake), shards))
    return len(shards), sum(file.stat().st_size for file, _ in shards)


# ---- writing ------------------------------------------------------------------------------------
class PreparedWriter:
    """Write a prepared data set atomically (see the module docstring); use as a context manager.

    ``append(split, field=array, ...)`` adds records (every array of one call has the same length N;
    ``(N, *shape)``, the same dtype and shape for a field every time); ``state`` is saved in the
    manifest for the DataModule to restore. Leaving the ``with`` block without an error publishes
    the folder; with an error, nothing is left.

    Args:
        out: the folder to make. An existing prepared data set there is replaced (atomically: the old
            one stays readable until the new one is complete); any other existing path is refused.
        kind, settings, source: recorded in the manifest (see :func:`open_prepared`).
        shard_bytes: bytes per shard file (the last one of a field may be smaller).

    Raises:
        ValueError: ``out`` exists and is not a prepared data set; on exit, a write that failed
            (disk full: names the file; nothing is published).
    """

    def __init__(
        self,
        out: str | Path,
        kind: str,
        settings: dict[str, Any],
        source: dict[str, Any],
        shard_bytes: int = SHARD_BYTES,
    ) -> None:
        self.out = Path(out).expanduser().absolute()
        if self.out.exists() and not (self.out / MANIFEST).is_file():
            raise ConfigError(
                f"--out={self.out} exists and is not a prepared data set: choose a new folder (prepare never "
                "overwrites anything else)"
            )
        self.manifest: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "kind": kind,
            "settings": _jsonable(settings),
            "source": source,
            "splits": {},
            "state": {},
        }
        self.shard_bytes = shard_bytes
        self.partial = self.out.parent / f".{self.out.name}.partial-{os.getpid()}"
        self._open: dict[tuple[str, str], Any] = {}  # (split, field) -> the shard file being written
        self._digests: dict[tuple[str, str], Any] = {}  # (split, field) -> SHA-256 of the shard being written

    def __enter__(self) -> "PreparedWriter":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        for stale in self.out.parent.glob(f".{self.out.name}.partial-*"):  # left by a killed prepare
            pid = stale.name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and _alive(int(pid))) or int(pid) == os.getpid():
                shutil.rmtree(stale, ignore_errors=True)
        self.partial.mkdir()
        return self

    def state(self, **values: Any) -> None:
        """Save JSON values for the DataModule (class names, statistics, ...)."""
        self.manifest["state"].update(_jsonable(values))

    def append(self, split: str, **fields: np.ndarray) -> None:
        lengths = {len(array) for array in fields.values()}
        if len(lengths) != 1:
            raise ValueError(f"append({split}): fields of different lengths {lengths}")
        entry = self.manifest["splits"].setdefault(split, {"count": 0})
        entry.setdefault("fields", {})
        entry["count"] += lengths.pop()
        for name, array in fields.items():
            array = np.ascontiguousarray(array)
            spec = entry["fields"].setdefault(
                name, {"dtype": array.dtype.str, "shape": list(array.shape[1:]), "shards": []}
            )
            if np.dtype(spec["dtype"]) != array.dtype or list(array.shape[1:]) != spec["shape"]:
                raise ValueError(f"append({split}.{name}): {array.dtype} {array.shape[1:]} after {spec}")
            record = max(1, array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64)))
            per_shard = max(1, self.shard_bytes // record)
            done = 0
            while done < len(array):
                if not spec["shards"] or spec["shards"][-1]["count"] >= per_shard:
                    self._close(split, name)
                    spec["shards"].append({"file": f"{name}-{len(spec['shards']):05d}.bin", "count": 0})
                    (self.partial / split).mkdir(exist_ok=True)
                    self._open[split, name] = open(self.partial / split / spec["shards"][-1]["file"], "wb")  # noqa: SIM115
                    self._digests[split, name] = hashlib.sha256()
                shard = spec["shards"][-1]
                take = min(len(array) - done, per_shard - shard["count"])
                data = array[done : done + take].tobytes()
                self._open[split, name].write(data)
                self._digests[split, name].update(data)
                shard["count"] += take
                done += take

    def _close(self, split: str, name: str) -> None:
        file = self._open.pop((split, name), None)
        if file is not None:
            file.flush()
            os.fsync(file.fileno())
            file.close()
            shard = self.manifest["splits"][split]["fields"][name]["shards"][-1]
            shard["sha256"] = self._digests.pop((split, name)).hexdigest()
            shard["sample_sha256"] = sampled_sha256(Path(file.name))

    def __exit__(self, kind, error, traceback) -> None:
        try:
            if error is None:
                for key in list(self._open):
                    self._close(*key)
                manifest = self.partial / MANIFEST
                manifest.write_text(json.dumps(self.manifest, indent=1) + "\n", encoding="utf-8")
                with open(manifest, "rb") as file:
                    os.fsync(file.fileno())
                self._publish()
        except OSError as failure:
            error = failure
        finally:
            for file in self._open.values():
                file.close()
            if error is not None:
                shutil.rmtree(self.partial, ignore_errors=True)
        if isinstance(error, OSError):  # disk full, a read-only folder, ...: one line, nothing published
            where = getattr(error, "filename", None) or self.partial
            raise DataError(
                f"prepare: writing {where} failed ({error.strerror or error}); nothing was written to {self.out}: "
                "free space (or choose another --out) and run it again"
            ) from None

    def _publish(self) -> None:
        """Rename the complete folder into place; an old prepared data set there goes only after."""
        old = None
        if self.out.exists():
            old = self.out.parent / f".{self.out.name}.old-{os.getpid()}"
            self.out.rename(old)
        self.partial.rename(self.out)
        _fsync_folder(self.out.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_folder(folder: Path) -> None:
    if sys.platform == "win32":
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
