"""The hooks: bad answers are refused cleanly, hostile answers bake safely and literally."""

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, bake, leftover_template_syntax


@pytest.mark.parametrize(
    ("answers", "field"),
    [
        ({"package_name": "torch"}, "package_name"),
        ({"package_name": "lightning"}, "package_name"),
        ({"package_name": "json"}, "package_name"),  # standard library
        ({"package_name": "class"}, "package_name"),  # keyword
        ({"package_name": "match"}, "package_name"),  # soft keyword
        ({"package_name": "1model"}, "package_name"),
        ({"package_name": "my-model"}, "package_name"),
        ({"package_name": "os.path"}, "package_name"),
        ({"project_slug": "../escape"}, "project_slug"),
        ({"project_slug": "a/b"}, "project_slug"),
        ({"project_slug": "/etc/evil"}, "project_slug"),
        ({"project_slug": "Has Space"}, "project_slug"),
        ({"project_name": ""}, "project_name"),
        ({"project_name": "   "}, "project_name"),
        ({"project_name": "two\nlines"}, "project_name"),
        ({"description": "tab\there"}, "description"),
        ({"author_name": ""}, "author_name"),
        ({"author_email": "not-an-email"}, "author_email"),
        ({"author_email": "a@b"}, "author_email"),
    ],
)
def test_bad_answer_is_refused_naming_the_field_and_leaves_nothing(
    cookies, capfd: pytest.CaptureFixture, tmp_path: Path, answers: dict, field: str
) -> None:
    result = cookies.bake(extra_context=answers)
    assert result.exit_code != 0
    err = capfd.readouterr().err
    assert "the project was not created" in err
    assert f"- {field}" in err, err  # the message starts with the field's name
    # pytest-cookies bakes into tmp_path/cookies/bakeNN: only that empty folder may remain.
    left = [p for p in (tmp_path / "cookies").rglob("*") if not (p.is_dir() and p.name.startswith("bake"))]
    assert left == [], f"a refused bake left {left}"
    assert not any((tmp_path / "cookies").rglob("*/*")), "a refused bake left a folder"


@pytest.mark.parametrize(
    ("field", "value"),
    [("logger", "mlflow"), ("precision", "fp8"), ("compile", "maybe"), ("license", "GPL"), ("python_version", "2.7")],
)
def test_answer_outside_the_choices_is_refused_before_anything_is_written(
    cookies, tmp_path: Path, field: str, value: str
) -> None:
    # cookiecutter itself checks choice answers before generating; the pre-gen hook checks them
    # again for answers that bypass that check (replay files, other front ends).
    result = cookies.bake(extra_context={field: value})
    assert result.exit_code != 0
    assert field in str(result.exception) and "choices" in str(result.exception)
    assert not any((tmp_path / "cookies").rglob("*/*"))


def test_hook_checks_choices_too() -> None:
    source = (ROOT / "hooks" / "pre_gen_project.py").read_text().replace("{{ cookiecutter | tojson }}", "{}")
    namespace: dict = {}
    exec(compile(source, "pre_gen_project.py", "exec"), namespace)
    answers = {
        "project_name": "X", "project_slug": "x", "package_name": "x_model", "author_name": "A",
        "author_email": "a@b.io", "license": "GPL", "python_version": "3.11", "logger": "mlflow",
        "precision": "bf16-mixed", "compile": "no", "include_slurm": "yes", "use_sweeps": "yes",
        "use_benchmark": "yes", "use_serving": "yes", "use_prepared": "yes", "use_pretrained": "yes",
        "__experiment": "digits", "__project_dir": "x",
    }  # fmt: skip
    found = namespace["problems"](answers)
    assert [message.split()[0] for message in found] == ["license", "logger"]


def test_several_bad_answers_are_all_reported(cookies, capfd: pytest.CaptureFixture) -> None:
    result = cookies.bake(extra_context={"package_name": "torch", "author_email": "nope", "project_slug": "a/b"})
    assert result.exit_code != 0
    err = capfd.readouterr().err
    for field in ("package_name", "author_email", "project_slug"):
        assert f"- {field}" in err


HOSTILE = {
    "project_name": "Ünïcödé 'Quoted' \"Model\" $(touch PWNED) `touch PWNED`",
    "description": "It's \"\"\"triple\"\"\" and '''single''' \\ back\\slash ; import os; os.system('touch PWNED') #",
    "author_name": 'O\'Brien "Bob" Zoë',
    "author_email": "o.brien+ml@example.co.uk",
}


def test_hostile_text_bakes_into_valid_files_literally_and_is_never_executed(
    cookies, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # a `touch PWNED` run by a hook or a bake would land here
    project = bake(cookies, **HOSTILE)
    assert project.name == "unicode-quoted-model-touch-pwned-touch-pwned"
    assert not list(tmp_path.rglob("PWNED")) and not list(project.parent.rglob("PWNED"))
    assert leftover_template_syntax(project) == []

    pyproject = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["description"] == HOSTILE["description"]
    assert pyproject["project"]["authors"] == [{"name": HOSTILE["author_name"], "email": HOSTILE["author_email"]}]
    package = project / "src" / project.name.replace("-", "_")
    assert ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) == HOSTILE["description"]
    for path in project.rglob("*.py"):
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for path in project.rglob("*.yaml"):
        yaml.safe_load(path.read_text(encoding="utf-8"))
    assert HOSTILE["project_name"] in (project / "README.md").read_text(encoding="utf-8")
    assert HOSTILE["author_name"] in (project / "LICENSE").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "answer",
    ["{{ 7*7 }}", '{{ cycler.__init__.__globals__.os.popen("id -un > PWNED").read() }}', "{% if 1 %}x{% endif %}"],
)
def test_an_answer_with_template_syntax_is_refused_before_cookiecutter_evaluates_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    # Cookiecutter renders --no-input answers as Jinja before any hook runs: without
    # local_extensions.AnswersAreData the first bakes "49" and the second runs a command.
    monkeypatch.chdir(tmp_path)
    output = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(output), str(ROOT), f"description={answer}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1 and "An answer holds template syntax" in lines[0] and "Traceback" not in lines[0], lines
    assert not list(tmp_path.rglob("PWNED")) and not (output.exists() and any(output.iterdir()))


@pytest.mark.parametrize("route", ["config-file", "replay-file"])
@pytest.mark.parametrize(
    ("field", "value"),
    [("__project_dir", "../escaped"), ("__experiment", "digits\nprofiler: {class_path: subprocess.Popen}")],
)
def test_a_private_answer_given_in_a_file_is_refused_before_anything_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, route: str, field: str, value: str
) -> None:
    # Cookiecutter takes private answers from a config file's default_context and from a replay file: the
    # first wrote the project beside -o, the second a profiler into configs/ (code run by make train).
    monkeypatch.chdir(tmp_path)
    answers = json.loads((ROOT / "cookiecutter.json").read_text())
    answers.update({"__experiment": "digits", "__project_dir": "digits-classifier", field: value})  # as replayed
    if route == "config-file":
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"default_context": {field: value}}))
        given = ["--no-input", "--config-file", "config.yaml"]
    else:
        answers.update(task="image-classification", license="MIT", python_version="3.11", logger="csv")
        answers.update({key: "no" for key in answers if key.startswith("use_") or key == "include_slurm"})
        answers.update(project_name="Digits Classifier", project_slug="digits-classifier")
        answers.update(package_name="digits_classifier", compile="no", precision="bf16-mixed")
        (tmp_path / "replay.json").write_text(json.dumps({"cookiecutter": answers}))
        given = ["--replay-file", "replay.json"]
    output = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cookiecutter", *given, "-o", str(output), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TORCH_TEMPLATE_LOCK": "0"},
    )
    assert done.returncode != 0, done.stdout[-2000:]
    assert f"- {field} " in done.stderr and "a private answer the template derives" in done.stderr, done.stderr[-2000:]
    kept = {"config.yaml", "replay.json", "out", "home"}  # home: the test's own, where cookiecutter keeps replays
    written = [path for path in tmp_path.rglob("*") if path.relative_to(tmp_path).parts[0] not in kept]
    assert not (output.exists() and any(output.iterdir()))
    assert written == [], f"a refused bake left {written}"


def test_typed_template_syntax_is_kept_literally(tmp_path: Path) -> None:
    """Answers typed at the prompts are data: Jinja syntax in them is neither rendered nor executed."""
    name = "Net {{ 7*7 }} {% if 1 %}x{% endif %}"
    description = "Uses {{ cookiecutter.author_name }} and {% raw %} literally"
    # One line per question, in cookiecutter.json's order; empty lines take the default.
    answers = ["", name, "", "", description, *[""] * 13]  # task first: the default; 18 questions
    output = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "cookiecutter", "-o", str(output), str(ROOT)],
        input="\n".join(answers) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    (project,) = output.iterdir()
    assert project.name == "net-7-7-if-1-x-endif"
    readme = (project / "README.md").read_text()
    assert readme.startswith(f"# {name}\n\n{description}\n")
    pyproject = tomllib.loads((project / "pyproject.toml").read_text())
    assert pyproject["project"]["description"] == description
    assert leftover_template_syntax(project, allowed=(name, description)) == []


def test_bake_without_git_says_so_and_goes_on(cookies, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A PATH holding only python: the post-gen hook finds no git.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert shutil.which("git") is None
    project = bake(cookies)
    assert not (project / ".git").exists()
    assert (project / "pyproject.toml").exists()


def bake_in_a_subprocess(output: Path, **env: str) -> subprocess.CompletedProcess:
    """`cookiecutter --no-input` with default answers into ``output``, no terminal, ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "cookiecutter", "--no-input", "-o", str(output), str(ROOT)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def test_hooks_never_prompt(tmp_path: Path) -> None:
    """No terminal and a closed stdin: the bake still finishes (git cannot ask for anything)."""
    done = bake_in_a_subprocess(tmp_path, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    assert done.returncode == 0, done.stderr
    log = subprocess.run(
        ["git", "log", "--format=%an <%ae>"],
        cwd=tmp_path / "digits-classifier",
        capture_output=True,
        text=True,
        check=True,
    )
    assert log.stdout.strip() == "Your Name <you@example.com>"  # the answers sign it when git has no identity


def test_a_bake_that_cannot_lock_still_succeeds_and_says_how_to_lock(tmp_path: Path) -> None:
    """Offline with an empty uv cache, `uv lock` fails: the bake goes on, names `make lock`, leaves no uv.lock."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        pytest.skip("needs uv beside this Python (a template dev dependency)")
    done = bake_in_a_subprocess(
        tmp_path, TORCH_TEMPLATE_LOCK="1", UV_OFFLINE="1", UV_CACHE_DIR=str(tmp_path / "empty-cache")
    )
    assert done.returncode == 0, done.stderr
    assert "torch-template: `uv lock` failed (" in done.stdout and "run `make lock` when" in done.stdout
    project = tmp_path / "digits-classifier"
    assert (project / "pyproject.toml").exists() and not (project / "uv.lock").exists()
