"""A run deletes or overwrites only what it created, and what a run folder holds is data.

A folder a run finds is refused or kept, what it wrote is cleaned (the partial files of killed saves
too); a checkpoint's callback states, a distributed checkpoint's metadata and a compressed file never
steer what is removed, run or resumed. Each case hashes a sentinel tree (a user's thesis, a home
folder) before and after.
"""

import hashlib
import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import {{ "ROOT, " if cookiecutter.task == "image-classification" else "" }}leaves, replaced, run_hostile_cases, shrunk_args, user_error{{ ", with_tests_importable" if cookiecutter.task == "image-classification" else "" }}
from lightning.pytorch.callbacks import ModelCheckpoint

from {{ cookiecutter.package_name }}.cli import main
{%- if cookiecutter.task != "language-model" and cookiecutter.use_sweeps == "yes" %}
from {{ cookiecutter.package_name }}.commands import cv
{%- endif %}
from {{ cookiecutter.package_name }}.engine.checkpoints import (
    AtomicCheckpointIO,
    CheckpointError,
    check_distributed_checkpoint,
    remove_stale_partials,
)
from {{ cookiecutter.package_name }}.engine.run_folders import latest_checkpoint, run_dir
from {{ cookiecutter.package_name }}.engine.sharding import consolidate

# A mistake found once fit has started (the DataModule's setup): the moment a run cleans up after itself.
TOO_BIG_A_BATCH = "--data.init_args.batch_size=100000"


def sentinel_tree(root: Path) -> Path:
    """A user's folder: a file, a nested file, a hidden one and an empty folder."""
    (root / "notes").mkdir(parents=True)
    (root / "notes" / "thesis.tex").write_text("precious\n")
    (root / ".git-like").write_text("hidden\n")
    (root / "empty").mkdir()
    (root / "data.csv").write_text("a,b\n1,2\n")
    return root


def fingerprint(root: Path) -> dict[str, str]:
    """Every path under ``root`` (``root`` itself included) with its content's hash ('dir' for folders)."""
    paths = [root, *root.rglob("*")] if root.exists() else []
    return {str(path): "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()[:16] for path in paths}


def logger_at(folder: Path) -> list[str]:
    """Arguments that make ``folder`` itself the run folder, as the issue's user did: save_dir, no name, version."""
    return [
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.init_args.save_dir={folder.parent}",
        "--trainer.logger.init_args.name=",
        f"--trainer.logger.init_args.version={folder.name}",
    ]


@pytest.mark.parametrize("resume", [False, True], ids=["fit", "resume"])
def test_a_run_named_into_a_folder_that_holds_files_is_refused_and_the_folder_kept(tmp_path: Path, resume) -> None:
    thesis = sentinel_tree(tmp_path / "home" / "thesis")
    before = fingerprint(tmp_path / "home")
    message = "no run with a checkpoint" if resume else "the run folder .*thesis exists and holds 4 entries"
    resuming = ["--resume=true"] if resume else []
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), *logger_at(thesis), *resuming, TOO_BIG_A_BATCH])
    assert fingerprint(tmp_path / "home") == before


# Lightning's CSVLogger, on the empty folder given.
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
def test_a_failed_start_removes_only_what_it_wrote(tmp_path: Path) -> None:
    # Without a logger, a fit's run folder is a new one under default_root_dir: the user's folder around it stays
    thesis = sentinel_tree(tmp_path / "home" / "thesis")
    before = fingerprint(tmp_path / "home")
    args = [*shrunk_args(tmp_path), "--trainer.logger=false", f"--trainer.default_root_dir={thesis}"]
    with user_error("larger than the training split"):
        main(["fit", *args, TOO_BIG_A_BATCH])
    assert fingerprint(tmp_path / "home") == before

    # An empty folder is taken, and left as it was found: empty, not removed.
    (tmp_path / "home" / "empty-run").mkdir()
    with user_error("larger than the training split"):
        main(["fit", *shrunk_args(tmp_path), *logger_at(tmp_path / "home" / "empty-run"), TOO_BIG_A_BATCH])
    assert (tmp_path / "home" / "empty-run").is_dir() and not any((tmp_path / "home" / "empty-run").iterdir())

    # Folders the run made (the save folder and the run's) go, once empty; the parent it found stays.
    made = tmp_path / "home" / "new" / "deeper" / "run"
    with user_error("larger than the training split"):
        main(["fit", *shrunk_args(tmp_path), *logger_at(made), TOO_BIG_A_BATCH])
    assert not (tmp_path / "home" / "new").exists()
    assert fingerprint(thesis) == {key: value for key, value in before.items() if key.startswith(str(thesis))}
{%- if cookiecutter.task != "language-model" and cookiecutter.use_sweeps == "yes" %}


def test_cv_refuses_a_fold_folder_that_holds_files_and_keeps_them(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    fold = tmp_path / "logs" / "cv" / "mine" / "test" / "mine-fold0"
    sentinel_tree(fold)
    before = fingerprint(tmp_path / "logs")
    with user_error("the run folder .*mine-fold0 exists and holds"):
        cv.main(["--folds=2", "--name=mine", *shrunk_args(tmp_path)])
    assert fingerprint(tmp_path / "logs") == before
{%- endif %}

{%- if cookiecutter.use_sweeps == "yes" %}


@pytest.mark.parametrize("where", ["logger", "default_root_dir"])
def test_find_lr_keeps_the_folder_it_is_pointed_at(tmp_path: Path, monkeypatch, where: str) -> None:
    # make find-lr cleans up too (the Tuner's own checkpoint): a search refused, and one that ran, leave the
    # user's folder as they found it.
    from {{ cookiecutter.package_name }}.commands import find

    monkeypatch.chdir(tmp_path)
    thesis = sentinel_tree(tmp_path / "home" / "thesis")
    before = fingerprint(tmp_path / "home")
    at = logger_at(thesis) if where == "logger" else ["--trainer.logger=false", f"--trainer.default_root_dir={thesis}"]
    with user_error("larger than the training split"):
        find.main(["lr", *shrunk_args(tmp_path), *at, TOO_BIG_A_BATCH])
    assert fingerprint(tmp_path / "home") == before
    find.main(["lr", *shrunk_args(tmp_path), *at, "--min_lr=1e-5", "--max_lr=0.5", "--num_training=30"])
    assert fingerprint(tmp_path / "home") == before
    assert len(list((tmp_path / "logs" / "find").iterdir())) == 1  # what it wrote is in a folder of its own
{%- endif %}


def test_a_resumed_checkpoint_cannot_make_the_run_delete_or_test_a_path_outside_its_folder(tmp_path: Path) -> None:
    args = [*shrunk_args(tmp_path), "--trainer.max_epochs=1", "--test_after_fit=false"]
    first = main(["fit", *args])
    run = run_dir(first.trainer)
    last = run / "checkpoints" / "last.ckpt"
    home = sentinel_tree(tmp_path / "home")
    before = fingerprint(home)
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)
    for state in checkpoint["callbacks"].values():
        if "best_model_path" in state:  # each ModelCheckpoint's: every path it keeps names the user's folder
            state.pop("dirpath")  # so that Lightning restores the whole state whatever its own dirpath
            state["best_model_path"] = f"local://{home}"
            state["kth_best_model_path"] = str(home / "notes")
            state["last_model_path"] = f"file://{home / 'data.csv'}"
            state["best_k_models"] = {f"local://{home}": torch.tensor(0.0), str(home / "notes"): torch.tensor(-1.0)}
    torch.save(checkpoint, last)

    resumed = main(["fit", *args, "--trainer.max_epochs=3", f"--ckpt_path={last}"])
    assert resumed.trainer.global_step == 3 * first.trainer.global_step
    assert fingerprint(home) == before
    for callback in resumed.trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        kept = [callback.best_model_path, callback.kth_best_model_path, *callback.best_k_models]
        assert all(Path(path).parent == run / "checkpoints" for path in kept if path), kept


def test_the_checkpoint_io_removes_only_in_a_folder_it_saves_into(tmp_path: Path) -> None:
    home = sentinel_tree(tmp_path / "home")
    before = fingerprint(home)
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": dict()}, tmp_path / "run" / "checkpoints" / "epoch=0.ckpt")
    for outside in (home, home / "data.csv", f"local://{home}", f"file://{home / 'notes'}", tmp_path / "run"):
        with pytest.warns(UserWarning, match="not removed: not in a folder this run saves checkpoints into"):
            io.remove_checkpoint(outside)
    assert fingerprint(home) == before
    (tmp_path / "run" / "checkpoints" / "link.ckpt").symlink_to(home / "data.csv")
    io.remove_checkpoint(tmp_path / "run" / "checkpoints" / "link.ckpt")  # the link goes, not what it names
    io.remove_checkpoint(tmp_path / "run" / "checkpoints" / "epoch=0.ckpt")
    assert not any((tmp_path / "run" / "checkpoints").iterdir())
    assert fingerprint(home) == before


def dead_pid() -> int:
    """The id of a process that has ended (and was waited for)."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_partial_files_of_writers_that_are_gone_are_removed_and_no_other(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    host, gone, alive = socket.gethostname(), dead_pid(), os.getpid()
    stale = [folder / f".last.ckpt.partial-{host}-{gone}", folder / f".epoch=1.ckpt.partial-{gone}"]
    kept = [
        folder / f".last.ckpt.partial-{host}-{alive}",  # a save in progress
        folder / f".last.ckpt.partial-another-node-{gone}",  # another host's: its pid means nothing here
        folder / f"notes.partial-{gone}",  # not a name our saves take
    ]
    for path in (*stale, *kept):
        path.write_bytes(b"PK")
    (folder / f".link.ckpt.partial-{gone}").symlink_to(tmp_path)
    kept.append(folder / f".link.ckpt.partial-{gone}")
    assert sorted(remove_stale_partials(folder)) == sorted(stale)
    assert sorted(folder.iterdir()) == sorted(kept)
{%- if cookiecutter.task == "image-classification" %}


# A kill while saving runs in the image bake, the default, alone: the saving code is the same in every task, and
# CI's time is shared. (Every leaf of a checkpoint, below, runs in each: each task's DataModule saves its own state.)
KILL_WHILE_SAVING = textwrap.dedent(
    """
    import os, signal, sys
    import torch
    from {{ cookiecutter.package_name }}.cli import main

    saves, real_save = [0], torch.save

    def save(obj, file, *args, **kwargs):  # the process dies with half a checkpoint written, as under SIGKILL
        saves[0] += 1
        if saves[0] == int(os.environ["KILL_AT_SAVE"]):
            file.write(b"PK half a checkpoint")
            file.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, file, *args, **kwargs)

    torch.save = save
    main(sys.argv[1:])
    """
)


@pytest.mark.slow  # three fits in fresh processes
def test_runs_killed_while_saving_and_resumed_end_with_no_partial_file(tmp_path: Path) -> None:
    script = tmp_path / "kill_while_saving.py"
    script.write_text(KILL_WHILE_SAVING)
    args = [*shrunk_args(tmp_path), "--trainer.max_epochs=3", "--test_after_fit=false"]
    args += ["--trainer.logger.init_args.version=killed"]
    run = tmp_path / "logs" / "test" / "killed"
    for attempt, kill_at in enumerate((3, 2, 0)):  # killed at its 3rd save, resumed and killed again, resumed
        done = subprocess.run(
            [sys.executable, str(script), "fit", *args, *(["--resume=true"] if attempt else [])],
            cwd=ROOT,
            env={**with_tests_importable(), "KILL_AT_SAVE": str(kill_at)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == (0 if kill_at == 0 else -9), done.stderr[-3000:]
        if kill_at:
            assert list((run / "checkpoints").glob(".*.partial-*")), "the kill left no partial file"
    assert not list((run / "checkpoints").glob(".*partial*"))
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["epoch"] == 2  # the third epoch's: the run ended where an uninterrupted one does
{%- endif %}


class RunsCode:
    """A pickle that runs code when unpickled: it creates the file ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def distributed_checkpoint(folder: Path, extra: object = None) -> Path:
    """A distributed checkpoint folder as FSDP2Strategy writes it: torch's shards and .metadata, and meta.pt;
    ``extra``, when given, an item that is not a tensor (stored pickled, as an optimizer's param_groups are)."""
    import torch.distributed.checkpoint as dcp

    weights = {"net.weight": torch.ones(2, 3)}
    state: dict[str, object] = {"state_dict": weights}
    if extra is not None:
        state["extra"] = extra
    with warnings.catch_warnings():  # torch's: "torch.distributed is disabled ... save in a single process"
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder)
    meta = {"epoch": 0, "global_step": 1, "callbacks": dict()}
    torch.save(meta, folder / "meta.pt")
    return folder


def test_a_distributed_checkpoints_metadata_never_runs_code(tmp_path: Path) -> None:
    good = distributed_checkpoint(tmp_path / "good" / "checkpoints" / "last.ckpt")
    check_distributed_checkpoint(good)  # torch's own metadata classes pass
    assert latest_checkpoint(tmp_path / "good") == good

    marker = tmp_path / "ran"
    bad = distributed_checkpoint(tmp_path / "bad" / "checkpoints" / "last.ckpt")
    (bad / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: not the metadata torch writes .*posix.system"):
        check_distributed_checkpoint(bad)
    assert latest_checkpoint(tmp_path / "bad") is None  # make resume passes it over
    with pytest.raises(CheckpointError, match="not the metadata torch writes"):
        consolidate(bad)
    assert not marker.exists()


def test_every_item_of_a_distributed_checkpoint_is_data(tmp_path: Path) -> None:
    """torch's distributed-checkpoint reader unpickles an item stored as bytes (an optimizer's param_groups are)
    with ``weights_only=False``, reads whatever file and span its metadata names, and undoes any transform it
    names: each is checked before torch reads anything."""
    import dataclasses

    from torch.distributed.checkpoint import FileSystemReader

    marker = tmp_path / "ran"
    cases: dict[str, Path] = {}
    where = tmp_path / "code" / "checkpoints" / "last.ckpt"
    cases["an item that runs code"] = distributed_checkpoint(where, extra=RunsCode(marker))
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 64)
    for name, change in {
        "a file outside the folder": dict(relative_path="../../outside.bin", offset=0, length=64),
        "a span past the file's end": dict(offset=0, length=1 << 40),
        "a transform to undo": dict(transform_descriptors=["zstd"]),
    }.items():
        folder = distributed_checkpoint(tmp_path / name.replace(" ", "-").replace("'", "") / "checkpoints" / "x.ckpt")
        metadata = FileSystemReader(folder).read_metadata()  # torch's own reader: a file this test wrote
        index = next(iter(metadata.storage_data))
        if not all(hasattr(metadata.storage_data[index], key) for key in change):
            continue  # a torch whose storage records no transforms (2.6, the floors'): nothing to undo
        metadata.storage_data[index] = dataclasses.replace(metadata.storage_data[index], **change)
        (folder / ".metadata").write_bytes(pickle.dumps(metadata))
        cases[name] = folder
    for name, folder in cases.items():
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(folder))}: [^\n]*refused$"):
            check_distributed_checkpoint(folder)
        assert latest_checkpoint(folder.parent.parent) is None, name  # make resume passes it over
        with pytest.raises(CheckpointError):
            consolidate(folder)
    assert not marker.exists()
    check_distributed_checkpoint(distributed_checkpoint(tmp_path / "plain" / "checkpoints" / "last.ckpt", extra=[0.1]))


def test_a_distributed_checkpoints_states_are_checked_before_a_resume(tmp_path: Path) -> None:
    """A folder's meta.pt (loop, callback and DataModule states, arguments) is checked as a file's is, before
    Lightning restores it; a folder given to a strategy that reads one file is one line too."""
    folder = distributed_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    args = ["fit", *shrunk_args(tmp_path / "resumed"), f"--ckpt_path={folder}", "--trainer.max_epochs=2"]
    with user_error(rf"{re.escape(str(folder))}: a distributed checkpoint .* resumes under the fsdp2 preset"):
        main(args)
    meta = torch.load(folder / "meta.pt", weights_only=True)
    loops = {"fit_loop": [1]}
    torch.save({**meta, "loops": loops}, folder / "meta.pt")
    with user_error(rf"{re.escape(str(folder))}: loops has no 'validate_loop'; this is not a training state"):
        main(args)


def test_a_compressed_checkpoint_is_not_taken_to_resume(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    plain = folder / "epoch=0.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(4)}, "optimizer_states": []}, plain)
    packed = folder / "last.ckpt"  # newer, deflated: small on disk, any size in memory
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as target:
        for info in source.infolist():
            target.writestr(info.filename, source.read(info.filename))
    os.utime(packed, (plain.stat().st_mtime + 10,) * 2)
    assert latest_checkpoint(tmp_path / "run") == plain


# ---- every leaf of a checkpoint is data ----------------------------------------------------------------

LEAF_DRIVER = textwrap.dedent(
    """
    import contextlib, io, json, resource, shutil, sys
    from pathlib import Path
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from conftest import shrunk_args
    from {{ cookiecutter.package_name }}.cli import main
    from {{ cookiecutter.package_name }}.engine.errors import UserError
    from {{ cookiecutter.package_name }}.engine.inference import load_trained
    from {{ cookiecutter.package_name }}.engine.sharding import consolidate

    for case in json.loads(open(sys.argv[1]).read()):
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
                if case["command"] == "load_trained":
                    load_trained(case["path"])
                elif case["command"] == "consolidate":  # a folder gathered into one file, then loaded
                    Path(case["folder"]).mkdir(parents=True)
                    load_trained(consolidate(case["path"], Path(case["folder"]) / "gathered.ckpt"))
                else:  # a short epoch past the checkpoint's: resume reads every part of the file
                    args = [*shrunk_args(Path(case["folder"])), "--test_after_fit=false"]
                    if case["command"] == "fit --ckpt_path":
                        args.append(f"--ckpt_path={case['path']}")
                    else:  # make resume: the run folder's newest checkpoint, chosen (as a k-fold run's folds do)
                        run = Path(case["folder"], "logs", "test", Path(case["run"]).name)
                        shutil.copytree(case["run"], run)
                        shutil.copyfile(case["path"], run / "checkpoints" / "last.ckpt")  # the newest
                        args.append("--resume=true")
                    args += ["--trainer.max_epochs=2", "--trainer.limit_train_batches=2"]
                    args += ["--trainer.limit_val_batches=1"]
                    main(["fit", *args])
            outcome = "ran"
        except SystemExit as stopped:
            lines = [line for line in said.getvalue().splitlines() if line.startswith("error:")]
            outcome = "refused" if stopped.code == 2 and len(lines) == 1 else f"exit {stopped.code}"
        except UserError as error:
            outcome = "refused" if "\\n" not in str(error) else "refused over several lines"
        except Exception as error:  # a traceback: not a one-line refusal
            outcome = f"traceback {type(error).__name__}: {str(error)[:120]}"
        print(json.dumps({**case, "outcome": outcome}), flush=True)
    """
)


COMMANDS = ("load_trained", "fit --ckpt_path", "make resume"{{ ', "consolidate"' if cookiecutter.task == "image-classification" else "" }})
{%- if cookiecutter.task == "image-classification" %}


def as_distributed(checkpoint: dict, folder: Path) -> Path:
    """``checkpoint`` as FSDP2Strategy writes it: the weights and optimizer states in torch's distributed
    checkpoint (``optimizer_<n>``), the rest in ``meta.pt``."""
    import torch.distributed.checkpoint as dcp

    sharded = {"state_dict": checkpoint["state_dict"]}
    sharded |= {f"optimizer_{index}": state for index, state in enumerate(checkpoint.get("optimizer_states") or [])}
    with warnings.catch_warnings():  # torch's: "torch.distributed is disabled ... save in a single process"
        warnings.simplefilter("ignore")
        dcp.save(sharded, checkpoint_id=folder)
    rest = {key: value for key, value in checkpoint.items() if key not in ("state_dict", "optimizer_states")}
    torch.save(rest, folder / "meta.pt")
    return folder
{%- endif %}


def hostile_values(module: str, home: Path, fifo: Path) -> dict[str, object]:
    deep: object = "x"
    for _ in range(200):
        deep = [deep]
    return {
        "class spec": {"class_path": f"{module}.Net", "init_args": dict(x=1)},
        "dotted function": "os.system",
        "path outside the run": str(home / "notes"),
        "file URL": f"file://{home}",
        "local URL": f"local://{home}",
        "http URL": "http://127.0.0.1:9/x",
        "FIFO": str(fifo),
        "stride-0 tensor": torch.zeros(1).expand(4096, 4096),
        "deep nesting": deep,
        "wide mapping": {f"k{index}": index for index in range(200_000)},
    }


# The hostile values a resume is given (a fit each): a class to build, a URL to open, a tensor to expand.
RESUMED_VALUES = ("class spec", "local URL", "stride-0 tensor")


@pytest.mark.slow  # a few hundred loads and short resumes, in one process under a memory limit
@pytest.mark.skipif(not hasattr(os, "mkfifo") or sys.platform != "linux", reason="FIFOs and RLIMIT_AS: Linux")
def test_every_leaf_of_a_checkpoint_is_data(tmp_path: Path) -> None:
    # Each leaf of a real checkpoint (weights, hyper-parameters, optimizer, callback and loop states), sampled, is
    # replaced in turn by each hostile value; load_trained and a resume (fit --ckpt_path, or make resume finding it
    # in its run folder, as a k-fold run's folds do) read each file. (load_trained is what
    # predict{{ ", export, serve" if cookiecutter.use_serving == "yes" else "" }}{{ ", generate" if cookiecutter.task == "language-model" else "" }} load with.)
    # Nothing may run (a planted module leaves a mark when imported), change a file outside the run, hang (the
    # process's timeout) or take memory past the limit (RLIMIT_AS); a refusal is one line.
    import random

    first = main(["fit", *shrunk_args(tmp_path / "trained"), "--test_after_fit=false"])
    checkpoint = torch.load(run_dir(first.trainer) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    module = "labtools_leaves"
    (tmp_path / f"{module}.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    home = sentinel_tree(tmp_path / "home")
    os.mkfifo(tmp_path / "fifo")
    before = fingerprint(home)
    values = hostile_values(module, home, tmp_path / "fifo")
    # One leaf of each kind (list positions alike: the 625 words of Python's random state are one kind), sampled.
    kinds: dict[tuple, tuple] = {}
    for where, leaf in leaves(checkpoint):
        kinds.setdefault(tuple("*" if isinstance(key, int) else key for key in where), (where, leaf))
    # CI's time: 12 in the default bake; the other tasks' checkpoints hold the same engine's parts (weights,
    # optimizer, loops, callbacks), read by the same code, so there one leaf of each part (below) and a moment.
    sampled = random.Random(0).sample(sorted(kinds.values(), key=str), min(len(kinds), 24))[:{{ 12 if cookiecutter.task == "image-classification" else 0 }}]
    sampled += [leaf for kind, leaf in kinds.items() if kind[:3] == ("optimizer_states", "*", "state")][:1]  # a moment
    # And a leaf of each part the sample missed (the task's own among them: its DataModule's state and arguments).
    for part in checkpoint:
        if not any(where[0] == part for where, _ in sampled):
            sampled += [leaf for kind, leaf in sorted(kinds.items(), key=str) if kind[0] == part][:1]
    cases = []
    for number, ((where, _), (label, value)) in enumerate((leaf, item) for leaf in sampled for item in values.items()):
        path = tmp_path / "hostile" / f"{number}.ckpt"
        path.parent.mkdir(exist_ok=True)
        torch.save(replaced(checkpoint, where, value), path)
        # A resume is a fit (seconds each, CI's time): each leaf is resumed with one of three values in turn, from a
        # path given (fit --ckpt_path) or found in a run folder, alternating, so that each value meets both;
        # load_trained reads every value of every leaf.
        turn = number // len(values)
        resume = "fit --ckpt_path" if turn % 2 else "make resume"
        resumed = label == RESUMED_VALUES[turn % len(RESUMED_VALUES)]
        for command in ("load_trained", resume) if resumed else ("load_trained",):
            folder = str(tmp_path / "runs" / f"{number}-{command.split()[-1]}")
            leaf = ".".join(map(str, where))
            case = {"leaf": leaf, "value": label, "command": command, "path": str(path), "folder": folder}
            cases.append({**case, "run": str(run_dir(first.trainer))})
{%- if cookiecutter.task == "image-classification" %}
        # The first leaves in a distributed checkpoint too (the fsdp2 preset's folder: weights and optimizer in
        # torch's shards, the rest in meta.pt): gathered into one file, and given to a resume. (A mapping of 200,000
        # keys there is 200,000 items, each read by torch's own reader in turn: minutes, the file's size its bound.)
        if number < 5 * len(values) and label != "wide mapping":
            shards = as_distributed(replaced(checkpoint, where, value), tmp_path / "hostile" / f"{number}-folder")
            for command in ("consolidate", "fit --ckpt_path") if resumed else ("consolidate",):
                folder = str(tmp_path / "runs" / f"{number}-folder-{command.split()[-1]}")
                cases.append({**case, "command": command, "path": str(shards), "folder": folder})
{%- endif %}
    limit = 6 << 30  # bytes of address space: a few times a run's, far below what a stride-0 tensor made whole takes
    results = run_hostile_cases(LEAF_DRIVER, cases, tmp_path, limit)
    assert not (tmp_path / "imported").exists(), "a hostile leaf imported the planted module"
    assert fingerprint(home) == before
    outcomes = {
        (command, kind): sum(r["command"] == command and r["outcome"].startswith(kind) for r in results)
        for command in COMMANDS
        for kind in ("ran", "refused", "traceback")
    }
    print(f"{len(results)} cases: {outcomes}; leaves: {sorted({r['leaf'] for r in results})}")
    assert {r["command"] for r in results} == set(COMMANDS)
    # What inference reads (weights, arguments, the DataModule's state) and a resume's loop, callback, optimizer
    # and schedule states (engine.checkpoints.check_training_state) are refused in one line.
    loud = [r for r in results if not r["outcome"].startswith(("ran", "refused"))]
    assert loud == [], "\n".join(f"{r['leaf']} = {r['value']}: {r['outcome']}" for r in loud[:30])
