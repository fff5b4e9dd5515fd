"""The prepared-data core (engine/prepared.py): records read back exactly, atomic writes, and every
damage named before training (each task's prepare -> train -> resume is tested beside its DataModule)."""

import errno
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.engine import prepared as core
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, DataError, MissingFileError
from {{ cookiecutter.package_name }}.engine.prepared import ArrayRecords, PreparedWriter, fingerprint, open_prepared

KIND, SETTINGS = "Toy", {"size": 4}


def write_toy(out: Path, source: Path, rows: int = 100, shard_bytes: int = 1000) -> dict[str, np.ndarray]:
    """A prepared data set of ``rows`` (4, 4) float32 records (64 bytes) and int64 labels, in small shards."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(rows, 4, 4)).astype(np.float32), "y": np.arange(rows, dtype=np.int64)}
    with PreparedWriter(out, KIND, SETTINGS, fingerprint(source, source.glob("*")), shard_bytes=shard_bytes) as w:
        for start in range(0, rows, 30):  # appends that do not line up with the shards
            w.append("train", x=arrays["x"][start : start + 30], y=arrays["y"][start : start + 30])
        w.state(classes=["a", "b"])
    return arrays


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "source"
    folder.mkdir()
    (folder / "a.txt").write_text("one")
    return folder


def test_records_read_back_exactly_across_shards_and_in_loader_workers(tmp_path: Path, source: Path) -> None:
    arrays = write_toy(tmp_path / "prep", source)
    prepared = open_prepared(tmp_path / "prep", KIND, SETTINGS, lambda root: root.glob("*"))
    fields = prepared.split("train")
    assert len(fields["x"].files) == 7  # 64-byte records, 15 per 1,000-byte shard
    assert prepared.state == {"classes": ["a", "b"]} and prepared.count("train") == 100
    assert np.array_equal(fields["x"][:], arrays["x"]) and np.array_equal(fields["y"][:], arrays["y"])
    assert np.array_equal(fields["x"][13:47], arrays["x"][13:47])  # a read across three shards
    assert np.array_equal(fields["x"][-1], arrays["x"][-1]) and fields["y"][44] == 44
    with pytest.raises(IndexError):
        fields["y"][100]
    records = ArrayRecords(fields["x"], fields["y"])
    for workers in (0, 2):  # forked workers open their own descriptors
        batches = list(DataLoader(records, batch_size=16, num_workers=workers))
        assert torch.equal(torch.cat([y for _, y in batches]), torch.arange(100))
        assert torch.equal(torch.cat([x for x, _ in batches]), torch.from_numpy(arrays["x"]))


def test_a_failed_prepare_leaves_nothing_and_keeps_the_old_data_set(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "prep"
    with pytest.raises(RuntimeError), PreparedWriter(out, KIND, SETTINGS, {}) as writer:
        writer.append("train", x=np.zeros((10, 3)))
        raise RuntimeError("a bad file halfway")
    assert list(tmp_path.iterdir()) == [source]  # no folder, no partial one

    write_toy(out, source)
    before = {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(RuntimeError), PreparedWriter(out, KIND, SETTINGS, {}) as writer:
        writer.append("train", x=np.ones((10, 3)))
        raise RuntimeError("interrupted")
    assert {p.name: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep", "source"]


def test_disk_full_is_one_line_and_publishes_nothing(tmp_path: Path, source: Path, monkeypatch) -> None:
    class FullDisk:
        def __init__(self, path, mode):
            self.name = path

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.name))

        def close(self):
            pass

    monkeypatch.setattr(core, "open", FullDisk, raising=False)
    with pytest.raises(DataError, match=r"writing .*x-00000.bin failed \(No space left on device\); nothing was"):
        write_toy(tmp_path / "prep", source)
    assert list(tmp_path.iterdir()) == [source]


def test_a_killed_prepare_is_never_read_and_the_next_one_clears_it(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "prep"
    script = (
        "import os, sys, numpy as np\n"
        "from {{ cookiecutter.package_name }}.engine.prepared import PreparedWriter\n"
        f"with PreparedWriter({str(out)!r}, 'Toy', dict(), dict()) as w:\n"
        "    w.append('train', x=np.zeros((5, 2)))\n"
        "    os.kill(os.getpid(), 9)\n"
    )
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert killed.returncode == -9
    (partial,) = tmp_path.glob(".prep.partial-*")
    assert not out.exists()
    with pytest.raises(MissingFileError, match=r"data.prepared=.*prep: no such folder; make it with `make prepare"):
        open_prepared(out, KIND, SETTINGS)
    with pytest.raises(DataError, match="not a prepared data set"):
        open_prepared(partial, KIND, SETTINGS)
    write_toy(out, source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prep", "source"]


def test_damage_is_named_before_training(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "prep"
    write_toy(out, source)
    shard = out / "train" / "x-00003.bin"
    with pytest.raises(ConfigError, match=r"data.size=8, but data.prepared=.* was prepared with size=4"):
        open_prepared(out, KIND, {"size": 8})
    with pytest.raises(DataError, match="prepared for Toy"):
        open_prepared(out, "Other", SETTINGS)

    shard.write_bytes(shard.read_bytes()[:-7])
    with pytest.raises(DataError, match=r"x-00003.bin has 953 bytes, the manifest says 960 .*truncated"):
        open_prepared(out, KIND, SETTINGS)
    shard.unlink()
    with pytest.raises(DataError, match=r"x-00003.bin is missing \(deleted since prepare\?\); run `make prepare"):
        open_prepared(out, KIND, SETTINGS)

    write_toy(out, source)
    (source / "b.txt").write_text("new")
    with pytest.raises(DataError, match=r"source .*source changed since prepare \(1 files, 3 bytes then; 2 files"):
        open_prepared(out, KIND, SETTINGS, lambda root: root.glob("*"))
    source.rename(tmp_path / "moved")  # the source moved away: the prepared copy is read as it is
    open_prepared(out, KIND, SETTINGS, lambda root: root.glob("*"))

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="exists and is not a prepared data set"):
        PreparedWriter(other, KIND, SETTINGS, {})
    assert (other / "notes.txt").read_text() == "keep"
