"""Finish the bake: prune what the answers did not choose, fill the agent guides, lock, first commit.

Never prompts (safe with no terminal): git runs with no standard input and no credential prompt.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")
PROJECT = Path.cwd()
PACKAGE = ANSWERS["package_name"]
UV_INSTALL = "https://docs.astral.sh/uv/getting-started/installation/"
# The agent guides: this hook fills their tech-stack placeholders (double-braced names).
AGENT_GUIDES = ["AGENTS.md", ".claude/agents/{{ cookiecutter.project_slug }}.md"]


# make eval's tasks (lm-evaluation-harness YAML over local JSON lines): the served language model's.
EVAL_FILES = [f"evals/moby_dick_{name}.{kind}" for name in ("continuations", "words") for kind in ("yaml", "jsonl")]


# The files that belong to one task family only (paths relative to the project, the package as
# "{package}"); a bake keeps its own task's and deletes the others'. A new task family adds its
# files to the template and one entry here.
TASK_FILES = {
    "image-classification": [
        "src/{package}/data/digits.py",
        "src/{package}/data/image_folder.py",
        "src/{package}/data/image_transforms.py",
        "src/{package}/models/classifier.py",
        "src/{package}/nets/cnn.py",
        "src/{package}/nets/mlp.py",
        "src/{package}/nets/pretrained.py",
        "src/{package}/nets/hf_image.py",
        "src/{package}/nets/timm_net.py",
        "src/{package}/nets/image_preprocessing.py",
        "src/{package}/data/image_files.py",
        "src/{package}/engine/image_tables.py",
        "src/{package}/engine/images.py",
        "tests/test_data.py",
        "tests/test_ddp.py",
        "tests/test_faults.py",
        "tests/test_gpu.py",
        "tests/test_image_folder.py",
        "tests/test_model.py",
        "tests/test_nets.py",
        "tests/test_train.py",
        "tests/test_transfer.py",
        "tests/test_hf_image.py",
        "configs/experiments/image-folder.yaml",
        "configs/experiments/transfer-learning.yaml",
        "configs/experiments/lora.yaml",
        "configs/experiments/timm.yaml",
    ],
    "tabular": [
        "src/{package}/data/tabular.py",
        "src/{package}/engine/tables.py",
        "src/{package}/models/tabular.py",
        "src/{package}/nets/tabular_mlp.py",
        "tests/test_tabular.py",
        "configs/experiments/tabular-csv.yaml",
        "configs/experiments/tabular-regression.yaml",
    ],
    "language-model": [
        "src/{package}/data/text.py",
        "src/{package}/engine/text_files.py",
        "src/{package}/engine/text_chunks.py",  # with make prepare only, as PREPARED_FILES says
        "src/{package}/data/prompts.py",
        "src/{package}/data/tokenizer.py",
        "src/{package}/data/corpora/moby_dick.txt.gz",
        "src/{package}/nets/causal_lm.py",
        "src/{package}/models/language_model.py",
        "src/{package}/nets/gpt.py",
        "src/{package}/commands/generate.py",
        "src/{package}/serving/openai_api.py",
        "src/{package}/serving/batching.py",
        "src/{package}/serving/completions.py",
        "src/{package}/commands/evaluate.py",
        *EVAL_FILES,
        "tests/test_language_model.py",
        "tests/test_openai_api.py",
        "tests/test_finetune.py",
        "tests/test_tokenizer.py",
        "configs/experiments/text-folder.yaml",
        "configs/experiments/bpe.yaml",
        "configs/experiments/finetune.yaml",
        "configs/experiments/finetune-sft.yaml",
        "configs/experiments/chat.yaml",
        "docs/language-model.md",
    ],
}


# The files of hyperparameter search (use_sweeps): make sweep (command, config, tests, SLURM array),
# make find-lr and make find-batch-size, make cv (commands, tests).
SWEEP_FILES = [
    "src/{package}/commands/sweep.py",
    "src/{package}/commands/find.py",
    "tests/test_find.py",
    "src/{package}/commands/cv.py",
    "tests/test_cv.py",
    "configs/sweep.yaml",
    "tests/test_sweep.py",
    "scripts/slurm/sweep.sbatch",
]


# The files of the training benchmark (use_benchmark): make bench's command and the step's op-count guard.
BENCHMARK_FILES = ["src/{package}/commands/bench.py", "tests/test_step_ops.py"]


# The files of shipping a model (use_serving): make export and make serve, their load test and tests.
SERVING_FILES = [
    "src/{package}/engine/serving_contract.py",
    "src/{package}/serving/__init__.py",
    "src/{package}/serving/api.py",
    "src/{package}/serving/connections.py",
    "src/{package}/serving/openai_api.py",  # the language model's only
    "src/{package}/serving/batching.py",  # the language model's only
    "src/{package}/serving/completions.py",  # the language model's only, as the next two and EVAL_FILES
    "src/{package}/commands/evaluate.py",
    *EVAL_FILES,
    "src/{package}/commands/serve.py",
    "src/{package}/commands/export.py",
    "src/{package}/engine/export.py",
    "src/{package}/data/image_files.py",  # image requests (base64 files): the image task's only
    "scripts/serve_load.py",
    "tests/test_ship.py",
    "tests/test_openai_api.py",  # the language model's only
]


# The files of prepared data sets (use_prepared): make prepare, the shard format, their tests and guide.
PREPARED_FILES = [
    "src/{package}/engine/prepared.py",
    "src/{package}/engine/text_chunks.py",  # the language model's only
    "src/{package}/commands/prepare.py",
    "tests/test_prepared.py",
    "docs/prepared-data.md",
]


# The files of pretrained backbones and fine-tuning (use_pretrained): the nets that load them (Hugging
# Face, timm, torchvision), reading them offline, LoRA, BackboneFreeze, their configs and tests.
PRETRAINED_FILES = [
    "src/{package}/nets/hf.py",
    "src/{package}/nets/hub.py",
    "src/{package}/nets/hf_image.py",  # from here to the configs: one task's only
    "src/{package}/nets/timm_net.py",
    "src/{package}/nets/pretrained.py",
    "src/{package}/nets/image_preprocessing.py",
    "src/{package}/nets/causal_lm.py",
    "src/{package}/engine/callbacks/finetuning.py",
    "tests/test_hf_image.py",
    "tests/test_transfer.py",
    "tests/test_finetune.py",
    "configs/experiments/transfer-learning.yaml",
    "configs/experiments/lora.yaml",
    "configs/experiments/timm.yaml",
    "configs/experiments/finetune.yaml",
    "configs/experiments/finetune-sft.yaml",
]


# The files some task families share (pretrained Hugging Face models), and those families.
SHARED_TASK_FILES = {
    "src/{package}/commands/cv.py": ("image-classification", "tabular"),
    "tests/test_cv.py": ("image-classification", "tabular"),
    "src/{package}/nets/hf.py": ("image-classification", "language-model"),
    "src/{package}/nets/hub.py": ("image-classification", "language-model"),
    "src/{package}/engine/table_files.py": ("image-classification", "language-model"),
    "src/{package}/data/hub_datasets.py": ("image-classification", "language-model"),
}


def prune() -> None:
    """Delete the files of options that were not chosen, then any folder left empty."""
    for task, files in TASK_FILES.items():
        if task != ANSWERS["task"]:
            for relative in files:
                (PROJECT / relative.format(package=PACKAGE)).unlink()
    for relative, tasks in SHARED_TASK_FILES.items():
        if ANSWERS["task"] not in tasks:
            (PROJECT / relative.format(package=PACKAGE)).unlink(missing_ok=True)
    if ANSWERS["use_sweeps"] != "yes":
        for relative in SWEEP_FILES:
            (PROJECT / relative.format(package=PACKAGE)).unlink(missing_ok=True)  # sweep.sbatch: with SLURM only; cv
    if ANSWERS["use_benchmark"] != "yes":
        for relative in BENCHMARK_FILES:
            (PROJECT / relative.format(package=PACKAGE)).unlink()
    if ANSWERS["use_serving"] != "yes":
        for relative in SERVING_FILES:
            (PROJECT / relative.format(package=PACKAGE)).unlink(missing_ok=True)  # openai_api: language model only
    if ANSWERS["use_prepared"] != "yes":
        for relative in PREPARED_FILES:
            (PROJECT / relative.format(package=PACKAGE)).unlink(missing_ok=True)  # text_chunks: language model only
    if ANSWERS["use_pretrained"] != "yes":
        for relative in PRETRAINED_FILES:
            (PROJECT / relative.format(package=PACKAGE)).unlink(missing_ok=True)  # some are one task's only
    if ANSWERS["include_slurm"] != "yes":
        shutil.rmtree(PROJECT / "scripts" / "slurm")
        (PROJECT / "tests" / "test_slurm_script.py").unlink()
    for folder in sorted((p for p in PROJECT.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(folder.iterdir()):
            folder.rmdir()


def required(name: str) -> str:
    """The version range the generated pyproject.toml asks for ``name`` (e.g. '>=2.4')."""
    text = (PROJECT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(rf'"{re.escape(name)}([<>=!~][^"]*)"', text)
    return match.group(1) if match else "any version"


def placeholders() -> dict[str, str]:
    """Values of the agent guides' tech-stack placeholders, from this bake and this machine."""
    # Placeholders until scripts/agent_guides.py (run below, and again by `make install`) writes the
    # versions of a Python where torch is importable.
    pytorch_version = (
        f"{required('torch')} (the required range: torch was not importable when the project was made; "
        "`make install` writes the installed version here)"
    )
    cuda = "unknown (`make install` writes it here)"
    logger = {"wandb": "Weights & Biases (offline until `wandb login`)", "tensorboard": "TensorBoard", "csv": "CSV"}
    src = f"src/{PACKAGE}"
    experiment = ANSWERS["__experiment"]
    # engine/run_folders.py names a run <config>-<YYYYmmdd-HHMMSS>-<4 hex digits>, whatever the logger.
    name = "{{ cookiecutter.project_slug }}" if ANSWERS["logger"] == "wandb" else experiment
    run = f"logs/{name}/<config>-<date>-<time>-<xxxx>"
    return {
        "tech_stack": (
            f"Python >={ANSWERS['python_version']}, PyTorch and Lightning (versions below), "
            f"torchmetrics, LightningCLI + YAML configs (jsonargparse), {logger[ANSWERS['logger']]}, pytest, ruff"
        ),
        "pytorch_version": pytorch_version,
        "cuda_available": cuda,
        "model_dirs": f"{src}/nets/ (architectures), {src}/models/ (LightningModules)",
        "checkpoint_dirs": f"{run}/checkpoints/",
        "training_dirs": f"{src}/cli.py (LightningCLI entry point), {src}/data/ (LightningDataModules)",
        "config_dirs": "configs/ (default.yaml, trainer.yaml, presets/)",
        "train_command": "make train",
        "test_command": "make test",
        "profile_command": "make profile",
        "export_command": "make export",
    }


def fill_agent_guides() -> None:
    values = placeholders()
    for relative in AGENT_GUIDES:
        path = PROJECT / relative
        text = path.read_text(encoding="utf-8")
        text = re.sub(r"\{\{(\w+)\}\}", lambda m: values.get(m.group(1), m.group(0)), text)
        path.write_text(text, encoding="utf-8")


def write_versions() -> None:
    """Run the project's scripts/agent_guides.py: the torch, Lightning and CUDA facts of this Python.

    A child process with a time limit, so a broken torch can neither hang nor crash the bake.
    """
    script = PROJECT / "scripts" / "agent_guides.py"
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run([sys.executable, str(script)], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)


def find_uv() -> str | None:
    """uv on the PATH, else beside the Python that runs cookiecutter (`pip install uv` puts it there)."""
    beside = Path(sys.executable).with_name("uv")
    return shutil.which("uv") or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def lock() -> None:
    """Resolve uv.lock, so that the first commit holds it and `make install` installs exactly it.

    Needs uv and the package index; without either the bake still succeeds and says how to lock
    later. TORCH_TEMPLATE_LOCK=0 skips it (the template's tests, which lock in their own test).
    """
    if os.environ.get("TORCH_TEMPLATE_LOCK", "1") == "0":
        return
    uv = find_uv()
    if uv is None:
        print(
            f"torch-template: uv is not installed, so there is no uv.lock yet; install uv ({UV_INSTALL}), "
            "then run `make lock` and commit uv.lock."
        )
        return
    try:
        done = subprocess.run(
            [uv, "lock", "--quiet"], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None or done.returncode != 0:
        reason = "it took over 5 minutes" if done is None else (done.stderr.strip().splitlines() or ["no output"])[0]
        print(
            f"torch-template: `uv lock` failed ({reason}); run `make lock` when the package index is reachable, "
            "then commit uv.lock."
        )
        (PROJECT / "uv.lock").unlink(missing_ok=True)


def first_commit() -> None:
    git = shutil.which("git")
    if git is None:
        print("torch-template: git is not installed, so no repository was made; run `git init` later.")
        return
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
    # The author's answers sign the first commit only when git has no identity configured.
    identity = ["-c", f"user.name={ANSWERS['author_name']}", "-c", f"user.email={ANSWERS['author_email']}"]
    has_identity = subprocess.run([git, "config", "user.email"], capture_output=True, stdin=subprocess.DEVNULL, env=env)
    steps = [
        [git, "init", "--quiet"],
        [git, "add", "--all"],
        [
            git,
            *([] if has_identity.returncode == 0 else identity),
            "commit",
            "--quiet",
            "--no-verify",
            "--no-gpg-sign",
            "-m",
            "Initial commit from torch-template",
        ],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, stdin=subprocess.DEVNULL, env=env)
        if done.returncode != 0:
            print(f"torch-template: `{' '.join(step[1:3])}` failed ({done.stderr.strip()}); the files are all there.")
            return
        if step[1] == "init":
            # git's inactive *.sample hooks hold Jinja-like braces that template-leftover scans
            # flag; hooks a user's init.templateDir installs are kept.
            for sample in (PROJECT / ".git" / "hooks").glob("*.sample"):
                sample.unlink()


def main() -> None:
    prune()
    fill_agent_guides()
    write_versions()
    lock()
    first_commit()
    uv = "" if find_uv() else f" (needs uv: python3 -m pip install uv, or {UV_INSTALL})"
    print(
        f"\nCreated {PROJECT}\nNext:\n  cd {PROJECT.name}\n"
        f'  make install   # TORCH="..." to choose the torch build{uv}\n'
        "  make train\n  make test\n"
    )


if __name__ == "__main__":
    main()
