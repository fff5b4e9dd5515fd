"""make sweep: an Optuna study killed after its first trial continues to its trial count, and names its best config."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import ROOT, shrunk_args, user_error
from optuna.trial import TrialState

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.sweep import main as sweep_main
from {{ cookiecutter.package_name }}.commands.sweep import study_lock, sweep
from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.run_folders import run_dir

LEARNING_RATE = {"type": "float", "low": 1e-4, "high": 1e-2, "log": True}


def write_sweep(tmp_path: Path, n_trials: int = 3) -> Path:
    """A tiny study: learning rate only, runs of 2 epochs of 4 batches, heartbeats every second (stale after 2 s)."""
    spec = {
        "study_name": "tiny",
        "folder": str(tmp_path / "sweeps"),
        "train_config": str(ROOT / "configs" / "default.yaml"),
        "args": [arg for arg in shrunk_args(tmp_path) if not arg.startswith("--config=")]
        + ["--trainer.max_epochs=2", "--trainer.limit_train_batches=4", "--trainer.limit_val_batches=2"]
        + ["--trainer.log_every_n_steps=2", "--test_after_fit=false", "--trainer.enable_progress_bar=false"]
        + ["--trainer.check_val_every_n_epoch=1", "--trainer.val_check_interval=1.0"],  # once an epoch, every task
        "metric": "val/loss",
        "direction": "minimize",
        "n_trials": n_trials,
        "params": {"model.init_args.optimizer.init_args.lr": LEARNING_RATE},
        "heartbeat_interval": 1,
        "grace_period": 2,
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    """The tiny study's trials, read under the sweep's own lock: a sweep may be creating its tables."""
    sweep_dir = tmp_path / "sweeps" / "tiny"
    if not (sweep_dir / "study.db").exists():
        return []
    with study_lock(sweep_dir):
        try:
            return optuna.load_study(study_name="tiny", storage=f"sqlite:///{sweep_dir / 'study.db'}").get_trials()
        except KeyError:  # the database exists, the study not yet
            return []


@pytest.mark.slow
def test_a_killed_sweep_continues_to_its_trial_count(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}.commands.sweep", f"--config={write_sweep(tmp_path)}"]
    first = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 240
        while not any(t.state == TrialState.COMPLETE for t in trials(tmp_path)):
            assert first.poll() is None and time.monotonic() < deadline, "the first trial did not complete"
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # as a node failure or `scancel` would: no clean-up at all
        first.wait()
    killed = [t for t in trials(tmp_path) if t.state == TrialState.RUNNING]
    assert len([t for t in trials(tmp_path) if t.state == TrialState.COMPLETE]) == 1

    time.sleep(2.5)  # past grace_period: the killed trial's heartbeat is stale
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has 1 of 3 finished trials" in done.stdout

    final = trials(tmp_path)
    finished = [t for t in final if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 3
    for stale in killed:  # a trial killed mid-run is marked failed, and its values (if drawn) tried again
        assert final[stale.number].state == TrialState.FAIL
        retries = [t.params for t in final if t.system_attrs.get("failed_trial") == stale.number]
        assert retries == ([stale.params] if stale.params else [])
    # The continued sweep drew new points: equal values only where a killed trial was retried.
    drawn = [tuple(sorted(t.params.items())) for t in final if t.params and "failed_trial" not in t.system_attrs]
    assert len(set(drawn)) == len(drawn), f"a continued sweep drew the same point again: {drawn}"
    # Every trial is a normal run with its own run folder and config.
    run_dirs = {t.user_attrs["run_dir"] for t in finished}
    assert len(run_dirs) == 3 and all((Path(d) / "config.yaml").is_file() for d in run_dirs)
    # The best trial's config trains as it is (make train CONFIG=...best.yaml).
    best = tmp_path / "sweeps" / "tiny" / "best.yaml"
    assert f"train it again with: make train CONFIG={best}" in done.stdout
    study_best = min(finished, key=lambda t: t.value if t.value is not None else float("inf"))
    config = yaml.safe_load(best.read_text())
    assert (
        config["model"]["init_args"]["optimizer"]["init_args"]["lr"]
        == study_best.params["model.init_args.optimizer.init_args.lr"]
    )
    # The sweep's shortened trials (2 epochs of 4 batches, no test) give way to the train config's own length.
    rebuilt = main([f"--config={best}"], run=False)
    base = main([f"--config={ROOT / 'configs' / 'default.yaml'}"], run=False)
    assert (rebuilt.trainer.max_epochs, rebuilt.trainer.limit_train_batches) == (base.trainer.max_epochs, 1.0)
    assert base.trainer.max_epochs != 2 and config["test_after_fit"] is True
    assert config["trainer"]["logger"]["init_args"]["save_dir"] == str(tmp_path / "logs")  # other args stay
    # ... as a new run: its own run folder, not the trial's (whose logger run has ended).
    again = main(["fit", f"--config={best}", "--trainer.max_epochs=1"])
    assert str(run_dir(again.trainer)) not in run_dirs and run_dir(again.trainer).name.startswith("best-")
    assert all(sorted(p.name for p in Path(d).glob("config*.yaml")) == ["config.yaml"] for d in run_dirs)


UNIFORM = {"type": "uniform", "low": 0, "high": 1}  # not an Optuna distribution name here
BACKWARDS = {"type": "float", "low": 0.1, "high": 0.01}


# A worker as a SLURM array task starts one: it opens the study of each round's folder at that round's instant.
WORKER = """
import sys, time
from pathlib import Path
from {{ cookiecutter.package_name }}.commands.sweep import open_study
root, start, rounds = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
for round in range(rounds):
    folder = root / f"round{round}"
    folder.mkdir(exist_ok=True)
    while time.time() < start + round:
        pass
    open_study(folder, "race", f"sqlite:///{folder / 'study.db'}", heartbeat_interval=1, grace_period=2)
"""


@pytest.mark.slow  # starts 3 processes
def test_workers_that_start_at_the_same_instant_all_open_one_study(tmp_path: Path) -> None:
    # Without the lock 10 of 10 rounds of 3 workers lost one: UNIQUE constraint failed: alembic_version.
    rounds, start = 6, time.time() + 15  # after every worker has imported the package
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(start), str(rounds)], stderr=subprocess.PIPE)
        for _ in range(3)
    ]
    errors = [worker.communicate(timeout=120)[1].decode() for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0], "\n".join(errors)[-3000:]
    assert time.time() > start + rounds - 1  # every round ran at its instant, none before
    for round in range(rounds):
        storage = f"sqlite:///{tmp_path / f'round{round}' / 'study.db'}"
        assert [summary.study_name for summary in optuna.get_all_study_summaries(storage)] == ["race"]


def tiny_sweep(tmp_path: Path, n_trials: int, extra: list[str] = (), params: dict | None = None) -> optuna.Study:
    """The tiny study of :func:`write_sweep`, run in this process."""
    spec = yaml.safe_load(write_sweep(tmp_path, n_trials).read_text())
    spec["args"] += list(extra)
    if params is not None:
        spec["params"] = params
    return sweep(**spec)


def test_a_continued_sweep_draws_new_points(tmp_path: Path) -> None:
    first = tiny_sweep(tmp_path, n_trials=1).trials[0].params
    continued = tiny_sweep(tmp_path, n_trials=2).trials[1].params  # a new process would start the same way
    assert continued != first


{% if cookiecutter.logger == "wandb" %}def test_each_trial_is_its_own_wandb_run_and_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    wandb_logger = [
        "--trainer.logger=lightning.pytorch.loggers.WandbLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'logs'}",
        "--trainer.logger.init_args.project=tiny",
    ]
    study = tiny_sweep(tmp_path, n_trials=2, extra=wandb_logger)
    run_dirs = [Path(trial.user_attrs["run_dir"]) for trial in study.trials]
    assert [d.name for d in run_dirs] == ["tiny-trial0", "tiny-trial1"]
    for run in run_dirs:  # one config each (none "resumed"), and each trial's own last.ckpt
        assert sorted(p.name for p in run.glob("config*.yaml")) == ["config.yaml"]
        assert (run / "checkpoints" / "last.ckpt").is_file()
    runs = {path.name.split("-", 3)[-1] for path in (tmp_path / "logs" / "wandb").glob("offline-run-*")}
    assert runs == {"tiny-trial0", "tiny-trial1"}


{% endif %}@pytest.mark.parametrize(
    ("params", "message"),
    [
        (
            {"model.init_args.optimizer.init_args.lrr": LEARNING_RATE},
            r"model\.init_args\.optimizer\.init_args\.lrr: no such option of torch\.optim\.AdamW; did you mean",
        ),
        ({"model.init_args.optimizer.init_args.lr": BACKWARDS}, r"params\.model.*low"),
    ],
    ids=["typo", "low-above-high"],
)
def test_a_bad_search_space_fails_before_any_trial(tmp_path: Path, params: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tiny_sweep(tmp_path, n_trials=1, params=params)
    assert trials(tmp_path) == []  # nothing RUNNING for a later sweep to retry


def test_a_bad_search_space_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"params\.model\.init_args\.net\.init_args\.dropout\.type must be float, int or categorical"
    ):
        sweep(
            params={"model.init_args.net.init_args.dropout": UNIFORM},
            metric="val/loss",
            direction="minimize",
            args=[arg for arg in shrunk_args(tmp_path) if not arg.startswith("--config=")],
            folder=str(tmp_path / "sweeps"),
            n_trials=1,
        )


def test_an_experiment_given_as_the_sweeps_config_says_how_to_give_it_to_the_trials() -> None:
    # make sweep ARGS="--config configs/experiments/<name>.yaml", as make train takes it: the sweep's --config is
    # its own file, so the experiment's keys failed in jsonargparse's words.
    experiment = sorted((ROOT / "configs" / "experiments").glob("*.yaml"))[0].relative_to(ROOT)
    with user_error(rf'{experiment} is a training config: give it to every trial with ARGS="--args\+=--config='):
        sweep_main(["--config", str(ROOT / "configs" / "sweep.yaml"), "--config", str(experiment)])
