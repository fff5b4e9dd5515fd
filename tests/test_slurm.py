"""The baked project's SLURM batch script, submitted with sbatch to a real single-node SLURM cluster.

The script runs unchanged: only sbatch options (no GPUs, 2 tasks of 1 CPU, small memory) and CLI
arguments (CPU accelerator, DDP preset) are overridden, as the script's header documents for
CPU-only clusters. The cluster is started once for this module (see slurm_cluster.py); without
root or apt the tests skip with the reason, and with REQUIRE_SLURM=1 (CI) they fail instead.
"""

import importlib
import json
import math
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import installed
from slurm_cluster import Cluster, ClusterUnavailable

pytestmark = pytest.mark.slurm

# Its own name: the default bake's test installs digits-classifier into this environment too, and
# make test may run the two at once (pytest-xdist).
NAME, SLUG, PACKAGE = "Slurm Digits", "slurm-digits", "slurm_digits"
CPU_JOB = ["--gpus-per-node=0", "--ntasks-per-node=2", "--cpus-per-task=1", "--mem=2G"]
CPU_ARGS = ["--trainer.accelerator=cpu"]
# Records, per process, the global step at which training (re)started, the SLURM restart count
# and the labels of the first batch it trained on (which samples a resumed process continues with).
STEP_RECORDER = """
import json, os, signal, time
from pathlib import Path
import lightning as L

class RecordStart(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.recorded = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self.recorded:
            return
        self.recorded = True
        with Path(os.environ["RECORD_FILE"]).open("a") as file:
            file.write(json.dumps({"restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                                   "rank": trainer.global_rank, "global_step": trainer.global_step,
                                   "labels": batch[1].tolist()}) + "\\n")


class HoldForSignal(L.Callback):
    # Makes the pre-emption test independent of the machine's speed: the first run (restart 0)
    # waits before step HOLD_STEP until this process's SIGUSR1 handler has run, so the signal
    # always lands mid-training, however fast or slow training is.
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if os.environ.get("SLURM_RESTART_COUNT", "0") != "0" or trainer.global_step != int(os.environ["HOLD_STEP"]):
            return
        received = []
        handler = signal.getsignal(signal.SIGUSR1)  # the PreemptionCheckpoint's, which this one calls

        def observe(signum, frame):
            received.append(signum)
            if callable(handler):
                handler(signum, frame)

        signal.signal(signal.SIGUSR1, observe)
        Path(os.environ["RECORD_FILE"] + f".held{trainer.global_rank}").touch()
        deadline = time.monotonic() + 120
        while not received and time.monotonic() < deadline:
            time.sleep(0.05)
        signal.signal(signal.SIGUSR1, handler)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        started = Cluster.start(tmp_path_factory.mktemp("slurm"))
    except ClusterUnavailable as reason:
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(f"REQUIRE_SLURM=1 but no SLURM cluster can run here: {reason}")
        pytest.skip(f"no SLURM cluster on this machine: {reason}")
    yield started
    started.stop()


@pytest.fixture(scope="module")
def project(cookies_session, cluster: Cluster) -> Iterator[Path]:
    result = cookies_session.bake(extra_context={"project_name": NAME})
    assert result.exit_code == 0, result.exception
    path = Path(result.project_path)
    (path / "logs" / "slurm").mkdir(parents=True)  # what `make slurm` does before sbatch (tests call both)
    (path / "record_start.py").write_text(STEP_RECORDER)
    with installed(path, SLUG):
        # The editable install is seen by new processes; this one imports the bake from its src/.
        sys.path.insert(0, str(path / "src"))
        try:
            yield path
        finally:
            sys.path.remove(str(path / "src"))
            for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
                del sys.modules[name]


def job_env(project: Path, record: Path) -> dict[str, str]:
    return {
        "PYTHON": sys.executable,
        "PRESETS": "--config configs/presets/ddp.yaml",
        "PYTHONPATH": str(project),  # record_start.py
        "RECORD_FILE": str(record),
    }


RECORD_CALLBACK = "--trainer.callbacks+=record_start.RecordStart"


def submit(cluster: Cluster, project: Path, *args: str, record: Path, env: dict[str, str] | None = None) -> int:
    """``sbatch`` the script directly, with the CPU overrides."""
    script_args = [*CPU_ARGS, RECORD_CALLBACK, *args]
    env = {**job_env(project, record), **(env or {})}
    return cluster.sbatch(*CPU_JOB, "scripts/slurm/train.sbatch", *script_args, cwd=project, env=env)


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"}


def log_path(project: Path, job_id: int) -> Path:
    return project / "logs" / "slurm" / f"{SLUG}-{job_id}.out"


def output(project: Path, job_id: int) -> str:
    return log_path(project, job_id).read_text()


def steps_per_epoch(world_size: int) -> int:
    data = importlib.import_module(f"{PACKAGE}.data").DigitsDataModule()
    data.setup("fit")
    return math.ceil(math.ceil(len(data.train_set) / world_size) / data.hparams.batch_size)


def expected_batch_labels(step: int, rank: int, world_size: int = 2, seed: int = 42) -> list[int]:
    """Labels of the batch an uninterrupted run trains ``rank`` on at ``step`` (the default config's seed)."""
    ResumableSampler = importlib.import_module(f"{PACKAGE}.engine.datamodule").ResumableSampler
    data = importlib.import_module(f"{PACKAGE}.data").DigitsDataModule()
    data.setup("fit")
    epoch, batch = divmod(step, steps_per_epoch(world_size))
    sampler = ResumableSampler(data.train_set, world_size, rank, seed, epoch)
    indices = list(sampler)[batch * data.batch_size : (batch + 1) * data.batch_size]
    return [int(data.train_set[i][1]) for i in indices]


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_sbatch_trains_on_two_tasks_with_world_size_two(cluster: Cluster, project: Path, tmp_path: Path) -> None:
    # Submitted as the README shows: `make slurm` with sbatch options and CLI arguments.
    record = tmp_path / "starts.jsonl"
    make = cluster.command(
        "make",
        "slurm",
        f"SBATCH_ARGS={' '.join(CPU_JOB)}",
        f"ARGS={' '.join([*CPU_ARGS, RECORD_CALLBACK, '--trainer.max_epochs=3'])}",
        cwd=project,
        env={**cluster.env, **job_env(project, record)},
    )
    job_id = int(re.search(r"Submitted batch job (\d+)", make.stdout).group(1))
    job = cluster.wait(job_id, ENDED, timeout=300, log=log_path(project, job_id))
    log = output(project, job_id)
    assert job["JobState"] == "COMPLETED", f"{job}\n{log[-4000:]}"
    assert job["ExitCode"] == "0:0"

    # Both ranks trained, in one run folder named after the job.
    assert sorted(r["rank"] for r in records(record)) == [0, 1]
    run = project / "logs" / SLUG / f"slurm-{job_id}"
    summary = json.loads((run / "test_metrics.json").read_text())
    assert summary["world_size"] == 2
    assert summary["global_step"] == 3 * steps_per_epoch(2)
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert (project / summary["checkpoint"]).is_file()
    assert summary["metrics"]["test/acc"] > 0.5  # three epochs; accuracy itself is tested elsewhere
    assert f"job {job_id} (restart 0): 1 node(s) x 2 task(s)" in log
    assert "srun exited with status 0" in log


def test_preempted_job_saves_requeues_and_resumes(cluster: Cluster, project: Path, tmp_path: Path) -> None:
    import torch

    record = tmp_path / "starts.jsonl"
    epochs = 4
    per_epoch = steps_per_epoch(2)
    hold = per_epoch + per_epoch // 2  # mid-way through the second epoch, after the first last.ckpt
    job_id = submit(
        cluster,
        project,
        f"--trainer.max_epochs={epochs}",
        "--trainer.callbacks+=record_start.HoldForSignal",
        record=record,
        env={"HOLD_STEP": str(hold)},
    )
    run = project / "logs" / SLUG / f"slurm-{job_id}"

    # Pre-empt while both processes hold at that step, as SLURM does before a time limit with
    # --signal=SIGUSR1@<seconds> (every task gets the signal).
    held = [Path(f"{record}.held{rank}") for rank in (0, 1)]
    deadline = time.monotonic() + 300
    while not all(path.exists() for path in held):
        assert time.monotonic() < deadline, f"training did not reach step {hold}:\n{output(project, job_id)[-4000:]}"
        assert cluster.job(job_id)["JobState"] in {"PENDING", "RUNNING"}, output(project, job_id)[-4000:]
        time.sleep(0.2)
    cluster.command("scancel", f"--signal={signal.SIGUSR1.name.removeprefix('SIG')}", str(job_id))

    job = cluster.wait(job_id, ENDED, timeout=300, log=log_path(project, job_id))
    log = output(project, job_id)
    assert job["JobState"] == "COMPLETED", f"{job}\n{log[-4000:]}"
    assert job["Restarts"] == "1", f"{job}\n{log[-4000:]}\n{cluster.logs()}"

    # Saved at a step boundary, on the signal, in the run folder.
    (saved_path,) = (run / "checkpoints").glob("interrupted-step*.ckpt")
    saved = torch.load(saved_path, map_location="cpu", weights_only=True)
    total = epochs * per_epoch
    # The step each process held before, completed, and one more: the processes' agreement on a signal is
    # read a step late, so that no step waits for the GPU (PreemptionCheckpoint).
    assert saved["global_step"] == hold + 2
    assert saved_path.name == f"interrupted-step{saved['global_step']}.ckpt"
    assert f"SIGUSR1 received: saved {saved_path.relative_to(project)} at global step {saved['global_step']}" in log
    assert f"Requeued SLURM job {job_id}" in log
    assert "Traceback" not in log  # wandb's exit hook, which the requeue leaves without its service, says nothing

    # The requeued job restarted from that step on both ranks, not from zero.
    starts = records(record)
    assert sorted((r["restart"], r["rank"]) for r in starts) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {r["global_step"] for r in starts if r["restart"] == 1} == {saved["global_step"]}
    # ... each rank with the very batch it would have trained on next, had it not been stopped.
    for start in starts:
        assert start["labels"] == expected_batch_labels(start["global_step"], start["rank"]), start
    assert "Restored all states from the checkpoint" in log

    # It finished the same number of steps as an uninterrupted run, with the LR schedule continued
    # (a scheduler restarted from zero would have counted only the steps after the resume).
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert last["global_step"] == total
    assert last["lr_schedulers"][0]["last_epoch"] == total
    summary = json.loads((run / "test_metrics.json").read_text())
    tested = torch.load(project / summary["checkpoint"], map_location="cpu", weights_only=True)  # the best one
    assert summary["global_step"] == tested["global_step"] and 0 < summary["global_step"] <= total

    # Same run folder, same logger run: one folder for the job, and every wandb run has its id.
    assert [p.name for p in (project / "logs" / SLUG).iterdir() if p.name.endswith(str(job_id))] == [run.name]
    wandb_runs = sorted((project / "logs" / "wandb").glob(f"offline-run-*-slurm-{job_id}"))
    assert len(wandb_runs) == 2  # the first run and its continuation, synced to one id


def test_task_count_that_disagrees_with_devices_is_refused(cluster: Cluster, project: Path, tmp_path: Path) -> None:
    # One task launched while the Trainer asks for two devices: Lightning alone would train
    # with world size 1 without a word.
    done = cluster.command(
        "srun",
        "--nodes=1",
        "--ntasks=1",
        sys.executable,
        "-m",
        PACKAGE,
        "fit",
        "--config=configs/default.yaml",
        "--trainer.accelerator=cpu",
        "--trainer.strategy=ddp",
        "--trainer.devices=2",
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        check=False,
        cwd=project,
    )
    assert done.returncode != 0
    assert "trainer.num_nodes=1 x trainer.devices=2 asks for 2 processes, but srun (SLURM_NTASKS) started 1" in (
        done.stderr + done.stdout
    )
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_sweep_array_shares_one_study_created_once(cluster: Cluster, project: Path) -> None:
    # sweep.sbatch as its header says for a CPU-only cluster, as a 2-task array whose tasks start
    # together on the 2 CPUs: both create-or-open the study at the same instant. Without the study
    # lock one task died in 3 of 5 such arrays (UNIQUE constraint failed: alembic_version).
    tiny = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2"]
    tiny += ["--test_after_fit=false", "--trainer.enable_progress_bar=false"]
    tiny += ["--trainer.logger=lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir=logs"]
    args = ["--n_trials=2", "--study_name=race", "--args+=--trainer.accelerator=cpu"]
    args += [f"--args+={arg}" for arg in tiny]
    job_id = cluster.sbatch(
        "--gpus-per-node=0",
        "--array=0-1",
        "--cpus-per-task=1",
        "--mem=2G",
        "scripts/slurm/sweep.sbatch",
        *args,
        cwd=project,
        env={"PYTHON": sys.executable, "PRESETS": ""},
    )
    deadline, states = time.monotonic() + 300, {}
    while time.monotonic() < deadline:
        shown = cluster.command("scontrol", "show", "job", "-o", str(job_id)).stdout.splitlines()
        states = dict(re.findall(r"ArrayTaskId=(\d+) .*?JobState=(\w+)", "\n".join(shown)))
        if len(states) == 2 and set(states.values()) <= ENDED:
            break
        time.sleep(1)
    logs = "\n".join(path.read_text() for path in (project / "logs" / "slurm").glob(f"*-sweep-{job_id}_*.out"))
    assert states == {"0": "COMPLETED", "1": "COMPLETED"}, f"{states}\n{logs[-4000:]}"
    assert "bfloat16" not in logs  # PRESETS="" left the gpu preset out: CPU runs in 32-true
    import optuna

    study = optuna.load_study(
        study_name="race", storage=f"sqlite:///{project / 'logs' / 'sweeps' / 'race' / 'study.db'}"
    )
    assert len([trial for trial in study.trials if trial.state.is_finished()]) >= 2
