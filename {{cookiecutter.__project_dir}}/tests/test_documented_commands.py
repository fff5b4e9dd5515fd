"""Every command the docs write runs: each `make` line of README.md, AGENTS.md, docs/, the configs' comments and
the batch script expands (``make -n``), and each that starts a training run parses and builds its whole config
(Trainer, model and DataModule, the launch checks included) as that command would, without training.

A target name that resolves is not enough: an experiment config given as the whole config, and the fsdp2 preset
given to ``make train-ddp``, resolved, and both failed when run.
"""

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from conftest import ROOT

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.errors import config_paths

PACKAGE = "{{ cookiecutter.package_name }}"
SOURCES = ["README.md", "AGENTS.md", "docs/*.md", "configs/**/*.yaml", "scripts/*/*.sbatch"]
# `make <target>` and its VAR=value words (a value quoted or bare), at the start of a piece of code.
COMMAND = re.compile(r"^make ([a-z][\w-]*)((?: +[A-Z_]+=(?:\"[^\"]*\"|'[^']*'|[^\s`\"']+))*)")
# What a reader fills in: a documented command with one of these runs only as far as make -n.
PLACEHOLDER = re.compile(r"<|\.\.\.")


def code_of(path: Path) -> list[tuple[int, str]]:
    """``(line, code)`` of a file's code: in Markdown the fenced blocks' lines and the `code spans`; in a config
    or script its comments' lines."""
    pieces = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if path.suffix != ".md":
            pieces += [(number, line.lstrip("# ").strip())] if line.lstrip().startswith("#") else []
        elif line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            pieces.append((number, line.strip()))
        else:
            pieces += [(number, span.strip()) for span in re.findall(r"`([^`]+)`", line)]
    return pieces


def documented_commands() -> list[tuple[str, str]]:
    """``(where, command)`` for every make command of the docs, once each: where is ``file:line``."""
    found: dict[str, str] = {}
    for pattern in SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            for number, code in code_of(path):
                if match := COMMAND.match(code):
                    found.setdefault(match.group(0).strip(), f"{path.relative_to(ROOT)}:{number}")
    return sorted((where, command) for command, where in found.items())


COMMANDS = documented_commands()


def test_the_docs_write_commands_of_every_kind() -> None:
    # The extraction itself: a regular expression that matched nothing would pass every test below.
    targets = {shlex.split(command)[1] for _, command in COMMANDS}
    assert {"install", "train", "resume", "test", "predict", "train-ddp"} <= targets, targets
    assert len(COMMANDS) > 20


def expanded(command: str) -> list[list[str]]:
    """The shell words of each line ``command``'s recipe runs, as ``make -n`` prints them (nothing runs)."""
    words = shlex.split(command)
    done = subprocess.run(
        [*words[:1], "-n", "--no-print-directory", f"PYTHON={sys.executable}", *words[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={key: value for key, value in os.environ.items() if not key.startswith("MAKE")},
        timeout=60,
    )
    assert done.returncode == 0, f"make -n refuses it: {done.stderr.strip()}"
    return [words_of(line) for line in done.stdout.replace("\\\n", " ").splitlines() if line.strip()]


def words_of(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError:  # a shell fragment of a recipe (an if, a case) that no training line is
        return line.split()


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[command for _, command in COMMANDS])
def test_a_documented_command_expands_and_a_training_one_builds_its_run(
    where: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = expanded(command)
    run = next((arguments for line in lines if (arguments := training_arguments(line))), None)
    if run is None or PLACEHOLDER.search(command):
        return  # not a training run (install, test, predict, ...), or one the reader completes
    args, env = run
    if any(not (ROOT / path).is_file() and Path(path).parts[0] == "logs" for path in config_paths(args)):
        return  # a config a run writes (a sweep's best.yaml)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.chdir(ROOT)
    arguments = [arg for arg in args if not arg.startswith("--resume")]  # a resume needs a run before it
    try:
        cli = main([*arguments, f"--trainer.default_root_dir={tmp_path}"], run=False)
    except (ModuleNotFoundError, ValueError) as error:  # an extra this environment lacks (jsonargparse wraps it)
        if "No module named" not in str(error):
            raise
        pytest.skip(f"{where}: needs a package not installed here: {error}")
    except SystemExit as stop:  # a user error: one line on stderr, exit 2
        message = str(stop.__cause__ or stop)
        data = readers_data(arguments)
        reached_data = any(f"={value}:" in message or f" {value} does not exist" in message for value in data)
        if stop.code == 0 or reached_data:
            return  # --print_config printed; or the whole config built up to the reader's own data (DIR, my.csv)
        if "local Hugging Face cache" in message or "needs a CUDA GPU" in message or "No module named" in message:
            pytest.skip(f"{where}: needs what this machine has not (offline, no GPU, an extra): {message}")
        pytest.fail(f"{where}: `{command}` stops before training: {message}")
    assert cli.trainer is not None and cli.model is not None and cli.datamodule is not None


def readers_data(args: list[str]) -> list[str]:
    """The data paths of ``args`` that do not exist here: the reader's own (DIR, my.csv) or a run's (data/prepared)."""
    given = [arg.split("=", 1) for arg in args if re.match(r"--data\.init_args\.(path|root|prepared)=", arg)]
    missing = [value for _, value in given if not (ROOT / value).exists()]
    return missing + [str(Path(value)) for value in missing]  # as written, and as a message prints it (my_texts/)


class BuiltError(Exception):
    """Raised by a command's stand-in: it was handed the arguments its training run is built from."""

    def __init__(self, args: list[str]) -> None:
        self.args = args


def training_arguments(words: list[str]) -> tuple[list[str], dict] | None:
    """The CLI arguments of the training run a recipe line starts, with the environment its launcher sets;
    None for a line that starts none. A command of ``commands/`` (cv, find, bench, prepare) is run with its
    work replaced, so that its own parser says which arguments go to the training run."""
    if "-m" not in words:
        return None
    module = words[words.index("-m") + 1]
    env = {}
    if module == "torch.distributed.run":  # torchrun's environment: the world-size check runs at build
        processes = next(word.split("=", 1)[1] for word in words if word.startswith("--nproc-per-node="))
        env = dict(RANK="0", LOCAL_RANK="0", GROUP_RANK="0", WORLD_SIZE=processes, LOCAL_WORLD_SIZE=processes)
        env |= dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="docs")
        words = words[words.index("-m") + 1 :]
        module = words[words.index("-m") + 1]
    rest = words[words.index("-m") + 2 :]
    if module == PACKAGE:
        return (rest[1:], env) if rest[:1] == ["fit"] else None
    # The function each command of commands/ hands its configs and training arguments to, by its name.
    stand_ins = {
        "cross_validate": lambda configs, args, *_: [*as_options(configs), *args],  # k-fold cross-validation
        "build": lambda what, configs, args, *_: [*as_options(configs), *args],  # the Tuner's searches
        "prepare": lambda args, *_: args,  # the data set written once to disk
        "run_in_fresh_process": lambda configs, *rest: [*as_options(configs), *rest[2]],  # the benchmark
    }
    if not module.startswith(f"{PACKAGE}.commands."):
        return None
    command = importlib.import_module(module)
    name = next((name for name in stand_ins if callable(getattr(command, name, None))), None)
    if name is None:
        return None
    arguments = stand_ins[name]

    def stand_in(*args, **kwargs):
        raise BuiltError(arguments(*args, **kwargs))

    with mock.patch.object(command, name, stand_in):
        try:
            (getattr(command, "main_bench", None) or command.main)(rest)
        except BuiltError as built:
            return built.args, env
    return None


def as_options(configs: list) -> list[str]:
    return [f"--config={path}" for path in configs]
