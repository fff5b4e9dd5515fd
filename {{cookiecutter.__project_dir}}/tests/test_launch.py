"""Processes started by srun or torchrun must match the Trainer's num_nodes x devices; SLURM runs get a fixed name."""

import logging
import os
import warnings
from pathlib import Path

import pytest
from conftest import shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.launch import slurm_job_id


def fake_slurm_task(monkeypatch: pytest.MonkeyPatch, ntasks: int, job_id: str = "4242") -> None:
    """The environment srun gives task 0 of a batch job on one node."""
    for name, value in {
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NAME": "train.sbatch",
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NNODES": "1",
        "SLURM_NODELIST": "node001",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(name, value)


def test_srun_with_fewer_tasks_than_devices_is_refused(monkeypatch: pytest.MonkeyPatch, cli_args: list[str]) -> None:
    fake_slurm_task(monkeypatch, ntasks=1)
    with user_error(r"devices=2 asks for 2 processes, but srun \(SLURM_NTASKS\) started 1"):
        main([*cli_args, "--trainer.devices=2", "--trainer.strategy=ddp"], run=False)


def test_srun_with_more_tasks_than_devices_is_refused(monkeypatch: pytest.MonkeyPatch, cli_args: list[str]) -> None:
    # Two tasks each training alone on one device: twice the compute for one model's worth of steps.
    fake_slurm_task(monkeypatch, ntasks=2)
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
    with user_error("devices"):
        main([*cli_args, "--trainer.devices=1"], run=False)


def test_torchrun_world_size_that_disagrees_is_refused(monkeypatch: pytest.MonkeyPatch, cli_args: list[str]) -> None:
    for name, value in {"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with user_error(r"world size|WORLD_SIZE"):
        main([*cli_args, "--trainer.devices=3", "--trainer.strategy=ddp"], run=False)


def test_matching_srun_task_count_builds_the_trainer(monkeypatch: pytest.MonkeyPatch, cli_args: list[str]) -> None:
    fake_slurm_task(monkeypatch, ntasks=1)
    assert main(cli_args, run=False).trainer.world_size == 1


def test_a_slurm_run_is_named_after_its_job(
    monkeypatch: pytest.MonkeyPatch, cli_args: list[str], tmp_path: Path
) -> None:
    fake_slurm_task(monkeypatch, ntasks=1, job_id="4242")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert slurm_job_id() == "4240_2"
    trainer = main(cli_args, run=False).trainer
    # A requeued job keeps its id, so it finds this folder (and its pre-emption checkpoint) again.
    assert trainer.logger.version == "slurm-4240_2"
    assert Path(trainer.default_root_dir) == tmp_path / "logs" / "test" / "slurm-4240_2"


def test_a_version_set_by_the_user_is_kept_under_slurm(monkeypatch: pytest.MonkeyPatch, cli_args: list[str]) -> None:
    fake_slurm_task(monkeypatch, ntasks=1)
    trainer = main([*cli_args, "--trainer.logger.init_args.version=mine"], run=False).trainer
    assert trainer.logger.version == "mine"
    assert Path(trainer.default_root_dir).name == "mine"


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_interactive_allocations_are_not_slurm_runs(monkeypatch: pytest.MonkeyPatch, job_name: str) -> None:
    # salloc then python: Lightning starts its own processes, so nothing is renamed or checked.
    fake_slurm_task(monkeypatch, ntasks=2)
    monkeypatch.setenv("SLURM_JOB_NAME", job_name)
    assert slurm_job_id() is None


def test_on_a_login_node_fit_says_once_where_it_trains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Lightning's own hint ("The `srun` command is available on your system but is not used") is
    # said by every Trainer; pyproject.toml does not filter it for this test.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name in [name for name in os.environ if name.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        main(["fit", *shrunk_args(tmp_path)])
    assert [str(w.message) for w in caught if "srun" in str(w.message)] == []
    ours = [record.getMessage() for record in caplog.records if "srun is on this machine's PATH" in record.getMessage()]
    assert len(ours) == 1
