"""Hyperparameter search with Optuna (https://optuna.org): ``make sweep``
(``python -m {{ cookiecutter.package_name }}.commands.sweep``).

The search space, the metric and the study's settings are one YAML file (``configs/sweep.yaml``).
Each trial is a normal run of ``fit`` (its own run folder, checkpoints and logger run) from the
base config plus the trial's values as ``--key=value`` overrides. Bad trials are pruned from the
validation metric after each epoch (Optuna's pruner through ``optuna_integration``'s
PyTorchLightningPruningCallback). The study lives in a database (SQLite by default), so:

- a killed sweep continues where it stopped: run the same command again. A trial killed mid-run
  stops sending heartbeats; once ``grace_period`` seconds have passed it is marked failed and its
  values are tried again (``RetryHeartbeatStaleTrialCallback``). The continued sweep's sampler is
  reseeded (Optuna's ``reseed_rng``), so it draws new points instead of the first process's again;
- the search space is checked before the first trial: a mistyped key or ``low > high`` is one
  line naming ``params.<key>``, and no trial is left behind;
- several processes can share one study ({% if cookiecutter.include_slurm == "yes" %}``scripts/slurm/sweep.sbatch``: a SLURM job array; every
  task but the first reseeds its sampler{% else %}each running this command with the same ``--storage``: every one but the
  first reseeds its sampler{% endif %}); the study ends once it has ``n_trials`` finished
  (complete or pruned) trials, however many ran them.

Every trial ends its logger run when it ends (pruned ones too), so each trial is its own wandb run.

When it ends, the best trial's full config (its run folder's ``config.yaml``) is copied to
``<sweep folder>/best.yaml``: ``make train CONFIG=<sweep folder>/best.yaml`` trains it again.
A trial stopped by a non-finite loss (StopOnNonFinite) counts as failed and the search goes on.
"""

import contextlib
import datetime
import fcntl
import io
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import lightning as L
import yaml

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.engine import (
    ConfigError,
    NonFiniteError,
    config_paths,
    exit_on_user_error,
    finish_logger_runs,
    run_dir,
)

try:
    import optuna
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState
    from optuna_integration import PyTorchLightningPruningCallback
except ImportError as error:  # the `sweep` extra; make install includes it
    raise SystemExit(
        f"sweep: {error.name} is not installed; install the sweep extra: pip install -e '.[sweep]'"
    ) from None

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def suggest(trial: optuna.Trial, name: str, spec: dict[str, Any]) -> Any:
    """One value for the config key ``name`` from its ``spec`` in the sweep file's ``params``.

    ``{type: float|int, low, high, log: false, step: null}`` or ``{type: categorical, choices: [...]}``.

    Raises:
        ConfigError: an unknown ``type`` or missing bounds, naming ``params.<name>``.
    """
    kind = spec.get("type")
    try:
        if kind == "float":
            return trial.suggest_float(
                name, spec["low"], spec["high"], log=spec.get("log", False), step=spec.get("step")
            )
        if kind == "int":
            return trial.suggest_int(
                name, spec["low"], spec["high"], log=spec.get("log", False), step=spec.get("step", 1)
            )
        if kind == "categorical":
            return trial.suggest_categorical(name, spec["choices"])
    except KeyError as missing:
        raise ConfigError(f"params.{name}: {kind} needs {missing.args[0]!r}") from None
    raise ConfigError(f"params.{name}.type must be float, int or categorical, got {kind!r}")


def sweep(
    params: dict[str, dict[str, Any]],
    metric: str,
    direction: Literal["minimize", "maximize"],
    train_config: str = "configs/default.yaml",
    args: list[str] | None = None,
    study_name: str = "sweep",
    folder: str = "logs/sweeps",
    storage: str | None = None,
    n_trials: int = 20,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
    heartbeat_interval: int = 30,
    grace_period: int = 120,
) -> optuna.Study:
    """Run (or continue) the study until it has ``n_trials`` finished trials; return it.

    Args:
        params: config key (as on the command line, e.g. ``model.init_args.optimizer.init_args.lr``)
            -> its search space (see :func:`suggest`).
        metric: the logged validation metric to optimise and prune on (e.g. ``val/acc``), once per epoch.
        direction: ``maximize`` or ``minimize`` ``metric``.
        train_config: the base config of every trial (what ``make train`` uses).
        args: more ``fit`` arguments for every trial (e.g. ``--trainer.max_epochs=10``).
        study_name: the study's name in the storage; the sweep folder is ``<folder>/<study_name>``.
        folder: where sweep folders go.
        storage: an Optuna storage URL; default ``sqlite:///<sweep folder>/study.db``.
        n_trials: finished (complete or pruned) trials the study ends with, over all processes.
        sampler: an Optuna sampler (default TPESampler(seed=0)).
        pruner: an Optuna pruner (default MedianPruner: stop a trial whose metric after an epoch is
            worse than the median of earlier trials after that epoch).
        heartbeat_interval, grace_period: seconds; a trial without a heartbeat for ``grace_period``
            (its process was killed) is marked failed and retried once.

    Raises:
        ConfigError: a bad ``params`` entry, or a metric the runs do not log.
    """
    if n_trials < 1:
        raise ConfigError(f"n_trials must be at least 1, got {n_trials}")
    sweep_dir = Path(folder) / study_name
    sweep_dir.mkdir(parents=True, exist_ok=True)
    database, study = open_study(
        sweep_dir,
        study_name,
        storage or f"sqlite:///{sweep_dir / 'study.db'}",
        direction=direction,
        sampler=sampler or optuna.samplers.TPESampler(seed=0),
        pruner=pruner or optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1),
        heartbeat_interval=heartbeat_interval,
        grace_period=grace_period,
    )

    def objective(trial: optuna.Trial) -> float:
        overrides = [f"--{name}={suggest(trial, name, spec)}" for name, spec in params.items()]
        # Its own run folder, named after the trial (under SLURM too, where a run is otherwise named
        # after the job: the trials of one array task would share it).
        overrides.append(f"--trainer.logger.init_args.version={study_name}-trial{trial.number}")
        # Built as `fit` builds it (run folder, config.yaml, callbacks), then fit with the pruning
        # callback added; selection is on validation, so the test split stays for the final model.
        cli = build_trial([f"--config={train_config}", *(args or []), *overrides], f"trial {trial.number}")
        pruning = PyTorchLightningPruningCallback(trial, monitor=metric)
        cli.trainer.callbacks.append(pruning)
        trial.set_user_attr("run_dir", str(run_dir(cli.trainer)))
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        finally:  # pruned, failed or complete: the next trial gets its own logger run and folder
            finish_logger_runs()
        return score(cli.trainer, metric, direction)

    check_search_space(params, [f"--config={train_config}", *(args or [])])
    kept_for_best = full_length_values(train_config, args or [])
    fail_trials_killed_before_their_first_heartbeat(study, database, grace_period)
    array_task = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if study.get_trials(deepcopy=False) or array_task not in ("", os.environ.get("SLURM_ARRAY_TASK_MIN")):
        # A continued study, or another task of a job array sharing it: a sampler seeded as the
        # first process was would draw that process's points again (Optuna's own advice for
        # parallel workers: reseed each). A fresh study in one process keeps the configured seed.
        study.sampler.reseed_rng()
    finished = len(study.get_trials(deepcopy=False, states=FINISHED))
    if finished < n_trials:
        print(f"sweep: study {study_name!r} has {finished} of {n_trials} finished trials; storage {database.url}")
        study.optimize(objective, callbacks=[MaxTrialsCallback(n_trials, states=FINISHED)], catch=(NonFiniteError,))
    write_best(study, sweep_dir, kept_for_best)
    return study


@contextlib.contextmanager
def study_lock(sweep_dir: Path) -> Iterator[None]:
    """Hold the exclusive ``flock`` on ``<sweep_dir>/.study.lock`` that :func:`open_study` takes.

    Anything else that opens the study while a sweep may be starting (a script that reads its
    trials, a test) takes it too: Optuna's RDBStorage creates missing tables on open, so a reader
    racing the first worker dies on the same ``UNIQUE constraint failed: alembic_version``.
    """
    with open(sweep_dir / ".study.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def open_study(
    sweep_dir: Path, study_name: str, url: str, heartbeat_interval: int, grace_period: int, **study: Any
) -> tuple[RDBStorage, optuna.Study]:
    """The storage at ``url`` and its study ``study_name``, created by the first of the workers that start together.

    Workers of a SLURM job array start at the same instant, and Optuna's RDBStorage creates its
    tables (and alembic's version row) without a lock of its own: with SQLite two workers both
    tried, and one died on ``UNIQUE constraint failed: alembic_version.version_num`` (optuna issues
    #1092, #4621). Each worker takes an exclusive ``flock`` on ``<sweep_dir>/.study.lock`` (on the
    shared file system) while it creates or opens the storage and the study, so one creates them and
    the others open what it made. SQLite then waits up to 60 s for another worker's write instead of
    failing with "database is locked". Optuna's JournalStorage, its other choice for several
    processes, has no heartbeats, so a killed trial could not be retried.
    """
    wait = {"timeout": 60}  # seconds SQLite waits for another worker's write
    engine = {"connect_args": wait} if url.startswith("sqlite") else None
    with study_lock(sweep_dir), warnings.catch_warnings():
        # optuna marks heartbeat_interval experimental (ExperimentalWarning) since 2.9; it is what
        # lets a killed trial be found and retried.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        database = RDBStorage(
            url,
            engine_kwargs=engine,
            heartbeat_interval=heartbeat_interval,
            grace_period=grace_period,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
        )
        return database, optuna.create_study(study_name=study_name, storage=database, load_if_exists=True, **study)


def build_trial(args: list[str], name: str):
    """The CLI of one trial, built (``run=False``) from ``args``; a refused config is a ConfigError.

    The CLI exits on a config mistake (after printing it); raised as an exception instead, Optuna
    marks the trial failed rather than leaving it RUNNING for a later sweep to retry.
    """
    with mock.patch.object(sys, "argv", sys.argv[:1]):  # LightningCLI warns when it sees both argv and args
        try:
            with contextlib.redirect_stderr(io.StringIO()) as printed:  # said once, below
                return cli_main(args, run=False)
        except SystemExit as refused:
            problem = refused.__cause__ or printed.getvalue().strip().removeprefix("error: ")
            raise ConfigError(f"{name}: the training config refused it: {problem}") from refused.__cause__


def check_search_space(params: dict[str, dict[str, Any]], args: list[str]) -> None:
    """Check every ``params`` entry and that the training config accepts its keys, before any trial exists.

    Each search space must make an Optuna distribution (``low <= high``, a positive ``low`` on a
    log scale, ...), and the training config is built once with each key set to its space's first
    value, so a mistyped key fails here in one line, naming the closest valid key.

    Raises:
        ConfigError: naming ``params.<key>`` and the problem.
    """
    first_values = []
    for name, spec in params.items():
        kind = spec.get("type") if isinstance(spec, dict) else None
        try:
            if kind == "float":
                optuna.distributions.FloatDistribution(
                    spec["low"], spec["high"], log=spec.get("log", False), step=spec.get("step")
                )
                first_values.append(f"--{name}={spec['low']}")
            elif kind == "int":
                optuna.distributions.IntDistribution(
                    spec["low"], spec["high"], log=spec.get("log", False), step=spec.get("step", 1)
                )
                first_values.append(f"--{name}={spec['low']}")
            elif kind == "categorical":
                optuna.distributions.CategoricalDistribution(spec["choices"])
                first_values.append(f"--{name}={spec['choices'][0]}")
            else:
                raise ConfigError(f"params.{name}.type must be float, int or categorical, got {kind!r}")
        except KeyError as missing:
            raise ConfigError(f"params.{name}: {kind} needs {missing.args[0]!r}") from None
        except (ValueError, TypeError, IndexError) as error:
            if isinstance(error, ConfigError):
                raise
            raise ConfigError(f"params.{name}: {error}") from None
    build_trial([*args, *first_values], "params")
    finish_logger_runs()


def fail_trials_killed_before_their_first_heartbeat(
    study: optuna.Study, storage: RDBStorage, grace_period: int
) -> None:
    """Mark failed the trials that have been RUNNING, without any values, for over ``grace_period`` s.

    Optuna finds a killed trial by its stale heartbeat, but a process killed between creating a
    trial and its first heartbeat leaves a trial that stays RUNNING forever. A live trial has its
    values within milliseconds, so one without values after the grace period is dead.
    """
    now = datetime.datetime.now()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        age = (now - trial.datetime_start).total_seconds() if trial.datetime_start else 0.0
        if not trial.params and age > grace_period:
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def score(trainer: L.Trainer, metric: str, direction: str) -> float:
    """The trial's value: the best ``metric`` of the run (its best checkpoint's), else its last value."""
    checkpoint = trainer.checkpoint_callback
    if checkpoint is not None and checkpoint.monitor == metric and checkpoint.best_model_score is not None:
        return float(checkpoint.best_model_score)
    value = trainer.callback_metrics.get(metric)
    if value is None:
        raise ConfigError(f"metric={metric!r} is not logged by the runs; logged: {sorted(trainer.callback_metrics)}")
    return float(value)


# What a sweep's `args` shorten for its trials; best.yaml takes these back from the train config.
TRAINING_LENGTH = (
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.max_time",
    "trainer.limit_train_batches",
    "trainer.limit_val_batches",
    "test_after_fit",
)


def full_length_values(train_config: str, args: list[str]) -> dict[str, Any]:
    """The values the train config and ``args`` give the :data:`TRAINING_LENGTH` keys when ``args``'s own
    settings of those keys are left out: what the sweep shortened for its trials."""
    keys = [key for arg in args if (key := arg[2:].split("=", 1)[0]) in TRAINING_LENGTH]
    if not keys:
        return {}
    others = [arg for arg in args if arg[2:].split("=", 1)[0] not in TRAINING_LENGTH]
    base = build_trial([f"--config={train_config}", *others], "train_config").config
    finish_logger_runs()
    return {key: base.get(key) for key in keys if key in base}


def write_best(study: optuna.Study, sweep_dir: Path, full_length: dict[str, Any] | None = None) -> None:
    """Write the best trial's config to ``best.yaml``, with ``full_length`` values (the train config's own, for
    the keys the sweep's ``args`` shortened), and print it; say so if no trial has completed."""
    completed = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not completed:
        print("sweep: no trial has completed yet; run the same command again to continue")
        return
    best = study.best_trial
    source = Path(best.user_attrs["run_dir"]) / "config.yaml"
    target = sweep_dir / "best.yaml"
    config = yaml.safe_load(source.read_text())
    for key, value in (full_length or {}).items():
        *parents, last = key.split(".")
        section = config
        for name in parents:
            section = section.setdefault(name, {})
        section[last] = value
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    states = [trial.state.name.lower() for trial in study.get_trials(deepcopy=False)]
    counts = ", ".join(f"{states.count(state)} {state}" for state in sorted(set(states)))
    print(f"sweep: {len(states)} trials ({counts}); best is trial {best.number}: value {best.value:.6g}")
    for name, value in best.params.items():
        print(f"  {name} = {value}")
    print(f"sweep: its run folder is {best.user_attrs['run_dir']}; train it again with: make train CONFIG={target}")


def main(argv: list[str] | None = None) -> None:
    """``python -m {{ cookiecutter.package_name }}.commands.sweep --config configs/sweep.yaml [--n_trials=N ...]``."""
    from jsonargparse import auto_cli

    given = sys.argv[1:] if argv is None else argv
    with exit_on_user_error("sweep"):
        for path in config_paths(given):  # a training config (an experiment, a preset) is not the sweep's own file
            if Path(path).resolve().parent.name in ("experiments", "presets"):
                raise ConfigError(
                    f'{path} is a training config: give it to every trial with ARGS="--args+=--config={path}" '
                    "(--config names the sweep's own file, configs/sweep.yaml)"
                )
        auto_cli(sweep, args=argv)


if __name__ == "__main__":
    main()
