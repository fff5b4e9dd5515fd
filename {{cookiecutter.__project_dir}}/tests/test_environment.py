"""The locked environment: uv.lock matches pyproject.toml, and each run records what it ran with."""

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import lightning
import pytest

from {{ cookiecutter.package_name }}.engine.environment import LOCK, describe_lock, installed_versions
from {{ cookiecutter.package_name }}.engine.run_records import next_numbered, own_config, record_environment


def find_uv() -> str | None:
    beside = Path(sys.executable).with_name("uv")
    return shutil.which("uv") or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def test_uv_lock_matches_pyproject() -> None:
    """The staleness check of CI: a dependency edited in pyproject.toml without `make lock` fails here.

    Offline: a lock that still satisfies pyproject.toml is checked without the package index.
    """
    uv = find_uv()
    if uv is None:
        pytest.skip("uv is not installed (https://docs.astral.sh/uv/getting-started/installation/)")
    if not LOCK.is_file():
        pytest.skip(f"no {LOCK.name} in {LOCK.parent}: `make lock` writes it")
    done = subprocess.run([uv, "lock", "--check", "--offline"], cwd=LOCK.parent, capture_output=True, text=True)
    assert done.returncode == 0, f"uv.lock does not match pyproject.toml: run `make lock`.\n{done.stderr}"


LOCKED = """version = 1

[[package]]
name = "{{ cookiecutter.project_slug }}"
version = "0.1.0"
source = { editable = "." }

[[package]]
name = "rich"
version = "14.0.0"
source = { registry = "https://pypi.org/simple" }
sdist = { url = "https://files.pythonhosted.org/packages/ab/rich-14.0.0.tar.gz", hash = "sha256:00" }
wheels = [
    { url = "https://files.pythonhosted.org/packages/cd/rich-14.0.0-py3-none-any.whl", hash = "sha256:11" },
]
"""
EDITS = {
    "a wheel from another host": (
        "https://files.pythonhosted.org/packages/cd/rich-14.0.0-py3-none-any.whl",
        "https://evil.example.com/rich-14.0.0-py3-none-any.whl",
        r"rich 14.0.0 is fetched from https://evil.example.com/rich-14.0.0-py3-none-any.whl, not from the host",
    ),
    "another index": (
        'registry = "https://pypi.org/simple"',
        'registry = "https://mirror.example.com/simple"',
        r"rich 14.0.0 comes from the index https://mirror.example.com/simple, which pyproject.toml does not name",
    ),
    "a git source": (
        'registry = "https://pypi.org/simple"',
        'git = "https://example.com/rich.git?rev=1"',
        r"rich 14.0.0 comes from git https://example.com/rich.git\?rev=1, which pyproject.toml does not name",
    ),
}


@pytest.mark.parametrize("edit", [None, *EDITS])
def test_every_locked_package_comes_from_an_index_pyproject_names(tmp_path: Path, edit: str | None) -> None:
    """`uv lock --check` passes an edited URL with its file's hash; scripts/check_lock.py (make install) does not."""
    lock = tmp_path / "uv.lock"
    text = LOCKED
    if edit is not None:
        old, new, _ = EDITS[edit]
        text = text.replace(old, new)
    lock.write_text(text)
    command = [sys.executable, str(LOCK.parent / "scripts" / "check_lock.py"), "--lock", str(lock)]
    command += ["--pyproject", str(LOCK.parent / "pyproject.toml")]
    env = {key: value for key, value in os.environ.items() if not key.startswith("UV_")}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if edit is None:
        assert done.returncode == 0, done.stderr
        assert "2 packages, each from a source pyproject.toml names" in done.stdout
        return
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert re.search(EDITS[edit][2], done.stderr), done.stderr
    # An index the user's environment names (a company mirror) is theirs to use.
    mirror = {**env, "UV_INDEX": "https://mirror.example.com/simple"}
    mirrored = subprocess.run(command, capture_output=True, text=True, env=mirror)
    assert (mirrored.returncode == 0) == (edit == "another index"), mirrored.stderr


WHEEL = "packages/aa/bb/rich-14.0.0-py3-none-any.whl"
# Each URL once as a lock could hold it: the canonical one, and edits whose host a URL parser reads
# another way than Python's urlsplit does, or that merely look unusual.
URLS = [
    f"https://files.pythonhosted.org/{WHEEL}",
    f"https://evil.example\\@files.pythonhosted.org/{WHEEL}",  # urlsplit: pythonhosted; uv: evil.example
    f"https://files.pythonhosted.org%2f@evil.example/{WHEEL}",
    f"https://user@files.pythonhosted.org/{WHEEL}",
    f"https://files.pythonhosted.org:443/{WHEEL}",
    f"https://files.pythonhosted.org:8443/{WHEEL}",
    f"https://FILES.pythonhosted.org/{WHEEL}",
    f"https://files.pythonhosted.org./{WHEEL}",
    f"https://files.pythonhosted.org/packages/aa/../../{WHEEL}",
    f"https://files.pythonhosted.org/packages%2f..%2f{WHEEL}",
    f"https://files.pythonhosted.org\t/{WHEEL}",
    f"https://files.pythonhosted.org/{WHEEL}#frag",
]


def _host_uv_contacts(uv: str, url: str, tmp_path: Path) -> str | None:
    """The host of the URL uv would download ``url`` from (its offline error names it), or None if uv refuses it.

    Run outside the project, without configuration files: only uv's reading of the URL counts.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("UV_")}
    env["UV_NO_CONFIG"] = "1"
    if not (tmp_path / "venv").is_dir():
        made = subprocess.run([uv, "venv", "-q", str(tmp_path / "venv")], capture_output=True, env=env, cwd=tmp_path)
        assert made.returncode == 0, made.stderr
    python = str(tmp_path / "venv" / "bin" / "python")
    command = [uv, "pip", "install", "--offline", "--no-cache", "--python", python, f"rich @ {url}"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    # uv's last line names the URL it would fetch, as it parsed it ("...not found in the cache: <url>").
    urls = re.findall(r"https?://[^\s`'\"]+", done.stderr.splitlines()[-1] if done.stderr.strip() else "")
    assert done.returncode != 0 and (urls or "error" in done.stderr), f"uv's answer for {url}:\n{done.stderr}"
    return urlsplit(urls[-1]).hostname if urls else None


def test_a_lock_url_passes_only_where_uv_contacts_the_host_the_check_read(tmp_path: Path) -> None:
    # The check and uv read the same host, or the check refuses the URL (uv reads URLs as browsers do).
    uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
    if uv is None:
        pytest.skip("uv is not installed (make install needs it)")
    spec = importlib.util.spec_from_file_location("check_lock", LOCK.parent / "scripts" / "check_lock.py")
    check_lock = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check_lock)
    verdicts = {}
    for url in URLS:
        text = LOCKED.replace(next(re.finditer(r'url = "(https://files[^"]+)"', LOCKED))[1], url.replace("\\", "\\\\"))
        try:
            check_lock.check_lock(check_lock.tomllib.loads(text), (LOCK.parent / "pyproject.toml").read_text(), {})
            verdicts[url] = True
        except check_lock.LockError:
            verdicts[url] = False
        if verdicts[url]:
            assert _host_uv_contacts(uv, url, tmp_path) == urlsplit(url).hostname, url
    assert verdicts[URLS[0]] and sum(verdicts.values()) == 1, verdicts  # only the canonical form passes
    assert _host_uv_contacts(uv, URLS[1], tmp_path) == "evil.example"  # what the check protects from


def test_the_record_names_the_lock_and_each_installed_version_that_differs_from_it(tmp_path: Path) -> None:
    lock = tmp_path / "uv.lock"
    assert describe_lock({"lightning": lightning.__version__}, lock) is None  # no lock, nothing claimed
    packages = [("lightning", lightning.__version__), ("typing-extensions", "1.0"), ("typing-extensions", "2.0")]
    lock.write_text("version = 1\n" + "".join(f'\n[[package]]\nname = "{n}"\nversion = "{v}"\n' for n, v in packages))
    installed = {"lightning": lightning.__version__, "typing-extensions": "3.0", "torch": "2.13.0"}
    record = describe_lock(installed, lock)
    assert record == {
        "path": str(lock),
        "sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "differs": {"typing-extensions": dict(installed="3.0", locked=["1.0", "2.0"])},
    }


def test_a_lock_edited_and_a_package_installed_within_one_process_are_recorded_as_they_now_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What one process reads is kept (a sweep's trials record their environment each), never past a change.
    lock = tmp_path / "uv.lock"
    lock.write_text('version = 1\n\n[[package]]\nname = "demo-pkg"\nversion = "1.0"\n')
    assert describe_lock({"demo-pkg": "1.0"}, lock)["differs"] == {}
    lock.write_text('version = 1\n\n[[package]]\nname = "demo-pkg"\nversion = "2.0"\n')
    differs = {"installed": "1.0", "locked": ["2.0"]}
    assert describe_lock({"demo-pkg": "1.0"}, lock)["differs"] == {"demo-pkg": differs}

    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))

    def install(name: str, version: str) -> Path:
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        return info

    assert "demo-pkg" not in installed_versions()
    first = install("demo-pkg", "1.0")
    assert installed_versions()["demo-pkg"] == "1.0"
    install("Demo_Other", "0.1")
    assert installed_versions()["demo-other"] == "0.1"  # as uv.lock names it
    shutil.rmtree(first)
    install("demo-pkg", "2.0")  # an upgrade: one dist-info folder for another
    assert installed_versions()["demo-pkg"] == "2.0"
    packages = installed_versions()
    packages["demo-pkg"] = "edited"  # a caller's copy, not what the next run records
    assert installed_versions()["demo-pkg"] == "2.0"


def test_a_resumed_run_adds_its_environment_only_when_it_changed(tmp_path: Path) -> None:
    assert record_environment(tmp_path).name == "environment.json"
    assert record_environment(tmp_path).name == "environment.json"  # the same environment: nothing new
    first = json.loads((tmp_path / "environment.json").read_text())
    first["packages"]["lightning"] = "0.0.1"  # as if lightning was upgraded before the resume
    (tmp_path / "environment.json").write_text(json.dumps(first))
    assert record_environment(tmp_path).name == "environment-resumed-1.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["environment-resumed-1.json", "environment.json"]


def test_a_numbered_file_a_resume_adds_never_overwrites_an_earlier_one(tmp_path: Path) -> None:
    # metrics-<n>.csv, config-resumed-<n>.yaml, environment-resumed-<n>.json: one rule for all three.
    for name in ("config-resumed-1.yaml", "config-resumed-3.yaml", "config-resumed-x.yaml", "metrics-2.csv"):
        (tmp_path / name).write_text(name)  # resume 2's config deleted by hand; x is not a number
    assert next_numbered(tmp_path / "config.yaml").name == "config-resumed-4.yaml"  # not 3: that one is kept
    assert next_numbered(tmp_path / "metrics.csv", tag="").name == "metrics-3.csv"
    assert next_numbered(tmp_path / "environment.json").name == "environment-resumed-1.json"
    assert own_config(tmp_path) == tmp_path / "config-resumed-3.yaml"  # the newest, by number
