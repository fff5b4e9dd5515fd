"""Template updates: a bake made with `cruft create` takes a new template release with `make update-template`.

The template is copied into a git repository of its own, so the test can commit "releases" to it.
"""

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

TEMPLATE_PARTS = ["cookiecutter.json", "local_extensions.py", "hooks", "{{cookiecutter.__project_dir}}"]
GIT_IDENTITY = ["-c", "user.name=Test", "-c", "user.email=test@example.com"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *GIT_IDENTITY, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


def release(template: Path, message: str) -> None:
    git(template, "add", "--all")
    git(template, "commit", "--quiet", "-m", message)


def update(project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "update-template", f"PYTHON={sys.executable}"],
        cwd=project,
        capture_output=True,
        text=True,
    )


def test_update_template_applies_a_release_and_keeps_the_users_edits(tmp_path: Path) -> None:
    template = tmp_path / "template"
    template.mkdir()
    for part in TEMPLATE_PARTS:
        source = ROOT / part
        (shutil.copytree if source.is_dir() else shutil.copy2)(source, template / part)
    git(template, "init", "--quiet")
    release(template, "v1")

    subprocess.run(
        [sys.executable, "-m", "cruft", "create", "--no-input", str(template), "--output-dir", str(tmp_path / "out")],
        check=True,
        capture_output=True,
    )
    project = tmp_path / "out" / "digits-classifier"
    # The hook's first commit holds the bake; .cruft.json comes after it, and the README says to commit it.
    assert git(project, "status", "--porcelain").split() == ["??", ".cruft.json"]
    git(project, "add", ".cruft.json")
    git(project, "commit", "--quiet", "-m", "Link to the template")

    # Nothing released yet: nothing to do, nothing changed.
    done = update(project)
    assert done.returncode == 0, done.stderr
    assert git(project, "status", "--porcelain") == ""

    # The user's edit, then a template release that touches another file.
    config = project / "configs" / "trainer.yaml"
    config.write_text(config.read_text().replace("max_epochs: 30", "max_epochs: 7"))
    git(project, "commit", "--quiet", "-am", "Train for 7 epochs")
    makefile = template / "{{cookiecutter.__project_dir}}" / "Makefile"
    makefile.write_text(makefile.read_text() + "\nhello: ## A target from the new release\n\t@echo hello\n")
    release(template, "v2: a new target")

    done = update(project)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "applied cleanly" in done.stdout
    assert "max_epochs: 7" in config.read_text()  # the user's edit stayed
    # --no-print-directory: under a parent make (CI runs `make test`) make would add its own lines.
    hello = subprocess.run(
        ["make", "--no-print-directory", "hello"], cwd=project, capture_output=True, text=True, check=True
    )
    assert hello.stdout.strip() == "hello"  # the release arrived
    assert sorted(git(project, "diff", "HEAD", "--name-only").split()) == [".cruft.json", "Makefile"]
    git(project, "commit", "--quiet", "-am", "Template v2")

    # A release that changes the line the user changed: a conflict, which cruft reports as success.
    config.write_text(config.read_text().replace("max_epochs: 7", "max_epochs: 9"))
    git(project, "commit", "--quiet", "-am", "Train for 9 epochs")
    template_config = template / "{{cookiecutter.__project_dir}}" / "configs" / "trainer.yaml"
    template_config.write_text(template_config.read_text().replace("cookiecutter.task, 30)", "cookiecutter.task, 50)"))
    release(template, "v3: longer training")

    done = update(project)
    assert done.returncode != 0
    assert "configs/trainer.yaml" in done.stderr
    assert "conflict markers" in done.stderr or ".rej" in done.stderr
