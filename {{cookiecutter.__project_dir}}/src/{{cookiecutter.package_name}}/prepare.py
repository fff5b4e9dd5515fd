"""``make prepare``: the configured data source, decoded, tokenized or encoded once into a prepared data set.

    python -m {{ cookiecutter.package_name }}.prepare --out data/prepared --config configs/default.yaml [--data.init_args.root=...]
    python -m {{ cookiecutter.package_name }} fit --config configs/default.yaml --data.init_args.prepared=data/prepared
    python -m {{ cookiecutter.package_name }}.prepare --verify data/prepared   # hash every shard in full

Every argument besides ``--out`` and ``--workers`` is the training CLI's: the same configs and
overrides choose the DataModule and its source, so the prepared data set is made with exactly the
settings training will check it against. The DataModule does the work (``write_prepared``), the
core writes the folder atomically and checks it before training (:mod:`engine.prepared`).
"""

import argparse
import os
import sys
import tempfile
import time

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.engine.errors import ConfigError, exit_on_user_error
from {{ cookiecutter.package_name }}.engine.prepared import preparing, verify


def prepare(args: list[str], out: str, workers: int | None = None) -> dict:
    """Build the DataModule of the training ``args`` and write its prepared data set to ``out``.

    Returns:
        the counts ``write_prepared`` reports (samples or tokens per split, ...).

    Raises:
        ValueError: the DataModule has no prepared form, or already reads one (``data.prepared``).
    """
    # The CLI builds a Trainer too: keep it out of logs/. The DataModule reads nothing until write_prepared.
    with tempfile.TemporaryDirectory() as folder, preparing():
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


def main(args: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m {{ cookiecutter.package_name }}.prepare",
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
        print(f'train on it: make train ARGS="--data.init_args.prepared={known.out}"')


if __name__ == "__main__":
    main()
