"""``make cv``: k-fold cross-validation of the run ``make train`` would start, fold by fold, resumable.

    python -m {{ cookiecutter.package_name }}.commands.cv [--folds 5] [--name NAME] [--config FILE ...] [CLI arguments ...]

Fold ``k`` is a ``fit`` of the configs and arguments given plus ``--data.init_args.num_folds=K
--data.init_args.fold=k``: the DataModule's own split (:func:`engine.datamodule.split_indices`) keeps
its test split out of every fold and validates on fold ``k`` of seeded, stratified folds of the rest,
so over the K runs every other sample is validated on once. Each fold is a run of its own (run
folder, checkpoints, logger run, the test of its best checkpoint) under one parent folder,
``logs/cv/<name>/`` (``name``: the last config's file name)::

    logs/cv/<name>/cv.json                        the folds, the arguments, each finished fold's scores, mean and std
    logs/cv/<name>/<experiment>/<name>-fold<k>/   fold k's run folder

A fold's score is its best checkpoint (the first ModelCheckpoint's) validated on its own fold: every
``val/`` metric; the summary is their mean and sample standard deviation over the folds.

Resumable fold by fold: the same command again keeps the finished folds, continues the interrupted
one from its newest checkpoint (``--resume=true`` on its run: exact resume, as ``make resume``) and
starts the rest. The folds run one after another on one device (DDP or FSDP settings are refused in
one line); a name whose ``cv.json`` was made with other folds or arguments is refused (give ``--name``).
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from lightning.pytorch.strategies import SingleDeviceStrategy

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.engine import ConfigError, PreemptionCheckpoint, exit_on_user_error, finish_logger_runs, run_dir


def run_cli(args: list[str], run: bool = True):
    """The project's CLI on ``args``, with sys.argv set aside (LightningCLI warns when both are given)."""
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        return cli_main(args, run=run)
    finally:
        sys.argv = argv


def fold_args(args: list[str], parent: Path, folds: int, fold: int) -> list[str]:
    """``args`` for fold ``fold`` of ``folds``: its split, and its run folder and logger run under ``parent``."""
    return [
        *args,
        f"--data.init_args.num_folds={folds}",
        f"--data.init_args.fold={fold}",
        f"--trainer.default_root_dir={parent}",
        f"--trainer.logger.init_args.save_dir={parent}",
        f"--trainer.logger.init_args.version={parent.name}-fold{fold}",  # a wandb run id too: unique per cv
    ]


def load_state(path: Path, folds: int, args: list[str]) -> dict:
    """The cv's ``cv.json``, or a new one; refuses one made with other folds or arguments.

    Raises:
        ConfigError: ``path`` holds another cross-validation (names the fix).
    """
    if not path.is_file():
        return dict(folds=folds, args=args, results={})
    state = json.loads(path.read_text(encoding="utf-8"))
    if state.get("folds") != folds or state.get("args") != args:
        raise ConfigError(
            f"{path} is a cross-validation with {state.get('folds')} folds and the arguments {state.get('args')}: "
            "give its own arguments to continue it, --name <other> for a new one, or remove the folder"
        )
    return state


def save_state(path: Path, state: dict) -> None:
    """Write ``cv.json`` whole or not at all (a temporary file, renamed)."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    partial.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    os.replace(partial, path)


def summarize(results: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Mean and sample standard deviation over the folds of each metric that every fold has."""
    scores = [result["val"] for result in results.values()]
    names = sorted(set.intersection(*(set(score) for score in scores))) if scores else []
    return {
        name: {
            "mean": statistics.fmean(score[name] for score in scores),
            "std": statistics.stdev(score[name] for score in scores) if len(scores) > 1 else 0.0,
        }
        for name in names
    }


def run_fold(args: list[str], parent: Path, folds: int, fold: int) -> dict:
    """Fit fold ``fold`` (continuing a run that has a checkpoint), validate its best checkpoint, return the scores."""
    version = f"{parent.name}-fold{fold}"
    started = any(parent.glob(f"**/{version}/checkpoints/*.ckpt"))
    print(f"Fold {fold} of {folds}: {'continuing its run' if started else 'a new run'}", flush=True)
    cli = run_cli(["fit", *fold_args(args, parent, folds, fold), *(["--resume=true"] if started else [])])
    trainer = cli.trainer
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    # The best checkpoint on this fold's validation split, not logged: the run's curves stay the fit's own.
    loggers, trainer.loggers = trainer.loggers, []
    try:
        (scores,) = trainer.validate(cli.model, datamodule=cli.datamodule, ckpt_path=best or None, verbose=False)
    finally:
        trainer.loggers = loggers
    folder = run_dir(trainer)
    finish_logger_runs()  # the next fold is a logger run of its own
    scores = {name: float(value) for name, value in scores.items()}
    return {"run": str(folder), "checkpoint": best, "val": scores}


def cross_validate(configs: list[str], cli_args: list[str], folds: int, name: str | None) -> dict:
    """Run the folds not yet finished, print the table of scores, and return ``cv.json``'s content.

    Raises:
        ConfigError: fewer than 2 folds, a multi-device config, or a name taken by another cross-validation.
    """
    if folds < 2:
        raise ConfigError(f"--folds must be at least 2, got {folds}")
    args = [*(f"--config={path}" for path in configs), *cli_args]
    parent = Path("logs", "cv", name or (Path(configs[-1]).stem if configs else "run"))
    # Every fold's arguments parse and build before the first fold trains (fold 0's stand for all).
    trainer = run_cli(fold_args(args, parent, folds, 0), run=False).trainer
    if not isinstance(trainer.strategy, SingleDeviceStrategy):
        raise ConfigError(
            f"make cv runs its folds one after another on one device, and this config runs "
            f"{type(trainer.strategy).__name__} on {trainer.num_devices} device(s): leave out the ddp/fsdp preset"
        )
    path = parent / "cv.json"
    state = load_state(path, folds, args)
    parent.mkdir(parents=True, exist_ok=True)
    try:
        for fold in range(folds):
            if str(fold) in state["results"]:
                continue
            # An interrupted fold continues with the cross-validation, not `make resume` (its own run alone).
            PreemptionCheckpoint.continue_with = f"`make cv` again with the same arguments (it continues fold {fold})"
            state["results"][str(fold)] = run_fold(args, parent, folds, fold)
            state["summary"] = summarize(state["results"])
            save_state(path, state)
    finally:
        PreemptionCheckpoint.continue_with = None
    report(state, path)
    return state


def report(state: dict, path: Path) -> None:
    """The scores of every fold, then their mean and standard deviation, as a table."""
    names = list(state["summary"])
    width = max(10, *(len(name) + 2 for name in names))
    print(f"\nCross-validation, {state['folds']} folds (the test split is in none of them): {path}")
    print("fold".ljust(6) + "".join(name.rjust(width) for name in names))
    for fold, result in state["results"].items():
        print(fold.ljust(6) + "".join(f"{result['val'][name]:.4f}".rjust(width) for name in names))
    for statistic in ("mean", "std"):
        print(statistic.ljust(6) + "".join(f"{state['summary'][name][statistic]:.4f}".rjust(width) for name in names))


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.cv",
        description="K-fold cross-validation of the run make train would start: a run per fold, then the mean "
        "and standard deviation of the validation metrics; other arguments go to the project's CLI.",
    )
    parser.add_argument("--folds", type=int, default=5, help="K, the number of folds")
    parser.add_argument("--name", default=None, help="the folder under logs/cv/ (default: the last config's name)")
    parser.add_argument("--config", action="append", default=[], help="a config file, as for make train (repeatable)")
    known, cli_args = parser.parse_known_args(sys.argv[1:] if args is None else args)
    with exit_on_user_error("cv"):
        cross_validate(known.config, cli_args, known.folds, known.name)


if __name__ == "__main__":
    main()
