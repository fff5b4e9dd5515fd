"""``make prepare``: the configured data source, decoded, tokenized or encoded once into a prepared data set.

    make prepare OUT=data/prepared ARGS="--config configs/experiments/<name>.yaml [...]"
    make train ARGS="--config configs/experiments/<name>.yaml [...] --data.init_args.prepared=data/prepared"
    python -m {{ cookiecutter.package_name }}.commands.prepare --verify data/prepared   # hash every shard in full

Every argument besides ``--out`` and ``--workers`` is the training CLI's: the same configs and
overrides choose the DataModule and its source, so the prepared data set is made with exactly the
settings training will check it against; it ends by printing the training command, those arguments
and ``--data.init_args.prepared``. The bundled example data sets are small enough for memory and have
no prepared form: prepare is for the experiment configs (your own data). The DataModule does the
work (``write_prepared``), the core writes the folder atomically and checks it before training
(:mod:`engine.prepared`).
"""

import argparse
import os
import shlex
import sys
import tempfile
import time
from unittest import mock

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.engine import ConfigError, exit_on_user_error
from {{ cookiecutter.package_name }}.engine.prepared import preparing, verify


def prepare(args: list[str], out: str, workers: int | None = None) -> dict:
    """Build the DataModule of the training ``args`` and write its prepared data set to ``out``.

    Returns:
        the counts ``write_prepared`` reports (samples or tokens per split, ...).

    Raises:
        ValueError: the DataModule has no prepared form, or already reads one (``data.prepared``).
    """
    # The CLI builds a Trainer too: keep it out of logs/. The DataModule reads nothing until write_prepared.
    # The arguments are given as a list: LightningCLI warns when the command line has some too.
    with tempfile.TemporaryDirectory() as folder, preparing(), mock.patch.object(sys, "argv", sys.argv[:1]):
        cli = cli_main([*args, "--trainer.logger=false", f"--trainer.default_root_dir={folder}"], run=False)
    data = cli.datamodule
    name = type(data).__name__
    if not hasattr(data, "write_prepared"):
        raise ConfigError(
            f"data: {name} has no prepared form (no write_prepared method): choose the DataModule of your data, "
            'e.g. ARGS="--config configs/experiments/<experiment>.yaml ..." (configs/experiments/ lists them)'
        )
    if data.hparams.get("prepared"):
        raise ConfigError(
            f"data.prepared={data.hparams.prepared}: prepare reads the source, not a prepared data set; leave "
            "data.prepared out of the arguments of make prepare"
        )
    return data.write_prepared(out, workers=workers)


def train_command(args: list[str], out: str) -> str:
    """The command that trains on the prepared data set ``out`` written with the training ``args``: the
    same configs and overrides, and ``data.prepared``. ``make train`` when ``args`` start as ``make
    prepare`` starts them (its ``--config configs/default.yaml``), else ``python -m ... fit``."""
    prepared = [*args, f"--data.init_args.prepared={out}"]
    if prepared[:2] == ["--config", "configs/default.yaml"]:
        return f"make train ARGS={shlex.quote(shlex.join(prepared[2:]))}"
    return shlex.join(["python", "-m", "{{ cookiecutter.package_name }}", "fit", *prepared])


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }}.commands.prepare",
        description="Write the configured data source as a prepared data set (other arguments: the training CLI's).",
    )
    task = parser.add_mutually_exclusive_group(required=True)
    task.add_argument("--out", help="the folder to write (replaced atomically if it is one already)")
    task.add_argument("--verify", help="a prepared folder: hash every shard and compare with the manifest")
    parser.add_argument("--workers", type=int, default=None, help="processes that decode (default: every core)")
    known, rest = parser.parse_known_args(sys.argv[1:] if args is None else args)
    with exit_on_user_error():
        if known.workers is not None and known.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {known.workers}")
        if known.verify:
            start = time.perf_counter()
            shards, size = verify(known.verify, known.workers)
            seconds = time.perf_counter() - start
            print(f"verified {known.verify}: {shards} shards, {size / 2**20:.1f} MiB as prepared ({seconds:.1f} s)")
            return
        start = time.perf_counter()
        counts = prepare(rest, known.out, known.workers or os.cpu_count())
        seconds = time.perf_counter() - start
        summary = ", ".join(f"{key}={value}" for key, value in counts.items())
        print(f"prepared {known.out}: {summary} in {seconds:.1f} s")
        print(f"train on it: {train_command(rest, known.out)}")


if __name__ == "__main__":
    main()
