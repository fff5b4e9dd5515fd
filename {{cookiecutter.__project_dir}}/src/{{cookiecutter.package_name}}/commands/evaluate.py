"""``make eval``: score the served model with EleutherAI's lm-evaluation-harness.

    python -m {{ cookiecutter.package_name }}.commands.evaluate                      # the best checkpoint, the tasks in evals/
    python -m {{ cookiecutter.package_name }}.commands.evaluate --url http://host:8000  # a server already running
    python -m {{ cookiecutter.package_name }}.commands.evaluate --tasks '[hellaswag]'    # the harness's own tasks (they download)

Starts ``make serve``'s OpenAI API over the checkpoint on a free loopback port (unless ``--url``
names one), runs ``lm-eval run --model local-completions`` against its ``/v1/completions`` (the
harness tokenizes with the served model's own tokenizer through ``/tokenize``, and reads the model's
context, so a context and continuation longer than it are cut from the left as the harness does),
then stops the server. The harness writes ``results_*.json`` (and, with ``--log_samples``, each
answer) under ``--output``, the server its log to ``--output``/serve.log; the harness's exit status
is this command's.

The harness is a client of the server, not a dependency of the project: ``--lm_eval`` is how to run it,
by default ``lm-eval`` where it is installed, else ``uv tool run`` of :data:`LM_EVAL` (an isolated
environment of its own; its first run downloads about 600 MB). The tasks of ``evals/`` are YAML
files over local JSON lines, so nothing else is downloaded: a loglikelihood task (multiple choice)
and a generation task over passages of the bundled corpus's test split.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from jsonargparse import auto_cli

from {{ cookiecutter.package_name }}.commands.serve import local_server
from {{ cookiecutter.package_name }}.engine import (
    ConfigError,
    LaunchError,
    best_checkpoint,
    exit_on_user_error,
    read_text,
    silence_dependency_noise,
)

LM_EVAL = "lm-eval[api]==0.4.13"  # the harness release this project's tasks were written for
START_SECONDS = 180  # the most a server may take to load and answer /health


def evaluate(
    ckpt: Path | None = None,
    url: str | None = None,
    tasks: list[str] | None = None,
    include: Path = Path("evals"),
    output: Path = Path("logs/eval"),
    limit: int | None = None,
    num_concurrent: int = 8,
    log_samples: bool = False,
    lm_eval: str | None = None,
    trust: str | None = None,
) -> int:
    """Run lm-evaluation-harness on ``tasks`` against the served model; return the harness's exit status.

    Args:
        ckpt: the checkpoint to serve; default the best of the latest run under logs/.
        url: a server already running (``make serve``), e.g. http://127.0.0.1:8000; none is started then.
        tasks: task names; default every task of ``include``.
        include: a folder of task YAML files (``--include_path``).
        output: where the harness writes its results.
        limit: score only the first ``limit`` examples of each task (a quick look, not a score to report).
        num_concurrent: requests in flight at once: the server decodes them together.
        log_samples: also write each example's prompt, answer and score.
        lm_eval: the command that runs the harness (default ``lm-eval`` if installed, else ``uv tool run``).
        trust: modules besides this package whose classes the checkpoint may name (as ``make serve``).

    Raises:
        engine.errors.ConfigError: no task found, or neither ``lm-eval`` nor uv to run it.
        engine.errors.LaunchError: the server did not start.
    """
    names = tasks or task_names(include)
    harness = shlex.split(lm_eval) if lm_eval else harness_command()
    run = {"names": names, "include": include, "output": output, "limit": limit, "num_concurrent": num_concurrent}
    run |= {"log_samples": log_samples, "offline": tasks is None}  # the harness's own tasks download their data
    before = set(output.rglob("results_*.json"))
    if url is not None:
        print(f"make eval: scoring the model served at {url}", flush=True)
        return said_where(run_harness(harness, url.rstrip("/"), **run), output, before, log=None)
    checkpoint = Path(ckpt) if ckpt is not None else best_checkpoint("logs")
    print(f"make eval: scoring {checkpoint}", flush=True)
    options = ["--api=openai", "--timeout=300", *([f"--trust={trust}"] if trust else [])]
    output.mkdir(parents=True, exist_ok=True)
    # A line per request: in its own file, not between the harness's lines.
    log = output / "serve.log"
    with local_server(checkpoint, options, log=log, start_seconds=START_SECONDS) as (base, _):
        status = run_harness(harness, base, **run)
    return said_where(status, output, before, log)


def said_where(status: int, output: Path, before: set[Path], log: Path | None) -> int:
    """``status``, once the results files the harness wrote under ``output`` (those not in ``before``) are
    named, and, if it failed, the server's ``log``."""
    for results in sorted(set(output.rglob("results_*.json")) - before):
        print(f"make eval: results in {results}", flush=True)
    if status:
        where = f"; the server's log: {log}" if log else ""
        print(f"make eval: lm-evaluation-harness exited with status {status}{where}", flush=True)
    return status


def run_harness(
    harness: list[str],
    base: str,
    names: list[str],
    include: Path,
    output: Path,
    limit: int | None,
    num_concurrent: int,
    log_samples: bool,
    offline: bool,
) -> int:
    """``lm-eval run --model local-completions`` against the server at ``base``; its exit status. ``offline``:
    the tasks read local files, so the harness never asks the Hugging Face hub for anything."""
    info = get_json(f"{base}/tokenizer_info")
    (card,) = get_json(f"{base}/v1/models")["data"]
    model_args = {
        "base_url": f"{base}/v1/completions",
        "model": card["id"],
        "tokenizer_backend": "remote",  # the served model's tokenizer, through /tokenize
        "max_length": info["model_max_length"],
        "num_concurrent": num_concurrent,
    }
    command = [*harness, "run", "--model", "local-completions"]
    command += ["--model_args", ",".join(f"{key}={value}" for key, value in model_args.items())]
    command += ["--tasks", *names, "--include_path", str(include), "--output_path", str(output)]
    command += ["--limit", str(limit)] if limit is not None else []
    command += ["--log_samples"] if log_samples else []
    print("make eval:", shlex.join(command), flush=True)
    environment = {**os.environ, **({"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"} if offline else {})}
    return subprocess.run(command, env=environment, check=False).returncode


def task_names(include: Path) -> list[str]:
    """The ``task`` of each YAML file in ``include``.

    Raises:
        engine.errors.ConfigError: the folder is missing or holds no task.
    """
    files = sorted(include.glob("*.yaml")) if include.is_dir() else []
    # A task file is code (lm-eval runs what it names), read as the user's own; never a FIFO or a device that
    # blocks the read, nor a file no task file is near the size of.
    names = [yaml.safe_load(read_text(path, 1 << 20, f"--include {include}"))["task"] for path in files]
    if not names:
        raise ConfigError(f"--include {include}: no task YAML there; give --tasks or a folder of tasks")
    return names


def harness_command() -> list[str]:
    """``lm-eval`` where it is installed (this environment, the PATH), else ``uv tool run`` of :data:`LM_EVAL`.

    Raises:
        engine.errors.ConfigError: neither is there.
    """
    here = Path(sys.executable).parent / "lm-eval"
    installed = str(here) if here.exists() else shutil.which("lm-eval")
    if installed:
        return [installed]
    uv = shutil.which("uv")
    if uv:
        return [uv, "tool", "run", "--from", LM_EVAL, "lm-eval"]
    raise ConfigError(
        f"lm-evaluation-harness is not installed and uv is not on the PATH: pip install '{LM_EVAL}' "
        "(or install uv: https://docs.astral.sh/uv), or give --lm_eval"
    )


def get_json(url: str) -> dict:
    """The JSON ``url`` answers.

    Raises:
        engine.errors.LaunchError: nothing answers there, or not with JSON (names the URL and the fix).
    """
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return json.load(answer)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise LaunchError(
            f"--url: no OpenAI API of this project answers {url} ({reason}): start `make serve` there, or leave "
            "--url out to serve the checkpoint for the evaluation"
        ) from None


def main(args: list[str] | None = None) -> None:
    silence_dependency_noise()
    with exit_on_user_error("eval"):  # a missing checkpoint, task or harness: one line, exit 2
        status = auto_cli(evaluate, args=args)
    sys.exit(status)


if __name__ == "__main__":
    main()
