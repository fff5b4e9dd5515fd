"""``make find-lr`` and ``make find-batch-size``: a learning rate and a batch size for the run ``make train`` starts.

    python -m {{ cookiecutter.package_name }}.commands.find lr [--min_lr 1e-6] [--max_lr 1] [--num_training 100] [ARGS]
    python -m {{ cookiecutter.package_name }}.commands.find batch-size [--max_trials 25] [--max_batch_size 8192] [ARGS]

(``ARGS``: ``--config FILE`` and any option of ``make train``.)

Both build the Trainer, model and DataModule through the project's CLI (the same configs, checks and
trust rule as ``make train``; ``make`` passes its ``CONFIG``), then run Lightning's ``Tuner``
(https://lightning.ai/docs/pytorch/stable/advanced/training_tricks.html):

- **lr**: the learning-rate range test (L. N. Smith, "Cyclical Learning Rates for Training Neural
  Networks", 2017, arXiv:1506.01186): ``num_training`` optimizer steps with the learning rate rising
  exponentially from ``min_lr`` to ``max_lr``, stopped early once the loss exceeds 4 times its best;
  the suggestion is the rate where the smoothed loss falls fastest per decade of rate (:func:`steepest_fall`).
  Its plot is ``lr_find.png``.
- **batch-size**: trains 3 steps (and validates 3 batches) at batch 2, 4, 8,
  ... until a step runs out of memory, then (``binsearch``) halves the gap between the last size that
  ran and the first that did not; the suggestion is the largest that ran, less a 5 % margin. The
  training split's size, ``max_batch_size`` and ``max_trials`` end the search too: on a CPU with
  plenty of memory one of them always does, so the answer matters on a GPU.

Neither keeps what it trained (the Tuner restores the weights it started from) nor changes a file of
``configs/``: each prints the override to pass to ``make train`` and writes into a folder of its own,
``logs/find/<lr|batch-size>-<config>-<time>/``: the config searched (``config.yaml``) and the result
(``lr_find.json`` and ``lr_find.png``, or ``batch_size.json``). Both search on one device: a DDP or
FSDP setting is refused in one line. The learning rate that suits a batch size depends on it: find
the batch size first, then the learning rate at that batch size.
"""

import argparse
import json
import logging
import math
import sys
from datetime import datetime
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.tuner import Tuner

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.engine import ConfigError, exit_on_user_error

# Where the configured optimizer's learning rate is set, on the command line and in a config.
LR_OPTION = "model.init_args.optimizer.init_args.lr"
BATCH_SIZE_OPTION = "data.init_args.batch_size"
# Optimizer steps (and validation batches) run at each batch size tried: Lightning's default.
STEPS_PER_TRIAL = 3
# Lightning's lines that this command says better: the Tuner saves its starting point without naming
# weights_only ("`weights_only` was not set, defaulting to `False`"), and its batch-size answer comes before
# the training split's cap below ("will continue with full run using batch size 486", then ours: 397).
TUNER_NOISE = {
    "lightning.pytorch.trainer.connectors.checkpoint_connector": "`weights_only` was not set",
    "lightning.pytorch.tuner.batch_size_scaling": "Finished batch size finder",
}


def _drop_tuner_noise(record: logging.LogRecord) -> bool:
    return TUNER_NOISE.get(record.name, "\0") not in record.getMessage()


def build(what: str, configs: list[str], cli_args: list[str], steps: int):
    """The run ``make train`` would start with these configs and arguments, for ``steps`` optimizer steps at most,
    writing into a find folder of its own.

    Raises:
        ConfigError: the configs ask for several devices or a sharded strategy (the Tuner searches on one).
    """
    stem = Path(configs[-1]).stem if configs else "run"
    folder = Path("logs", "find", f"{what}-{stem}-{datetime.now():%Y%m%d-%H%M%S}")
    args = [*(f"--config={path}" for path in configs), *cli_args]
    # No logger (the Tuner would log nothing into it): the folder is the run folder. The search's step count
    # ends it, not the config's max_epochs of a short split (the schedule is built for as many steps).
    # The arguments are handed over as ``args``; sys.argv is set aside meanwhile, or LightningCLI would
    # warn that both were given.
    for name in TUNER_NOISE:
        logging.getLogger(name).addFilter(_drop_tuner_noise)
    argv, sys.argv = sys.argv, sys.argv[:1]
    try:
        cli = cli_main(
            [
                *args,
                "--trainer.logger=false",
                f"--trainer.default_root_dir={folder}",
                "--trainer.max_epochs=-1",
                f"--trainer.max_steps={steps}",
            ],
            run=False,
        )
    finally:
        sys.argv = argv
    if not isinstance(cli.trainer.strategy, SingleDeviceStrategy):
        raise ConfigError(
            f"Lightning's Tuner searches on one device, and this config runs "
            f"{type(cli.trainer.strategy).__name__} on {cli.trainer.num_devices} device(s) x {cli.trainer.num_nodes} "
            "node(s): leave out the ddp/fsdp preset and give --trainer.devices=1 (then train with the preset)"
        )
    return cli, folder


def find_lr(configs: list[str], cli_args: list[str], min_lr: float, max_lr: float, num_training: int) -> float:
    """Run the learning-rate range test; print and save its suggestion and plot, and return the suggestion.

    Raises:
        ConfigError: one device needed (:func:`build`), or no suggestion (too few steps before the loss diverged).
    """
    if not 0 < min_lr < max_lr:
        raise ConfigError(f"need 0 < --min_lr < --max_lr, got {min_lr} and {max_lr}")
    cli, folder = build("lr", configs, cli_args, num_training)
    finder = Tuner(cli.trainer).lr_find(
        cli.model,
        datamodule=cli.datamodule,
        min_lr=min_lr,
        max_lr=max_lr,
        num_training=num_training,
        update_attr=False,  # the model keeps the configured rate; the user decides
    )
    folder.mkdir(parents=True, exist_ok=True)
    lrs, losses = finder.results["lr"], finder.results["loss"]
    steepest = steepest_fall(lrs, losses)
    suggestion = None if steepest is None else lrs[steepest]
    plot_range_test(lrs, losses, steepest, folder / "lr_find.png")
    configured = cli.config.get(LR_OPTION)
    result = {
        "suggestion": suggestion,
        "configured": configured,
        "min_lr": min_lr,
        "max_lr": max_lr,
        "steps": len(lrs),
        "lr": lrs,
        "loss": losses,
    }
    (folder / "lr_find.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot = folder / "lr_find.png"
    print(f"Learning-rate range test: {result['steps']} steps from {min_lr:g} to {max_lr:g}; plot: {plot}")
    if suggestion is None:
        raise ConfigError(
            f"no suggestion, the loss diverged after {result['steps']} steps (too few to smooth): "
            "give a smaller --max_lr or more --num_training steps; the losses are in "
            f"{folder / 'lr_find.json'}"
        )
    print(f"Suggested learning rate: {suggestion:.3g} (configured: {configured})")
    print(f'Train with it: make train ARGS="--{LR_OPTION}={suggestion:.3g}"')
    return suggestion


def steepest_fall(lrs: list[float], losses: list[float], skip_begin: int = 10, skip_end: int = 1) -> int | None:
    """The index of the steepest fall of the smoothed loss against log10 of the learning rate, or None (< 2 points).

    The rates rise exponentially, so the slope is taken per decade, as the range test reads its plot.
    Lightning 2.6's ``suggestion()`` takes it per unit of rate instead (issue #21141), which picks the
    noise at the smallest rates: on the bundled table it suggested 6e-6 where this gives 2e-3. The first
    ``skip_begin`` and last ``skip_end`` steps are left out as Lightning does; non-finite losses too.
    """
    kept = [i for i in range(skip_begin, len(lrs) - skip_end) if math.isfinite(losses[i])]
    if len(kept) < 2:
        return None
    slope = torch.gradient(
        torch.tensor([losses[i] for i in kept]), spacing=[torch.log10(torch.tensor([lrs[i] for i in kept]))]
    )[0]
    return kept[int(slope.argmin())]


def plot_range_test(lrs: list[float], losses: list[float], steepest: int | None, path: Path) -> None:
    """Loss against learning rate (log scale), the suggestion marked, as a PNG at ``path``."""
    figure, axes = plt.subplots(figsize=(6, 4))
    axes.plot(lrs, losses)
    if steepest is not None:
        axes.plot(lrs[steepest], losses[steepest], "o", color="red", label=f"suggestion {lrs[steepest]:.3g}")
        axes.legend()
    axes.set(xscale="log", xlabel="learning rate", ylabel="training loss (smoothed)", title="learning-rate range test")
    figure.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(figure)


def find_batch_size(configs: list[str], cli_args: list[str], max_trials: int, max_batch_size: int, mode: str) -> int:
    """Search the largest batch size that trains and validates without running out of memory; print, save, return it.

    Raises:
        ConfigError: one device needed (:func:`build`), or not even the smallest batch ran.
    """
    cli, folder = build("batch-size", configs, cli_args, STEPS_PER_TRIAL)
    configured = cli.datamodule.batch_size
    found = Tuner(cli.trainer).scale_batch_size(
        cli.model,
        datamodule=cli.datamodule,
        mode=mode,
        max_trials=max_trials,
        max_val=max_batch_size,
        steps_per_trial=STEPS_PER_TRIAL,
    )
    if not found:
        raise ConfigError(f"not even batch size 2 ran on {cli.trainer.strategy.root_device}")
    train_samples = len(cli.datamodule.train_set) if cli.datamodule.train_set is not None else None
    if train_samples is not None:
        found = min(found, train_samples)  # a larger batch is refused by make train (a short epoch of one batch)
    folder.mkdir(parents=True, exist_ok=True)
    result = {
        "suggestion": found,
        "configured": configured,
        "device": str(cli.trainer.strategy.root_device),
        "mode": mode,
        "max_trials": max_trials,
        "max_batch_size": max_batch_size,
        "train_samples": train_samples,
    }
    (folder / "batch_size.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    limit = "the training split" if found == train_samples else "memory, --max_batch_size or --max_trials"
    print(f"Largest batch size that ran on {result['device']}: {found} (configured: {configured}; limited by {limit})")
    print(f'Train with it: make train ARGS="--{BATCH_SIZE_OPTION}={found}" (then make find-lr at this batch size)')
    return found


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__package__}.find",
        description="Find a learning rate (lr) or the largest batch size (batch-size) for the run make train "
        "would start; other arguments go to the project's CLI.",
    )
    parser.add_argument("what", choices=("lr", "batch-size"), help="what to find")
    parser.add_argument("--config", action="append", default=[], help="a config file, as for make train (repeatable)")
    parser.add_argument("--min_lr", type=float, default=1e-6, help="lr: the first learning rate tried")
    parser.add_argument("--max_lr", type=float, default=1.0, help="lr: the last learning rate tried")
    parser.add_argument("--num_training", type=int, default=100, help="lr: optimizer steps over the range")
    parser.add_argument("--max_trials", type=int, default=25, help="batch-size: batch sizes tried at most")
    parser.add_argument(
        "--max_batch_size",
        type=int,
        default=8192,
        help="batch-size: never tried above this (Lightning's search stops at 8192 in any case)",
    )
    parser.add_argument(
        "--mode", choices=("binsearch", "power"), default="binsearch", help="batch-size: refine between sizes, or not"
    )
    known, cli_args = parser.parse_known_args(sys.argv[1:] if args is None else args)
    with exit_on_user_error(f"find {known.what}"):
        if known.what == "lr":
            find_lr(known.config, cli_args, known.min_lr, known.max_lr, known.num_training)
        else:
            find_batch_size(known.config, cli_args, known.max_trials, known.max_batch_size, known.mode)


if __name__ == "__main__":
    main()
