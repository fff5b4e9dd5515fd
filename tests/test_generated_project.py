"""Run what a bake ships, as its README tells a user to: make test, make lint, make train."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import bake, installed, requirements_met, run

SECOND = {
    "task": "tabular",
    "project_name": "Second Bake",
    "logger": "tensorboard",
    "precision": "16-mixed",
    "compile": "yes",
    "include_slurm": "no",
    "license": "Apache-2.0",
}


def make(project: Path, *targets: str, args: str = "", stderr: bool = False) -> str:
    """Run make targets in the bake; return their standard output (and error, with ``stderr``)."""
    # --no-print-directory: under a parent make (CI runs `make test`) make would add its own lines.
    command = ["make", "--no-print-directory", *targets, f"PYTHON={sys.executable}"]
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
        assert runs[0].startswith("make install TORCH=") and runs[1:] == ["make lint", "make test"]
        make(project, "lint")
        # The quick tests: the bake's slow ones (real training, DDP, signals, sweeps) run in CI's
        # .ci/slow and .ci/floors, which keeps this template suite within its time budget.
        make(project, "test", args="-m 'not slow'")
        # The pre-commit hook (make lint) passes on the bake, and fails on a badly formatted file.
        done = run(["pre-commit", "run", "--all-files"], cwd=project)
        assert done.returncode == 0, done.stdout + done.stderr
        (project / "src" / project.name.replace("-", "_") / "ugly.py").write_text("x  =  1\n")
        done = run(["pre-commit", "run", "--all-files"], cwd=project)
        assert done.returncode != 0 and "ugly.py" in done.stdout, done.stdout + done.stderr
        (project / "src" / project.name.replace("-", "_") / "ugly.py").unlink()

        # `make train` as written in the README: wandb offline (no login), no terminal.
        make(project, "train", args="--trainer.max_epochs=3")
        (summary_path,) = (project / "logs").rglob("test_metrics.json")
        summary = json.loads(summary_path.read_text())
        assert summary["metrics"]["test/acc"] > 0.8  # 3 epochs; the full run is measured by `make demo`
        run_dir = summary_path.parent
        assert {p.name for p in (run_dir / "checkpoints").iterdir()} >= {"last.ckpt", Path(summary["checkpoint"]).name}
        assert (run_dir / "config.yaml").exists()
        assert list((project / "logs" / "wandb").glob("offline-run-*")), "wandb did not log offline"

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


@pytest.mark.slow
def test_second_bake_tabular_passes_its_own_tests_and_trains(cookies) -> None:
    project = bake(cookies, **SECOND)
    with installed(project, project.name):
        assert requirements_met(project.name) == []
        make(project, "lint")
        # The quick tests here, as for the default bake (slow ones: .ci/slow and .ci/floors).
        make(project, "test", args="-m 'not slow'")
        # The bundled breast cancer table, the default 40 epochs (about 15 s on 2 cores).
        make(project, "train")
        (summary_path,) = (project / "logs").rglob("test_metrics.json")
        assert json.loads(summary_path.read_text())["metrics"]["test/acc"] >= 0.9  # measured 0.953
        # The profiler's report lands in the run folder, beside that run's config, and make says where.
        output = make(project, "profile", args="--trainer.max_epochs=1", stderr=True)
        (report,) = (project / "logs").rglob("fit-profile.txt")
        assert report.parent.parent.name == "tabular"  # logs/tabular/<config>-<date>-<time>-<xxxx>/fit-profile.txt
        assert (report.parent / "config.yaml").exists() and "Profiler Report" in report.read_text()
        assert f"Profiler report written to {report.relative_to(project)}" in output


THIRD = {
    "task": "language-model",
    "project_name": "Third Bake",
    "logger": "csv",
    "precision": "bf16-mixed",
    "compile": "no",
    "include_slurm": "yes",
    "license": "MIT",
}


@pytest.mark.slow
def test_third_bake_language_model_passes_its_own_tests_trains_and_generates(cookies) -> None:
    project = bake(cookies, **THIRD)
    with installed(project, project.name):
        assert requirements_met(project.name) == []
        make(project, "lint")
        # The quick tests here, as for the default bake (slow ones: .ci/slow and .ci/floors).
        make(project, "test", args="-m 'not slow'")
        # `make train` on the bundled corpus with a one-block GPT for 150 steps (29 s): it learns
        # common letter sequences, below the corpus's unigram entropy of 4.53 bits per byte (3.76
        # measured). The default model's full run reaches 2.26 (docs/benchmarks.md).
        tiny = "--model.init_args.net.init_args.n_layer=1 --model.init_args.net.init_args.n_embd=64"
        make(project, "train", args=f"--trainer.max_epochs=1 --trainer.limit_train_batches=150 {tiny}")
        (summary_path,) = (project / "logs").rglob("test_metrics.json")
        metrics = json.loads(summary_path.read_text())["metrics"]
        assert metrics["test/bpb"] < 4.2
        text = make(project, "generate", args="--max_new_tokens 80 --prompt Ishmael")
        sample = text.split("\nIshmael", 1)  # after the command line make echoes
        assert len(sample) == 2 and len(sample[1]) > 60, text
