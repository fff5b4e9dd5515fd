"""Shared helpers: bake with pytest-cookies, the exact expected file set, and running a bake.

Most bakes install into this one environment with `pip install --no-deps`, so no test
re-resolves dependencies; `requirements_met` then proves the environment satisfies the bake's
own pyproject.toml. Bakes whose answers change the dependencies (another logger) install as
their users do instead, into their own environment (`install_own_environment`).
"""

import contextlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_SYNTAX = re.compile(r"\{\{|\}\}|\{%|%\}")
PRESETS = ("cuda-graphs", "ddp", "debug", "ema", "fsdp", "fsdp2", "gpu", "profile", "trace")
# Bakes resolve no uv.lock (6 s of package-index queries each), session and module fixtures'
# bakes included; test_bake.py's lock tests turn it on.
os.environ["TORCH_TEMPLATE_LOCK"] = "0"
# The user's uv cache, read before each test gets a home of its own: installs into a bake's own
# environment take their packages from it (about 40 s a bake) instead of downloading 1.6 GB again.
UV_CACHE_DIR = os.environ.get("UV_CACHE_DIR") or str(Path.home() / ".cache" / "uv")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The whole-bake tests (marked slow: an install and a bake's own suite, minutes each) first.

    `make test` hands each file to a process in collection order (``--dist loadfile
    --no-loadscope-reorder``), so the longest start first and the short files fill the end (xdist's own
    order, most tests first, put the four one-test bake files after the hooks, matrix and SLURM files)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _hermetic_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No user config leaks in: cookiecutter's replay and user config, git identity, wandb login.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "NETRC", "COOKIECUTTER_CONFIG"):
        monkeypatch.delenv(name, raising=False)


# Every optional capability off: each task's minimal bake (.ci/slow runs the full ones, every answer yes).
MINIMAL = {f"use_{name}": "no" for name in ("sweeps", "benchmark", "serving", "prepared", "pretrained")}
MINIMAL["include_slurm"] = "no"


def bake(cookies, **answers: str) -> Path:
    """Bake with ``answers`` (the rest default) and return the project folder; fail on any error."""
    result = cookies.bake(extra_context=answers)
    assert result.exit_code == 0, f"bake failed: {result.exception!r}"
    assert result.exception is None
    return Path(result.project_path)


def files_of(project: Path) -> set[str]:
    """Every file of a bake, as POSIX paths relative to it, .git excluded."""
    return {p.relative_to(project).as_posix() for p in project.rglob("*") if p.is_file() and ".git" not in p.parts}


PROJECT_FILES = [".gitignore", "AGENTS.md", "CLAUDE.md", "LICENSE", "Makefile", "README.md", "pyproject.toml"]
PROJECT_FILES += [".github/workflows/ci.yml", ".pre-commit-config.yaml"]
PROJECT_FILES += ["scripts/agent_guides.py", "scripts/serve_load.py", "scripts/update_template.py"]
PROJECT_FILES += ["scripts/check_lock.py"]
# The README's reference material, one topic a file.
DOCS = ["install", "configs", "performance", "clusters", "troubleshooting", "shipping", "prepared-data", "project"]
DOCS += ["trust"]
PROJECT_FILES += [f"docs/{name}.md" for name in DOCS]
# The reusable core and the CLI: in every bake, whatever the task.
PACKAGE_FILES = ["__init__.py", "__main__.py", "cli.py", "commands/__init__.py"]
PACKAGE_FILES += [f"commands/{name}.py" for name in ("bench", "export", "predict", "serve", "sweep", "find", "prepare")]
PACKAGE_FILES += ["data/__init__.py", "models/__init__.py", "nets/__init__.py"]
PACKAGE_FILES += [f"engine/{name}.py" for name in ("__init__", "checkpoints", "preflight", "contract", "launch")]
PACKAGE_FILES += ["engine/datamodule.py"]
PACKAGE_FILES += ["engine/environment.py"]
PACKAGE_FILES += ["engine/module.py"]
PACKAGE_FILES += [f"engine/{name}.py" for name in ("errors", "export", "inference", "optim", "precision", "quiet")]
PACKAGE_FILES += ["engine/gradients.py", "engine/metrics.py", "engine/predict.py"]
PACKAGE_FILES += ["engine/run_records.py", "engine/sharding.py"]
PACKAGE_FILES += ["engine/files.py", "engine/serving_contract.py"]
PACKAGE_FILES += ["engine/run_folders.py", "serving/__init__.py", "serving/api.py", "serving/connections.py"]
PACKAGE_FILES += ["engine/prepared.py", "engine/trust.py", "engine/import_guard.py", "engine/training_cli.py"]
PACKAGE_FILES += [
    f"engine/callbacks/{name}.py"
    for name in ("__init__", "ema", "finetuning", "finite", "plots", "predictions", "preemption", "progress")
]
PACKAGE_FILES += ["engine/callbacks/random_state.py", "engine/callbacks/summary.py"]
PACKAGE_FILES += [f"engine/tests/{name}.py" for name in ("__init__", "test_lid", "test_training")]
TEST_FILES = ["conftest.py", "test_cli.py", "test_errors.py", "test_launch.py", "test_preemption.py", "test_resume.py"]
TEST_FILES += ["test_private_apis.py", "test_find.py"]
TEST_FILES += ["own_pieces.py", "test_environment.py", "test_ship.py", "test_sweep.py", "test_prepared.py"]
TEST_FILES += ["test_trust.py", "test_precision.py", "test_init_from.py"]
TEST_FILES += ["test_run_folders.py", "test_documented_commands.py", "test_fsdp.py", "test_step_ops.py"]
# Each task family's own files, stated here independently of the post-gen hook's list.
TASK_PACKAGE_FILES = {
    "image-classification": [
        *("data/digits.py", "data/image_folder.py", "models/classifier.py", "nets/cnn.py", "nets/mlp.py"),
        *("nets/pretrained.py", "nets/hf.py", "nets/hf_image.py", "nets/timm_net.py"),
        *("nets/hub.py", "nets/image_preprocessing.py", "data/image_files.py", "data/image_transforms.py"),
        *("commands/cv.py", "engine/table_files.py", "engine/image_tables.py", "data/hub_datasets.py"),
        "engine/images.py",
    ],
    "tabular": ["data/tabular.py", "engine/tables.py", "models/tabular.py", "nets/tabular_mlp.py", "commands/cv.py"],
    "language-model": [
        *("data/text.py", "data/corpora/moby_dick.txt.gz", "models/language_model.py", "nets/gpt.py"),
        *("engine/text_files.py", "engine/text_chunks.py", "engine/table_files.py", "data/hub_datasets.py"),
        *("data/prompts.py", "data/tokenizer.py", "nets/causal_lm.py", "commands/generate.py"),
        *("serving/openai_api.py", "serving/batching.py", "serving/completions.py", "commands/evaluate.py"),
        *("nets/hf.py", "nets/hub.py"),
    ],
}
# make eval's lm-evaluation-harness tasks: the served language model's.
EVAL_FILES = {f"evals/moby_dick_{name}.{kind}" for name in ("continuations", "words") for kind in ("yaml", "jsonl")}
TASK_TEST_FILES = {
    "image-classification": [
        *("test_data.py", "test_ddp.py", "test_faults.py"),
        *("test_gpu.py", "test_image_folder.py", "test_model.py", "test_nets.py", "test_train.py"),
        *("test_transfer.py", "test_hf_image.py", "test_cv.py"),
    ],
    "tabular": ["test_tabular.py", "test_cv.py"],
    "language-model": ["test_language_model.py", "test_finetune.py", "test_tokenizer.py", "test_openai_api.py"],
}
TASK_CONFIG_FILES = {
    "image-classification": [
        *("experiments/image-folder.yaml", "experiments/transfer-learning.yaml", "experiments/timm.yaml"),
        "experiments/lora.yaml",
    ],
    "tabular": ["experiments/tabular-csv.yaml", "experiments/tabular-regression.yaml"],
    "language-model": [
        "experiments/text-folder.yaml",
        "experiments/bpe.yaml",
        "experiments/finetune.yaml",
        "experiments/finetune-sft.yaml",
        "experiments/chat.yaml",
    ],
}


def expected_files(
    slug: str,
    package: str,
    include_slurm: bool,
    task: str = "image-classification",
    use_sweeps: bool = True,
    use_benchmark: bool = True,
    use_serving: bool = True,
    use_prepared: bool = True,
    use_pretrained: bool = True,
) -> set[str]:
    """The exact file set of a bake: nothing missing, nothing extra."""
    files = {
        *PROJECT_FILES,
        f".claude/agents/{slug}.md",
        "configs/default.yaml",
        "configs/trainer.yaml",
        "configs/sweep.yaml",
    }
    files |= {f"configs/presets/{name}.yaml" for name in PRESETS}
    files |= {f"configs/{name}" for name in TASK_CONFIG_FILES[task]}
    files |= {f"src/{package}/{name}" for name in [*PACKAGE_FILES, *TASK_PACKAGE_FILES[task]]}
    files |= {f"tests/{name}" for name in [*TEST_FILES, *TASK_TEST_FILES[task]]}
    if include_slurm:
        files |= {"scripts/slurm/sweep.sbatch", "scripts/slurm/train.sbatch", "scripts/slurm/locked_env.sh"}
        files |= {"tests/test_slurm_script.py"}
    if task == "language-model":
        files |= {"docs/language-model.md", *EVAL_FILES}
    if not use_sweeps:  # the sweep command, its config, its tests and its SLURM array; the finders and their tests
        files -= {"configs/sweep.yaml", f"src/{package}/commands/sweep.py", "tests/test_sweep.py"}
        files -= {f"src/{package}/commands/find.py", "tests/test_find.py"}
        files -= {f"src/{package}/commands/cv.py", "tests/test_cv.py"}
        files -= {"scripts/slurm/sweep.sbatch"}
    if not use_benchmark:  # make bench's command and the step's op-count guard
        files -= {f"src/{package}/commands/bench.py", "tests/test_step_ops.py"}
    if not use_serving:  # make export and make serve: their commands, the HTTP APIs, the load test and tests
        serving = ("__init__.py", "api.py", "connections.py", "openai_api.py", "batching.py", "completions.py")
        files -= {f"src/{package}/serving/{name}" for name in serving}
        files -= {f"src/{package}/{name}" for name in ("commands/serve.py", "commands/export.py", "engine/export.py")}
        files -= {f"src/{package}/engine/serving_contract.py"}
        files -= {f"src/{package}/commands/evaluate.py", *EVAL_FILES}
        files -= {f"src/{package}/data/image_files.py"}
        files -= {"scripts/serve_load.py", "tests/test_ship.py", "tests/test_openai_api.py"}
    if not use_prepared:  # make prepare: the command, the shard format, its tests and guide
        files -= {f"src/{package}/engine/prepared.py", f"src/{package}/commands/prepare.py"}
        files -= {f"src/{package}/engine/text_chunks.py"}
        files -= {"tests/test_prepared.py", "docs/prepared-data.md"}
    if not use_pretrained:  # pretrained backbones: their nets, offline hub reads, BackboneFreeze, configs, tests
        files -= {f"src/{package}/nets/{name}.py" for name in ("hf", "hub", "hf_image", "timm_net", "pretrained")}
        files -= {f"src/{package}/nets/{name}.py" for name in ("image_preprocessing", "causal_lm")}
        files -= {f"src/{package}/engine/callbacks/finetuning.py"}
        files -= {f"tests/{name}.py" for name in ("test_hf_image", "test_transfer", "test_finetune")}
        files -= {f"configs/experiments/{name}.yaml" for name in ("transfer-learning", "lora", "timm")}
        files -= {f"configs/experiments/{name}.yaml" for name in ("finetune", "finetune-sft")}
    return files


def leftover_template_syntax(project: Path, allowed: tuple[str, ...] = ()) -> list[str]:
    """Lines of the bake (outside .git) that still hold ``{{``, ``}}``, ``{%`` or ``%}``.

    ``allowed`` are texts the answers themselves put there, which must stay literal.
    """
    found = []
    for path in sorted(project.rglob("*")):
        if not path.is_file() or ".git" in path.parts or path.suffix == ".gz":  # .gz: the bundled corpus, binary
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for literal in allowed:
                line = line.replace(literal, "")
            if TEMPLATE_SYNTAX.search(line):
                found.append(f"{path.relative_to(project)}:{number}: {line.strip()}")
    return found


def requirements_met(distribution: str) -> list[str]:
    """Requirements of an installed distribution (no extras) that this environment does not satisfy."""
    unmet = []
    for text in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            unmet.append(f"{text} (not installed)")
            continue
        if not requirement.specifier.contains(version, prereleases=True):
            unmet.append(f"{text} (have {version})")
    return unmet


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


@contextlib.contextmanager
def installed(project: Path, slug: str) -> Iterator[None]:
    """Install a bake editable into this environment without resolving dependencies; remove it after."""
    pip("install", "--no-deps", "--no-build-isolation", "-e", str(project))
    try:
        yield
    finally:
        pip("uninstall", "-y", slug)


def run(command: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run a command in a bake as a user would, with this environment's Python first on PATH."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for name in [name for name in env if name == "PYTEST_ADDOPTS" or name.startswith("PYTEST_XDIST_")]:
        del env[name]  # this suite's own pytest settings, not the user's shell's
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def local_torch_wheel() -> Path | None:
    """The wheel of this environment's torch when pip finds it on local disk (its find-links), else None."""
    import torch

    links = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for folder in re.findall(r"find-links='([^']+)'", links):
        for wheel in Path(folder).glob(f"torch-{torch.__version__}-*.whl"):
            return wheel
    return None


def install_own_environment(project: Path) -> Path:
    """``make install`` in a locked bake, as its user runs it: uv installs exactly its uv.lock into
    ``.venv`` (torch: this environment's build); return that environment's Python.

    A bake tested there can only use what its own ``pyproject.toml`` installs: a test of a csv-logger
    bake that needs wandb fails here, where this template's environment (which has every logger)
    would hide it.
    """
    import torch

    uv = shutil.which("uv", path=str(Path(sys.executable).parent))
    assert uv is not None, "uv (a dev dependency of the template) is not beside this Python"
    assert (project / "uv.lock").is_file(), "bake with TORCH_TEMPLATE_LOCK=1: the hook locks the bake"
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAKE")}  # a user's shell
    env |= {"PATH": f"{Path(uv).parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "UV_CACHE_DIR": UV_CACHE_DIR}
    torch_spec = local_torch_wheel() or f"torch=={torch.__version__}"
    done = subprocess.run(
        ["make", "install", f"TORCH={torch_spec}"], cwd=project, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return project / ".venv" / "bin" / "python"


def make(project: Path, *targets: str, args: str = "", stderr: bool = False, python: Path | None = None) -> str:
    """Run make targets in the bake with ``python`` (default: this environment's); return their standard
    output (and error, with ``stderr``)."""
    # --no-print-directory: under a parent make (CI runs `make test`) make would add its own lines.
    command = ["make", "--no-print-directory", *targets, f"PYTHON={python or sys.executable}"]
    command += [f"ARGS={args}"] if args else []
    done = run(command, cwd=project, timeout=900)
    assert done.returncode == 0, f"make {' '.join(targets)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout + (done.stderr if stderr else "")


def installed_linted_and_tested(
    cookies, monkeypatch: pytest.MonkeyPatch, answers: dict, absent: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """Bake ``answers`` (locked), install it as its user does, exactly its uv.lock into its own environment,
    where none of ``absent`` imports, then run its own ``make lint`` and ``make test`` (the quick tests, as
    for the default bake; slow ones: .ci/slow and .ci/floors); return the project and its Python."""
    monkeypatch.setenv("TORCH_TEMPLATE_LOCK", "1")
    project = bake(cookies, **answers)
    python = install_own_environment(project)
    for name in absent:
        assert subprocess.run([python, "-c", f"import {name}"], capture_output=True).returncode != 0, name
    make(project, "lint", python=python)
    # A make target glued to the previous recipe once ran nothing here and exited 0: tests must have run.
    assert re.search(r"\b\d+ passed\b", make(project, "test", python=python))
    return project, python
