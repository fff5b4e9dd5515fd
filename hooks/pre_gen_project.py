"""Validate the answers before anything is written; on a bad answer, name the field and the fix.

The answers arrive as JSON data (rendered with ``tojson`` into a raw string) and are only ever
compared with patterns and lists: no answer is evaluated, executed or formatted into code. Before
this hook, cookiecutter renders every answer as a Jinja template; ``local_extensions.AnswersAreData``
refuses an answer that holds template syntax there, so none is evaluated on the way either.
On failure this script exits 1; cookiecutter then deletes the project folder it created.
"""

import json
import keyword
import re
import sys

ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

CHOICES = {
    "license": ("MIT", "Apache-2.0", "BSD-3-Clause", "Proprietary"),
    "python_version": ("3.11", "3.12", "3.13"),
    "logger": ("wandb", "tensorboard", "csv"),
    "precision": ("bf16-mixed", "16-mixed", "32-true"),
    "compile": ("yes", "no"),
    "use_sweeps": ("yes", "no"),
    "use_benchmark": ("yes", "no"),
    "use_serving": ("yes", "no"),
    "use_prepared": ("yes", "no"),
    "use_pretrained": ("yes", "no"),
    "include_slurm": ("yes", "no"),
}
# Import names the generated project or its users rely on: a package with one of these names
# would be imported instead of (or break) the real one.
SHADOWED = {
    "torch", "torchvision", "torchaudio", "torchtext", "torchmetrics", "lightning", "pytorch_lightning",
    "lightning_fabric", "lightning_utilities", "numpy", "scipy", "sklearn", "pandas", "matplotlib", "wandb",
    "tensorboard", "jsonargparse", "rich", "yaml", "pytest", "ruff", "setuptools", "pip", "hatchling",
    "cookiecutter", "transformers", "datasets", "accelerate", "onnx", "onnxruntime", "triton", "tests", "test", "src",
}  # fmt: skip
SLUG = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")
PACKAGE = re.compile(r"[a-z][a-z0-9_]*")
EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def problems(answers: dict) -> list[str]:
    """One message per invalid answer, each naming the field and how to fix it."""
    found = []
    for field in ("project_name", "project_slug", "package_name", "author_name", "author_email"):
        if not str(answers.get(field, "")).strip():
            found.append(f"{field} is empty: give a value, e.g. {field}=...")
    for field in ("project_name", "description", "author_name", "author_email"):
        value = str(answers.get(field, ""))
        if CONTROL.search(value):
            found.append(f"{field} contains a line break or control character: give one line of text")
        if len(value) > 300:
            found.append(f"{field} is {len(value)} characters long: keep it under 300")

    slug = str(answers.get("project_slug", ""))
    if slug and (not SLUG.fullmatch(slug) or len(slug) > 64):
        found.append(
            f"project_slug {slug!r} is not a safe folder and distribution name: use lowercase "
            "ASCII letters and digits separated by single '-' or '_', starting with a letter, "
            "at most 64 characters (e.g. project_slug=digits-classifier)"
        )

    package = str(answers.get("package_name", ""))
    if package:
        if not PACKAGE.fullmatch(package) or len(package) > 64:
            found.append(
                f"package_name {package!r} is not a valid import name: use lowercase ASCII "
                "letters, digits and '_', starting with a letter (e.g. package_name=digits_classifier)"
            )
        elif keyword.iskeyword(package) or keyword.issoftkeyword(package):
            found.append(f"package_name {package!r} is a Python keyword: choose another name, e.g. {package}_model")
        elif package in SHADOWED or package in sys.stdlib_module_names:
            found.append(
                f"package_name {package!r} would shadow the package of the same name "
                f"(standard library or a dependency): choose another name, e.g. my_{package}"
            )

    email = str(answers.get("author_email", ""))
    if email and not EMAIL.fullmatch(email):
        found.append(f"author_email {email!r} is not an email address: use name@domain.tld")

    for field, allowed in CHOICES.items():
        value = answers.get(field)
        if value not in allowed:
            found.append(f"{field} {value!r} is not one of the choices: use one of {', '.join(allowed)}")

    # Private answers are derived, never given: a --config-file's default_context or a --replay-file can set
    # them, and they reach file names and configs (a '../' project folder, a line of YAML).
    for field, derived in private_answers(answers).items():
        if answers.get(field) != derived:
            found.append(
                f"{field} {answers.get(field)!r} is a private answer the template derives ({derived!r} for these "
                f"answers): leave {field} out of your config or replay file"
            )
    return found


def private_answers(answers: dict) -> dict[str, str]:
    """The values cookiecutter.json derives for its private answers from the public ones."""
    experiments = {"tabular": "tabular", "language-model": "text"}
    return {
        "__experiment": experiments.get(answers.get("task"), "digits"),
        # project_slug passed the checks above, so no '/', '\\' or '.' is left to replace.
        "__project_dir": str(answers.get("project_slug", "")).replace("/", "_").replace("\\", "_").replace(".", "_")
        or "_",
    }


def main() -> int:
    found = problems(ANSWERS)
    if not found:
        return 0
    print("torch-template: the project was not created, because:", file=sys.stderr)
    for message in found:
        print(f"  - {message}", file=sys.stderr)
    print("Run cookiecutter again with corrected answers.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
