"""The prepared-data core (engine/prepared.py): records read back exactly, atomic writes, and every
damage named before training (each task's prepare -> train -> resume is tested beside its DataModule)."""

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from {{ cookiecutter.package_name }}.engine import prepared as core
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, DataError, MissingFileError
from {{ cookiecutter.package_name }}.engine.prepared import (
    NAMES,
    ArrayRecords,
    PreparedWriter,
    fingerprint,
    numbers,
    one_of,
    open_prepared,
)

KIND, SETTINGS = "Toy", {"size": 4}


def write_toy(out: Path, source: Path, rows: int = 100, shard_bytes: int = 1000) -> dict[str, np.ndarray]:
    """A prepared data set of ``rows`` (4, 4) float32 records (64 bytes) and int64 labels, in small shards."""
    rng = np.random.default_rng(0)
    arrays = {"x": rng.normal(size=(rows, 4, 4)).astype(np.float32), "y": np.arange(rows, dtype=np.int64)}
    with PreparedWriter(out, KIND, SETTINGS, fingerprint(source, source.glob("*")), shard_bytes=shard_bytes) as w:
        for start in range(0, rows, 30):  # appends that do not line up with the shards
            w.append("train", x=arrays["x"][start : start + 30], y=arrays["y"][start : start + 30])
        w.state(classes=["a", "b"], mode="L", std=[0.5])
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
    assert prepared.state == {"classes": ["a", "b"], "mode": "L", "std": [0.5]} and prepared.count("train") == 100
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
        open_prepared(out, KIND, SETTINGS, lambda root: root.glob("*"), source=source)
    source.rename(tmp_path / "moved")  # the source moved away: the prepared copy is read as it is
    open_prepared(out, KIND, SETTINGS, lambda root: root.glob("*"), source=source)

    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="exists and is not a prepared data set"):
        PreparedWriter(other, KIND, SETTINGS, {})
    assert (other / "notes.txt").read_text() == "keep"


# ---- a prepared folder is data: every manifest field and every shard checked before training ----------
FIELDS = {"x": ("<f4",), "y": ("<i8",)}
STATE = {"classes": NAMES, "mode": one_of("L", "RGB"), "std": numbers(positive=True)}  # as an image DataModule reads it


def rewrite_manifest(out: Path, change) -> None:
    manifest = json.loads((out / "manifest.json").read_text())
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


def first_shard(manifest: dict) -> dict:
    return manifest["splits"]["train"]["fields"]["x"]["shards"][0]


MALFORMED = {
    "a shard path out of the folder": (
        lambda m: first_shard(m).update(file="../../../outside/x.bin"),
        r"shards\[0\].file is '../../../outside/x.bin', not a plain file name of this folder",
    ),
    "an absolute shard path": (
        lambda m: first_shard(m).update(file="/etc/passwd"),
        r"shards\[0\].file is '/etc/passwd', not a plain file name",
    ),
    "an object dtype": (
        lambda m: m["splits"]["train"]["fields"]["x"].update(dtype="|O"),
        r"fields.x.dtype is '\|O'; this DataModule reads <f4",
    ),
    "integers where floats are read": (
        lambda m: m["splits"]["train"]["fields"]["x"].update(dtype="<i4"),
        r"fields.x.dtype is '<i4'; this DataModule reads <f4",
    ),
    "a negative shape": (
        lambda m: m["splits"]["train"]["fields"]["x"].update(shape=[4, -4]),
        r"fields.x.shape is \[4, -4\], not a list of positive sizes",
    ),
    "a shape of 0 and a count of 10^12": (
        lambda m: (m["splits"]["train"]["fields"]["x"].update(shape=[0]), m["splits"]["train"].update(count=10**12)),
        r"fields.x.shape is \[0\], not a list of positive sizes",
    ),
    "a shape beyond int64": (
        lambda m: m["splits"]["train"]["fields"]["x"].update(shape=[10**20]),
        r"fields.x.shape is \[100000000000000000000\]: a record over",
    ),
    "a shape whose product overflows int64 to 0": (
        lambda m: m["splits"]["train"]["fields"]["x"].update(shape=[2**32, 2**32]),
        r"fields.x.shape is \[4294967296, 4294967296\]: a record over",
    ),
    "a count the shards do not hold": (
        lambda m: m["splits"]["train"].update(count=10**12),
        r"fields.x.shards hold 100 records, the split 1000000000000",
    ),
    "no splits": (lambda m: m.pop("splits"), r"manifest.json: splits is missing or not a mapping"),
    "no checksum": (lambda m: first_shard(m).pop("sha256"), r"shards\[0\].sha256 is missing or not a SHA-256"),
    "class names that are one string": (
        lambda m: m["state"].update(classes="xy"),
        r"state.classes is 'xy', not a list of distinct names",
    ),
    "a state the DataModule does not know": (
        lambda m: m["state"].update(mode="CMYK"),
        r"state.mode is 'CMYK', not one of 'L', 'RGB'",
    ),
    "a std that is text": (
        lambda m: m["state"].update(std="abc"),
        r"state.std is 'abc', not a list of finite positive numbers",
    ),
    "a field the DataModule does not read": (
        lambda m: m["splits"]["train"]["fields"].update(z=m["splits"]["train"]["fields"]["x"]),
        r"fields.z is not a field this DataModule reads \(x, y\)",
    ),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_manifest_is_one_line_naming_the_field(tmp_path: Path, source: Path, case: str) -> None:
    out = tmp_path / "prep"
    write_toy(out, source)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x.bin").write_bytes(b"\0" * 960)  # what a path out of the folder would read
    change, expected = MALFORMED[case]
    rewrite_manifest(out, change)
    with pytest.raises(DataError, match=expected):
        open_prepared(out, KIND, SETTINGS, fields=FIELDS, state=STATE)


def test_a_manifest_nested_deeper_than_python_reads_is_one_line(tmp_path: Path, source: Path) -> None:
    out = tmp_path / "prep"
    write_toy(out, source)
    (out / "manifest.json").write_text("[" * 200_000)  # a RecursionError in json.loads
    with pytest.raises(DataError, match=r"manifest.json does not read \(nested too deep\); run `make prepare"):
        open_prepared(out, KIND, SETTINGS)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("form", ["fifo", "link to /dev/zero", "folder"])
def test_a_manifest_that_is_not_a_regular_file_never_blocks_or_fills_memory(
    tmp_path: Path, source: Path, form: str
) -> None:
    # A FIFO blocked the read until a writer came (make predict hung); /dev/zero read 6 GB before failing.
    out = tmp_path / "prep"
    write_toy(out, source)
    (out / "manifest.json").unlink()
    if form == "fifo":
        os.mkfifo(out / "manifest.json")
    elif form == "folder":
        (out / "manifest.json").mkdir()
    else:
        (out / "manifest.json").symlink_to("/dev/zero")
    with pytest.raises(DataError, match=r"manifest.json is not a regular file \(a folder, FIFO or device\): refused"):
        open_prepared(out, KIND, SETTINGS)
    with pytest.raises(DataError, match=r"--verify .* not a regular file"):
        core.verify(out)


def test_a_shard_must_be_a_plain_file_inside_the_folder_with_the_contents_prepare_wrote(
    tmp_path: Path, source: Path
) -> None:
    out = tmp_path / "prep"
    arrays = write_toy(out, source)
    labels = out / "train" / "y-00000.bin"
    outside = tmp_path / "outside.bin"
    outside.write_bytes(labels.read_bytes())  # the same bytes, the same size, outside the folder
    labels.unlink()
    labels.symlink_to(outside)
    with pytest.raises(DataError, match=r"y-00000.bin is a link or not a regular file of the folder"):
        open_prepared(out, KIND, SETTINGS, fields=FIELDS)

    labels.unlink()
    flipped = arrays["y"][: len(outside.read_bytes()) // 8][::-1].copy()  # the same size, labels reordered
    labels.write_bytes(flipped.tobytes())
    with pytest.raises(DataError, match=r"y-00000.bin has another SHA-256 than prepare recorded .* same size"):
        open_prepared(out, KIND, SETTINGS, fields=FIELDS)
    with pytest.raises(DataError, match=r"y-00000.bin has another SHA-256"):
        core.verify(out)


def test_a_large_set_is_sampled_on_every_run_and_verify_hashes_everything(
    tmp_path: Path, source: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "prep"
    monkeypatch.setattr(core, "SAMPLE_BYTES", 1000)  # samples of 1,000 bytes at the start, middle and end
    write_toy(out, source, rows=1000, shard_bytes=40_000)  # 64,000 bytes of x: 2 shards
    assert core.verify(out) == (3, 72_000)  # two x shards and one y shard, every byte hashed
    # As if the set were large: every shard above the small-shard size is only sampled.
    monkeypatch.setattr(core, "FULL_CHECK_BYTES", 0)
    monkeypatch.setattr(core, "SMALL_SHARD_BYTES", 0)
    shard = out / "train" / "x-00000.bin"
    data = bytearray(shard.read_bytes())
    data[5000] ^= 0xFF  # between the samples: caught only by the full check
    shard.write_bytes(bytes(data))
    open_prepared(out, KIND, SETTINGS, fields=FIELDS)
    with pytest.raises(DataError, match=r"x-00000.bin has another SHA-256"):
        core.verify(out)
    data[len(data) // 2] ^= 0xFF  # in the middle sample
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"x-00000.bin has another sampled SHA-256"):
        open_prepared(out, KIND, SETTINGS, fields=FIELDS)


def test_labels_beyond_the_classes_are_refused_and_a_manifest_never_chooses_what_is_walked(
    tmp_path: Path, source: Path
) -> None:
    out = tmp_path / "prep"
    write_toy(out, source)  # labels 0..99
    prepared = open_prepared(out, KIND, SETTINGS, fields=FIELDS)
    prepared.check_below("y", 100, "the number of classes")
    with pytest.raises(DataError, match=r"train/y holds 99, outside 0..9 \(the number of classes\)"):
        prepared.check_below("y", 10, "the number of classes")

    listed = []
    rewrite_manifest(out, lambda m: m["source"].update(root="/"))
    open_prepared(out, KIND, SETTINGS, lambda root: listed.append(root) or [], source=source)
    assert listed == []  # the config names another source than the manifest's "/": nothing is walked
