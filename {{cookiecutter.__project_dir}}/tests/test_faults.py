"""Faults injected on purpose: a crash mid-save, a NaN, broken checkpoints, SIGTERM, bad input, secrets."""

import errno
import hashlib
import io
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CONFIGS, ROOT, fit_in_subprocess, shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine import checkpoints
from {{ cookiecutter.package_name }}.engine.callbacks import NonFiniteError
from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError
from {{ cookiecutter.package_name }}.engine.run_folders import run_dir
from {{ cookiecutter.package_name }}.models import ImageClassifier
from {{ cookiecutter.package_name }}.nets import CNN, MLP


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """Two epochs (20 steps) of the shrunk default run: its CLI and its last.ckpt."""
    folder = tmp_path_factory.mktemp("trained")
    cli = main(["fit", *shrunk_args(folder), "--trainer.max_epochs=2", "--test_after_fit=false"])
    return cli, run_dir(cli.trainer) / "checkpoints" / "last.ckpt"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_crash_while_a_save_reaches_its_target_leaves_the_previous_checkpoint_intact(trained, monkeypatch) -> None:
    # The worst moment of a save: the new bytes are on their way to the target path. Lightning's
    # own save writes a temporary file in the system's temp folder and moves it over the target;
    # when that folder is on another file system (a node's local /tmp, checkpoints on a shared
    # one) the move is a copy into the target. Both are simulated: rename across devices fails
    # (EXDEV) and the copy dies halfway through (a kill, a full disk). AtomicCheckpointIO writes
    # its temporary file beside the target and renames it (os.replace): the target never holds
    # half a file. Without it in the config, this test fails.
    cli, last = trained
    before = digest(last)
    real_rename = os.rename

    def rename_across_devices(source, target, *args, **kwargs):
        if Path(target) == last:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real_rename(source, target, *args, **kwargs)

    def copy_half_then_crash(source, target, *args, **kwargs) -> None:
        target.write(source.read(64))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "rename", rename_across_devices)
    monkeypatch.setattr(shutil, "copyfileobj", copy_half_then_crash)
    monkeypatch.setattr(shutil, "_USE_CP_SENDFILE", False)  # Linux copies with sendfile, not copyfileobj
    monkeypatch.setattr(checkpoints.torch, "save", crash_midway(checkpoints.torch.save))
    with pytest.raises(OSError, match=r"(?i)no space left"):
        cli.trainer.save_checkpoint(last)
    monkeypatch.undo()

    assert digest(last) == before
    assert checkpoints.read_checkpoint(last)["global_step"] == cli.trainer.global_step
    assert sorted(p.name for p in last.parent.iterdir() if p.name.startswith(".")) == []  # no partial file left


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_full_disk_is_said_plainly_and_resume_takes_the_newest_whole_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = [*shrunk_args(tmp_path), "--trainer.max_epochs=2", "--test_after_fit=false"]
    real_save = checkpoints.torch.save

    def disk_full_from_the_second_epoch(obj, file, *more, **options) -> None:
        if isinstance(file, io.BytesIO) or obj.get("epoch", 0) < 1:
            return real_save(obj, file, *more, **options)
        file.write(b"PK\x03\x04 part of a zip archive")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 374400 vs 374292")  # torch's

    monkeypatch.setattr(checkpoints.torch, "save", disk_full_from_the_second_epoch)
    nearly_full = shutil._ntuple_diskusage(10**9, 10**9, 400_000)  # 400 KB free, as in the report
    monkeypatch.setattr(checkpoints.shutil, "disk_usage", lambda folder: nearly_full)
    with user_error(r"no space left on the disk of .*checkpoints while writing .*\.ckpt .*, `make resume`"):
        main(["fit", *args])
    monkeypatch.undo()

    checkpoint_files = sorted(tmp_path.rglob("checkpoints/*.ckpt"))
    assert {path.name.split("-")[0] for path in checkpoint_files} == {"epoch000", "last.ckpt"}
    last = next(path for path in checkpoint_files if path.name == "last.ckpt")
    last.write_bytes(b"PK\x03\x04 truncated")  # as a save without AtomicCheckpointIO would leave it
    resumed = main(["fit", *args, "--resume=true"])  # from epoch000-*.ckpt, the newest whole one
    assert resumed.trainer.global_step == 2 * resumed.trainer.num_training_batches


def crash_midway(save):
    """torch.save that dies after writing part of a checkpoint to a file (not to a memory buffer)."""

    def save_then_crash(obj, file, *args, **kwargs) -> None:
        if isinstance(file, io.BytesIO):  # serialising in memory first is harmless
            return save(obj, file, *args, **kwargs)
        file.write(b"PK\x03\x04 half a zip archive")
        raise OSError(errno.ENOSPC, "No space left on device")

    return save_then_crash


def test_a_save_is_flushed_to_disk_file_and_folder(trained, monkeypatch) -> None:
    # A rename is durable only once the folder's entry is on disk too (fsync of the directory).
    cli, last = trained
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", record)
    cli.trainer.save_checkpoint(last)
    assert synced == ["file", "folder"]


def test_a_non_finite_loss_stops_at_that_step_and_keeps_the_last_good_checkpoint(cli_args: list[str]) -> None:
    class NaNBatchAt(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step == 15:
                batch[0].fill_(float("nan"))

    cli = main([*cli_args, "--trainer.max_epochs=3"], run=False)
    cli.trainer.callbacks.append(NaNBatchAt())
    with pytest.raises(NonFiniteError, match=r"Non-finite loss \(nan\) at global step 15 \(epoch 1\)"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert all(torch.isfinite(p).all() for p in cli.model.parameters())  # the step never happened
    last = checkpoints.read_checkpoint(run_dir(cli.trainer) / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 10  # end of epoch 0 (10 steps per epoch): the last good state
    assert all(torch.isfinite(t).all() for t in last["state_dict"].values())


def test_a_fused_optimizer_skips_a_non_finite_step_on_the_device_and_the_run_stops_one_step_later(
    cli_args: list[str],
) -> None:
    # The GPU fast path: a fused optimizer gets the verdict as its found_inf tensor (no host wait),
    # and the host raises when it reads the verdict at the next step. Fused AdamW honours found_inf
    # on the CPU too, so the path runs here.
    class NaNBatchAt(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step == 5:
                batch[0].fill_(float("nan"))
                self.weights = {k: v.detach().clone() for k, v in pl_module.named_parameters()}

    class Record(L.Callback):  # what the optimizer did in the step after the bad one's verdict
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            self.found_inf = getattr(optimizer, "found_inf", None)

    cli = main([*cli_args, "--model.init_args.optimizer.init_args.fused=true"], run=False)
    spy, record = NaNBatchAt(), Record()
    cli.trainer.callbacks[:0] = [spy]
    cli.trainer.callbacks.append(record)
    with pytest.raises(NonFiniteError, match=r"Non-finite loss \(nan\) at global step 5 \(epoch 0\)"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 6  # the bad step ran on the device (skipped there), the next one raised
    assert record.found_inf is not None  # the on-device path, not the synchronous one
    after = dict(cli.model.named_parameters())
    assert all(torch.equal(spy.weights[k], after[k]) for k in spy.weights)  # the skipped step changed no weight
    state = next(iter(cli.trainer.optimizers[0].state.values()))
    assert state["step"].item() == 5  # nor the optimizer's state: steps 0 to 4 counted, not 5


def test_a_step_skipped_on_the_device_at_an_epochs_end_is_never_saved(cli_args: list[str]) -> None:
    # The bad step is an epoch's last: the next thing to run is the epoch-end checkpoint, not a
    # step, so the verdict must be read before that save (on_save_checkpoint), not one step later.
    class NaNBatchAt(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if trainer.global_step == trainer.num_training_batches - 1:
                batch[0].fill_(float("nan"))

    cli = main([*cli_args, "--trainer.max_epochs=2", "--model.init_args.optimizer.init_args.fused=true"], run=False)
    cli.trainer.callbacks.append(NaNBatchAt())
    with pytest.raises(NonFiniteError, match=r"Non-finite loss \(nan\) at global step \d+ \(epoch 0\)") as raised:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert f"global step {cli.trainer.num_training_batches - 1} " in str(raised.value)
    assert not list(run_dir(cli.trainer).rglob("*.ckpt"))  # the epoch-end save was refused
    assert cli.trainer.current_epoch == 0  # it never got to epoch 1


@pytest.mark.slow  # two processes
def test_under_ddp_a_nan_on_one_process_stops_every_process_at_that_step(tmp_path: Path) -> None:
    # Every process skips the step and stops at the same one, none left waiting at the next
    # all-reduce; fused AdamW: the on-device path. Rank 1 sees its NaN loss; rank 0 its gradients,
    # which DDP averaged with rank 1's.
    at_step_3 = {"rank": 1, "step": 3}
    nan_on_rank_1 = json.dumps({"class_path": "conftest.NaNBatchOnRank", "init_args": at_step_3})
    args = [
        *shrunk_args(tmp_path),
        f"--config={CONFIGS / 'presets' / 'ddp.yaml'}",
        "--trainer.accelerator=cpu",
        "--trainer.devices=2",
        "--model.init_args.optimizer.init_args.fused=true",
        f"--trainer.callbacks+={nan_on_rank_1}",
    ]
    done = fit_in_subprocess(args, check=False)
    assert done.returncode != 0
    # Rank 0, whose own batch was finite, stops at step 3 too. (Rank 1's own error may not be printed:
    # Lightning kills the other processes once rank 0 raises; a "[rank0]:" prefix is torch's, or not.)
    rank_0 = r"NonFiniteError:\s+Non-finite gradient of \S+ .*at global step 3 "
    assert re.search(rank_0, done.stderr), done.stderr[-3000:]
    assert "at global step 4" not in done.stderr
    assert not list(tmp_path.rglob("*.ckpt"))  # nothing saved after the bad step (the epoch never ended)


def test_a_non_finite_gradient_is_named(cli_args: list[str]) -> None:
    class InfGradAt(L.Callback):
        def on_after_backward(self, trainer, pl_module) -> None:
            if trainer.global_step == 3:
                pl_module.net.blocks[1].conv1.weight.grad[0, 0, 0, 0] = float("inf")

    cli = main(cli_args, run=False)
    cli.trainer.callbacks.append(InfGradAt())
    with pytest.raises(NonFiniteError, match=r"Non-finite gradient of net\.blocks\.1\.conv1\.weight at global step 3"):
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda data: data[: len(data) // 2], "not a readable checkpoint: truncated"),
        (lambda data: b"\x00" * 64 + data[64:], "not a readable checkpoint"),
        (lambda data: b"", "not a readable checkpoint"),
    ],
    ids=["truncated", "corrupt", "empty"],
)
def test_a_broken_checkpoint_is_refused_with_its_name(trained, tmp_path: Path, damage, message: str) -> None:
    _, last = trained
    broken = tmp_path / "broken.ckpt"
    broken.write_bytes(damage(last.read_bytes()))
    with user_error(rf"{broken}: {message}"):
        main(["test", *shrunk_args(tmp_path), f"--ckpt_path={broken}"])


def test_a_checkpoint_of_another_model_names_the_mismatch(trained) -> None:
    _, last = trained
    checkpoint = checkpoints.read_checkpoint(last)
    narrower = ImageClassifier(net=CNN(channels=(16, 64)))
    with pytest.raises(
        CheckpointError,
        match=r"shape mismatches \(\d+\): net\.blocks\.0\.conv1\.weight: checkpoint \(32, 1, 3, 3\) vs model \(16, 1,",
    ):
        checkpoints.check_fits(checkpoint, narrower, last)
    with pytest.raises(CheckpointError, match=r"missing keys \(6\): net\.layers.*unexpected keys \(\d+\): net\.blocks"):
        checkpoints.check_fits(checkpoint, ImageClassifier(net=MLP()), last)


# Lightning warns that the checkpoint's ModelCheckpoint state came from another run folder.
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
def test_the_cli_rebuilds_the_checkpoints_own_model(trained, tmp_path: Path) -> None:
    # LightningCLI applies the checkpoint's hyperparameters over the config: another net in the
    # config cannot make `test --ckpt_path` load weights into the wrong model.
    _, last = trained
    other_net = "--model.init_args.net={{ cookiecutter.package_name }}.nets.MLP"
    cli = main(["test", *shrunk_args(tmp_path), f"--ckpt_path={last}", other_net])
    assert isinstance(cli.model.net, CNN)
    assert cli.trainer.callback_metrics["test/acc"] > 0.5


def test_a_missing_checkpoint_is_named(tmp_path: Path) -> None:
    with user_error(r"nowhere\.ckpt: no such checkpoint"):
        main(["test", *shrunk_args(tmp_path), f"--ckpt_path={tmp_path / 'nowhere.ckpt'}"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--data.init_args.batch_size=5000"],
            r"data\.batch_size=5000 is larger than the training split \(1257 samples\)",
        ),
        (
            ["--trainer.val_check_interval=500"],
            r"trainer\.val_check_interval=500 steps is more than an epoch of \d+ training batches: .*"
            r"trainer\.check_val_every_n_epoch=null to validate every 500 steps across epochs",
        ),
        (["--resume=true"], "--resume: no run with a checkpoint in"),
        (["--resume=true", "--ckpt_path=x.ckpt"], "--resume and --ckpt_path: give only one"),
    ],
    ids=["batch-larger-than-data", "validation-interval-beyond-an-epoch", "nothing-to-resume", "resume-and-ckpt-path"],
)
def test_bad_input_fails_before_training(tmp_path: Path, args: list[str], message: str) -> None:
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), *args])
    assert not list(tmp_path.rglob("*.ckpt"))
    assert not list((tmp_path / "logs").rglob("*"))  # no empty run folder either


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_make_resume_finishes_the_run(tmp_path: Path) -> None:
    args = [*shrunk_args(tmp_path), "--trainer.max_epochs=200", "--test_after_fit=false"]
    process = subprocess.Popen(
        [sys.executable, "-m", "{{ cookiecutter.package_name }}", "fit", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list(tmp_path.rglob("last.ckpt")):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0][-3000:]
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signal.SIGTERM, output[-3000:]
    (saved,) = tmp_path.rglob("interrupted-step*.ckpt")
    step = checkpoints.read_checkpoint(saved)["global_step"]
    assert f"SIGTERM received: saved {saved}" in output
    assert 0 < step < 200 * 10  # 10 steps per epoch

    # `make resume`, with the same arguments and only two more epochs (20 steps) to go.
    run = subprocess.run(
        [
            "make",
            "resume",
            f"PYTHON={sys.executable}",
            "ARGS=" + " ".join([*args[1:], f"--trainer.max_steps={step + 20}"]),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    output = run.stdout + run.stderr
    assert f"Resuming run {saved.parent.parent} from {saved}" in output
    # Lightning's "Previous log files in this directory will be deleted" (nothing is) gives way to one line of ours.
    assert "will be deleted" not in output and "exists and is not empty" not in output
    assert f"Continuing in {saved.parent.parent}: its checkpoints and logged metrics are kept" in output
    last = checkpoints.read_checkpoint(saved.parent / "last.ckpt")
    assert last["global_step"] == step + 20
    assert len(list(tmp_path.rglob("config.yaml"))) == 1  # one run folder, continued


def test_secrets_from_the_environment_never_reach_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wandb-key-" + os.urandom(8).hex()
    monkeypatch.setenv("WANDB_API_KEY", secret)
    main(["fit", *shrunk_args(tmp_path)])
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in written) and any(p.suffix == ".ckpt" for p in written)
    assert not [p for p in written if secret.encode() in p.read_bytes()]


def test_gitignore_keeps_data_runs_and_secrets_out_of_git() -> None:
    ignored = set((ROOT / ".gitignore").read_text().split())
    assert {"/data/", "logs/", "wandb/", "checkpoints/", "*.ckpt", ".env", ".env.*", ".netrc"} <= ignored
