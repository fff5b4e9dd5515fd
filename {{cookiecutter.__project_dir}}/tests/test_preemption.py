"""Pre-emption: SIGUSR1 saves a full checkpoint at the next step, stops the run, and the run resumes from it."""

import contextlib
import csv
import logging
import os
import signal
import time
from pathlib import Path

import lightning as L
import pytest
import torch

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.callbacks import PreemptionCheckpoint
from {{ cookiecutter.package_name }}.engine.callbacks.preemption import Preempted
from {{ cookiecutter.package_name }}.engine.run_folders import best_checkpoint, latest_checkpoint, run_dir


class SignalAtStep(L.Callback):
    """Sends a signal (default SIGUSR1, SLURM's warning) to this process after the given optimizer step."""

    def __init__(self, step: int, name: str = "SIGUSR1") -> None:
        self.step, self.signal = step, signal.Signals[name]

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signal)


# Lightning 2.6's CSVLogger warns that it deletes the metrics.csv of a resumed run's folder; the CLI
# moves that file aside first (keep_csv_metrics), and the test checks that nothing is lost.
@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
# Lightning's ModelCheckpoint warns about any non-empty folder, resumed runs included.
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_sigusr1_saves_at_the_next_step_stops_and_resumes(cli_args: list[str], caplog) -> None:
    args = [*cli_args, "--trainer.max_epochs=3"]
    cli = main(args, run=False)
    cli.trainer.callbacks.append(SignalAtStep(step=15))  # mid-epoch (10 or 7 steps per epoch)
    with caplog.at_level(logging.INFO), pytest.raises(Preempted) as stopped:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert stopped.value.code == 128 + signal.SIGUSR1  # not requeued (no SLURM): stopped by the signal

    folder = run_dir(cli.trainer)
    # What the interrupt says: a command that continues this run as printed, and nothing of Lightning's.
    command = f"python -m {{ cookiecutter.package_name }} fit --config {folder / 'config.yaml'} --resume=true"
    assert f"Continue this run with `make resume` ({command})" in caplog.text
    assert "weights_only" not in caplog.text
    path = folder / "checkpoints" / "interrupted-step16.ckpt"
    saved = torch.load(path, map_location="cpu", weights_only=True)
    # The handler only records the signal; the save happens at the following batch boundary.
    assert saved["global_step"] == 16
    assert saved["optimizer_states"] and saved["lr_schedulers"]
    assert latest_checkpoint(folder) == path  # newer than the epoch's last.ckpt

    # Into the same run folder (as a requeued SLURM job does, its version being the job id).
    resumed = main(["fit", *args, f"--ckpt_path={path}", f"--trainer.logger.init_args.version={folder.name}"])
    assert run_dir(resumed.trainer) == folder
    steps_per_epoch = resumed.trainer.num_training_batches
    assert resumed.trainer.global_step == 3 * steps_per_epoch
    last = torch.load(run_dir(resumed.trainer) / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["lr_schedulers"][0]["last_epoch"] == 3 * steps_per_epoch  # the schedule continued
    # The first config is kept; the resumed run's differs (ckpt_path, version) and is saved beside it.
    assert {p.name for p in folder.glob("config*.yaml")} == {"config.yaml", "config-resumed-1.yaml"}
    # Lightning's CSVLogger deletes an existing metrics.csv; the part before the pre-emption is kept aside.
    steps = {}
    for name in ("metrics-1.csv", "metrics.csv"):
        with (folder / name).open() as file:
            steps[name] = [int(row["step"]) for row in csv.DictReader(file)]
    assert max(steps["metrics-1.csv"]) < 16 <= min(steps["metrics.csv"])


FAKE_SCONTROL = """#!/bin/sh
# Records each call; fails the first FAILS calls (a controller that timed out), then succeeds.
echo "$@" >> "$CALLS"
[ "$(wc -l < "$CALLS")" -gt "$FAILS" ] || { echo "Socket timed out on send/recv operation" >&2; exit 1; }
"""


@pytest.mark.parametrize(("fails", "code"), [(1, 0), (3, 128 + signal.SIGUSR1)], ids=["retried", "never-requeued"])
def test_a_job_ends_as_requeued_only_when_scontrol_requeued_it(
    cli_args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog, fails: int, code: int
) -> None:
    # A job that exits 0 is COMPLETED to SLURM: after a failed requeue it must stop as pre-empted.
    from {{ cookiecutter.package_name }}.engine.callbacks import preemption

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("FAILS", str(fails))
    monkeypatch.setattr(preemption, "slurm_job_id", lambda: "4242")
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # the retries wait 1 s, then 2 s
    cli = main([*cli_args, "--trainer.max_epochs=2"], run=False)
    cli.trainer.callbacks.append(SignalAtStep(step=3))
    failed = "scontrol requeue 4242 failed [(]1, 3 tries[)]: Socket timed out"
    warns = pytest.warns(UserWarning, match=failed) if code else contextlib.nullcontext()
    with caplog.at_level(logging.INFO), pytest.raises(Preempted) as stopped, warns:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert stopped.value.code == code
    assert calls.read_text().splitlines() == ["requeue 4242"] * min(fails + 1, 3)
    if code:
        assert "Continue this run with `make resume`" in caplog.text
    else:
        assert "Requeued SLURM job 4242" in caplog.text


def test_latest_checkpoint_prefers_the_newest_file(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path) is None
    last = tmp_path / "checkpoints" / "last.ckpt"
    last.parent.mkdir()
    first, second = last.with_name("interrupted-step10.ckpt"), last.with_name("interrupted-step30.ckpt")
    for age, path in enumerate([second, last, first]):
        torch.save({"state_dict": {}, "optimizer_states": []}, path)  # a whole training state
        os.utime(path, (1000 - age, 1000 - age))
    assert latest_checkpoint(tmp_path) == second
    os.utime(last, (2000, 2000))  # a later epoch ended after the pre-emption checkpoint
    assert latest_checkpoint(tmp_path) == last
    last.write_bytes(b"PK\x03\x04 cut short")  # a save that failed: the newest whole one instead
    assert latest_checkpoint(tmp_path) == second


def test_a_command_falling_back_from_the_best_checkpoint_to_the_latest_says_so(tmp_path: Path, capsys) -> None:
    run = tmp_path / "logs" / "test" / "default-run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"state_dict": {}, "optimizer_states": []}, run / "checkpoints" / "last.ckpt")
    assert best_checkpoint(tmp_path / "logs") == run / "checkpoints" / "last.ckpt"  # the run never validated
    said = f"no best checkpoint in {run} (the run never validated): using its latest, last.ckpt\n"
    assert capsys.readouterr().err == said
    best = run / "checkpoints" / "epoch000-val_loss1.0000.ckpt"
    torch.save({"state_dict": {}, "optimizer_states": []}, best)
    assert best_checkpoint(tmp_path / "logs") == best and capsys.readouterr().err == ""


def test_signal_name_is_checked() -> None:
    with pytest.raises(ValueError, match="requeue_signal: 'USR1' is not a signal name"):
        PreemptionCheckpoint(requeue_signal="USR1")
