"""Run what a bake ships, as its README tells a user to: make test, make lint, make train."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import bake, install_own_environment, installed, requirements_met, run

SECOND = {
    "task": "tabular",
    "project_name": "Second Bake",
    "logger": "tensorboard",
    "precision": "16-mixed",
    "compile": "yes",
    "include_slurm": "no",
    "license": "Apache-2.0",
}


def make(project: Path, *targets: str, args: str = "", stderr: bool = False, python: Path | None = None) -> str:
    """Run make targets in the bake with ``python`` (default: this environment's); return their standard
    output (and error, with ``stderr``)."""
    # --no-print-directory: under a parent make (CI runs `make test`) make would add its own lines.
    command = ["make", "--no-print-directory", *targets, f"PYTHON={python or sys.executable}"]
    command += [f"ARGS={args}"] if args else []
    done = run(command, cwd=project, timeout=900)
    assert done.returncode == 0, f"make {' '.join(targets)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout + (done.stderr if stderr else "")


@pytest.mark.slow
def test_default_bake_passes_its_own_tests_and_trains(cookies) -> None:
    project = bake(cookies)
    with installed(project, project.name):
        assert requirements_met(project.name) == []
        # The GitHub workflow installs, then runs exactly what this test runs next.
        workflow = yaml.safe_load((project / ".github" / "workflows" / "ci.yml").read_text())
        runs = [step["run"] for step in workflow["jobs"]["test"]["steps"] if "run" in step]
        # (The lock check and the install from the lock: test_bake.py's lock test, on a locked bake.)
        assert runs[0] == "uv lock --check" and runs[1].startswith("make install TORCH=")
        assert runs[2:] == ["make lint", "make test", "make test-slow"]  # the last on a schedule and on demand
        make(project, "lint")
        # The quick tests (make test): the bake's slow ones (make test-slow: real training, DDP, signals,
        # sweeps) run in CI's .ci/slow and .ci/floors, which keeps this template suite within its budget.
        make(project, "test")
        # The pre-commit hook (make lint) passes on the bake, and fails on a badly formatted file.
        done = run(["pre-commit", "run", "--all-files"], cwd=project)
        assert done.returncode == 0, done.stdout + done.stderr
        (project / "src" / project.name.replace("-", "_") / "ugly.py").write_text("x  =  1\n")
        done = run(["pre-commit", "run", "--all-files"], cwd=project)
        assert done.returncode != 0 and "ugly.py" in done.stdout, done.stdout + done.stderr
        (project / "src" / project.name.replace("-", "_") / "ugly.py").unlink()

        # Every command of the README's quick start, "Ship a trained model" and sweeps, as written.
        run_the_readme(project)

        # `make bench` (shortened): a JSON summary, the spread of the pair ratios, then
        # overhead_ratio=<float> as its last line.
        output = make(project, "bench", args="--steps 40 --repeats 1").strip().splitlines()
        assert re.fullmatch(r"overhead_ratio=\d+\.\d{3}", output[-1]), output[-1]
        assert output[-2].startswith("pair ratios: min ")
        summary = json.loads("\n".join(output[output.index("{") : output.index("}") + 1]))
        assert summary["steps"] == 40 and summary["repeats"] == 1 and len(summary["pair_ratios"]) == 1
        assert summary["project_step_ms"] > 0 and summary["plain_step_ms"] > 0 and summary["first_step_s"] > 0
        assert summary["loader_samples_per_s"] > summary["train_samples_per_s"] > 0  # in-memory digits
        assert abs(summary["overhead_ratio"] - summary["project_step_ms"] / summary["plain_step_ms"]) < 1e-9


README_SECTIONS = ("Quick start", "Ship a trained model", "Hyperparameter search")
# Run elsewhere, not here: `make install` is what CI's `make demo` runs (here the bake is installed
# into this environment without resolving anything), and `make test` runs above.
RUN_ELSEWHERE = ("make install", "make test")


def readme_commands(readme: str, section: str) -> list[str]:
    """The shell commands of the ```bash blocks under ``## section``, comments dropped."""
    body = readme.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL)
    lines = [line.split("  #", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_the_readme(project: Path) -> None:
    """Run the README's commands in order in the default bake and check what each leaves behind.

    Two changes a user could make too keep the sweep short: configs/sweep.yaml asks for 2 trials
    of 2 epochs, and the README's "--n_trials=40" becomes 3. `make serve` runs in the background
    on a free port (PORT=, as the README says) until the commands after it (the curl) are done.
    """
    readme = (project / "README.md").read_text()
    commands = [command for section in README_SECTIONS for command in readme_commands(readme, section)]
    assert len(commands) >= 10 and sum(c.startswith("curl ") for c in commands) == 1, commands
    sweep = project / "configs" / "sweep.yaml"
    spec = sweep.read_text()
    assert "n_trials: 20" in spec and "max_epochs=10" in spec and "--n_trials=40" in readme
    sweep.write_text(spec.replace("n_trials: 20", "n_trials: 2").replace("max_epochs=10", "max_epochs=2"))
    logs, port = project / "logs" / project.name, free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PORT": str(port)}
    env.pop("PYTEST_ADDOPTS", None)
    server = None
    try:
        for command in commands:
            if command.startswith(RUN_ELSEWHERE):
                continue
            if command == "make serve":
                server = subprocess.Popen(["bash", "-c", command], cwd=project, env=env, start_new_session=True,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
                wait_for_health(port, server)
                continue
            if command.startswith("curl "):
                command = command.replace("localhost:8000", f"localhost:{port}")
                command = re.sub(r"-d '.*\.\.\..*'", "-d '" + json.dumps({"inputs": [[[[0] * 8] * 8]]}) + "'", command)
            command = command.replace("--n_trials=40", "--n_trials=3")
            done = subprocess.run(["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True,
                                  timeout=900)  # fmt: skip
            assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
            check_readme_command(command, done.stdout, project, logs)
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
    assert server is not None, "the README's quick start has no `make serve`"


def check_readme_command(command: str, output: str, project: Path, logs: Path) -> None:
    """What a README command must leave behind (any command must exit 0)."""
    runs = sorted(path.parent for path in logs.glob("*/config.yaml"))
    if command == "make train":  # wandb offline (no login), no terminal
        (run_dir,) = runs
        summary = json.loads((run_dir / "test_metrics.json").read_text())
        assert summary["metrics"]["test/acc"] >= 0.98  # measured 0.9963 (`make demo`)
        assert {"last.ckpt", Path(summary["checkpoint"]).name} <= {p.name for p in (run_dir / "checkpoints").iterdir()}
        assert list((project / "logs" / "wandb").glob("offline-run-*")), "wandb did not log offline"
    elif command == "make resume":
        assert len(runs) == 1  # the same run folder
    elif command == "make predict":
        (predictions,) = logs.glob("*/predictions.csv")
        assert len(predictions.read_text().splitlines()) == 271  # header + 270 test digits
    elif command == "make export":
        (export,) = logs.glob("*/export")
        assert {"model.onnx", "model.pt2", "export.json", "model-card.md"} <= {p.name for p in export.iterdir()}
    elif command.startswith("curl "):
        answer = json.loads(output)
        assert len(answer["labels"]) == 1 and abs(sum(answer["probabilities"][0]) - 1) < 1e-4, answer
    elif command.startswith("make sweep"):
        trials = 3 if "--n_trials" in command else 2
        assert len([run for run in runs if run.name.startswith("digits-trial")]) == trials
        assert (project / "logs" / "sweeps" / "digits" / "best.yaml").is_file()
    elif command.startswith("make train CONFIG="):  # a new run, not the trial's folder again
        assert len(list(logs.glob("best-*/checkpoints/last.ckpt"))) == 1, runs
        assert not list(logs.glob("digits-trial*/config-resumed-*.yaml"))


def wait_for_health(port: int, server: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, "make serve exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"make serve did not answer /health on port {port} within {timeout} s")


@pytest.mark.slow
def test_second_bake_tabular_passes_its_own_tests_and_trains_in_its_own_environment(cookies, monkeypatch) -> None:
    # Other answers than the default's (another logger, precision, compile, no SLURM) change what the
    # bake installs: it installs as its user does, exactly its uv.lock, and is tested there alone.
    monkeypatch.setenv("TORCH_TEMPLATE_LOCK", "1")
    project = bake(cookies, **SECOND)
    python = install_own_environment(project)
    make(project, "lint", python=python)
    # The quick tests here, as for the default bake (slow ones: .ci/slow and .ci/floors).
    make(project, "test", python=python)
    # The bundled breast cancer table, the default 40 epochs (about 15 s on 2 cores).
    make(project, "train", python=python)
    (summary_path,) = (project / "logs").rglob("test_metrics.json")
    assert json.loads(summary_path.read_text())["metrics"]["test/acc"] >= 0.9  # measured 0.953
    assert list((project / "logs").rglob("events.out.tfevents.*"))  # the answer's logger wrote the run
    # The profiler's report lands in the run folder, beside that run's config, and make says where.
    output = make(project, "profile", args="--trainer.max_epochs=1", stderr=True, python=python)
    (report,) = (project / "logs").rglob("fit-profile.txt")
    assert report.parent.parent.name == "tabular"  # logs/tabular/<config>-<date>-<time>-<xxxx>/fit-profile.txt
    assert (report.parent / "config.yaml").exists() and "Profiler Report" in report.read_text()
    assert f"Profiler report written to {report.relative_to(project)}" in output


THIRD = {
    "task": "language-model",
    "project_name": "Third Bake",
    "logger": "csv",
    "precision": "32-true",
    "compile": "no",
    "include_slurm": "yes",
    "license": "MIT",
}


@pytest.mark.slow
def test_third_bake_language_model_passes_its_own_tests_trains_and_generates(cookies, monkeypatch) -> None:
    # As the second bake: in its own environment, which has no wandb and no tensorboard.
    monkeypatch.setenv("TORCH_TEMPLATE_LOCK", "1")
    project = bake(cookies, **THIRD)
    python = install_own_environment(project)
    assert subprocess.run([python, "-c", "import wandb"], capture_output=True).returncode != 0
    make(project, "lint", python=python)
    # The quick tests here, as for the default bake (slow ones: .ci/slow and .ci/floors).
    make(project, "test", python=python)
    # `make train` on the bundled corpus with a one-block GPT for 150 steps (29 s): it learns
    # common letter sequences, below the corpus's unigram entropy of 4.53 bits per byte (3.76
    # measured). The default model's full run reaches 2.26 (docs/benchmarks.md).
    tiny = "--model.init_args.net.init_args.n_layer=1 --model.init_args.net.init_args.n_embd=64"
    make(project, "train", args=f"--trainer.max_epochs=1 --trainer.limit_train_batches=150 {tiny}", python=python)
    (summary_path,) = (project / "logs").rglob("test_metrics.json")
    metrics = json.loads(summary_path.read_text())["metrics"]
    assert metrics["test/bpb"] < 4.2
    assert (summary_path.parent / "metrics.csv").is_file()  # the answer's logger wrote the run
    text = make(project, "generate", args="--max_new_tokens 80 --prompt Ishmael", python=python)
    sample = text.split("\nIshmael", 1)  # after the command line make echoes
    assert len(sample) == 2 and len(sample[1]) > 60, text
