"""Check that every package of uv.lock comes from a source this project names, before anything is installed.

`uv lock --check` compares the lock with pyproject.toml's requirements, not where the files come
from: a lock edited to fetch one package from another URL (with that file's hash) passes it, and
`uv sync --locked` then downloads and installs the foreign file. This check reads uv.lock and
refuses, in one line naming the package and the URL (exit 2):

- a package whose ``source`` is a registry other than the indexes named in pyproject.toml
  (``[[tool.uv.index]]``), in uv's environment (``UV_DEFAULT_INDEX``, ``UV_INDEX``,
  ``UV_INDEX_URL``, ``UV_EXTRA_INDEX_URL``), or PyPI (``https://pypi.org/simple``) while no index
  replaces it as the default;
- a file (sdist or wheel) whose URL is not on the host of one of those indexes (PyPI's files are on
  ``files.pythonhosted.org``), or is not in canonical form: only then do Python's ``urlsplit`` and
  uv (which reads URLs as browsers do, WHATWG) agree on the host. ``https://evil.example\\@files.
  pythonhosted.org/...`` is files.pythonhosted.org to ``urlsplit`` and evil.example to uv; so a
  file URL must be ``http(s)://`` + a lowercase host name + a path, with no backslash, userinfo,
  port, whitespace, non-ASCII letter, ``.``/``..`` segment or percent-encoded separator;
- a git, URL, path or directory source that pyproject.toml does not name itself (the project's own
  ``editable = "."`` / ``virtual = "."`` source passes).

Run by `make install` (after `uv lock --check`), the pre-commit hook and the project's CI.

    python scripts/check_lock.py [--lock uv.lock] [--pyproject pyproject.toml]
"""

import argparse
import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PYPI = "https://pypi.org/simple"
PYPI_HOSTS = {"pypi.org", "files.pythonhosted.org"}
FILE_HOSTS = {"pypi.org": PYPI_HOSTS}  # an index whose files live elsewhere
INDEX_VARIABLES = ("UV_DEFAULT_INDEX", "UV_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL")
OWN_SOURCES = ("editable", "virtual")
# http(s)://host/path: a lowercase host name alone (no userinfo, no port), then path characters and
# %XX escapes; ENCODED_SEPARATOR refuses the escapes that a URL parser may turn into structure.
CANONICAL_URL = re.compile(
    r"https?://[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?:/(?:[A-Za-z0-9._~+=,!$&'()*;:@/-]|%[0-9A-Fa-f]{2})*)?"
)
ENCODED_SEPARATOR = re.compile(r"%(?:2f|5c|2e|40|3a|3f|23|25|00)", re.IGNORECASE)


class LockError(Exception):
    """A package of the lock from a source the project does not name."""


def named_indexes(pyproject: dict[str, Any], environ: dict[str, str]) -> list[str]:
    """The index URLs the project names (pyproject.toml, then uv's environment), PyPI unless replaced."""
    declared = pyproject.get("tool", {}).get("uv", {}).get("index", [])
    indexes = [str(index["url"]) for index in declared if "url" in index]
    replaced = any(index.get("default") for index in declared)
    for name in INDEX_VARIABLES:
        for value in environ.get(name, "").split():  # UV_INDEX also takes name=url
            indexes.append(value.split("=", 1)[1] if "=" in value.split("://", 1)[0] else value)
            replaced = replaced or name in ("UV_DEFAULT_INDEX", "UV_INDEX_URL")
    if not replaced:
        indexes.append(PYPI)
    return [index.rstrip("/") for index in indexes]


def canonical_url(url: str) -> bool:
    """Whether ``url`` is in the one form whose host every URL parser reads the same (module docstring)."""
    if not CANONICAL_URL.fullmatch(url) or ENCODED_SEPARATOR.search(url):
        return False
    segments = urlsplit(url).path.split("/")
    return "." not in segments and ".." not in segments


def check_lock(lock: dict[str, Any], pyproject_text: str, environ: dict[str, str]) -> int:
    """Raise LockError for the first package from a source the project does not name; return how many passed."""
    pyproject = tomllib.loads(pyproject_text)
    indexes = named_indexes(pyproject, environ)
    hosts = set()
    for index in indexes:
        host = urlsplit(index).hostname or ""
        hosts |= FILE_HOSTS.get(host, {host})
    packages = lock.get("package", [])
    for package in packages:
        name = f"{package.get('name')} {package.get('version', '')}".strip()
        source = package.get("source", {})
        kind, where = next(iter(source.items()), ("none", ""))
        if kind == "registry":
            if str(where).rstrip("/") not in indexes:
                raise LockError(
                    f"uv.lock: {name} comes from the index {where}, which pyproject.toml does not name "
                    f"({', '.join(indexes)}): name it in [[tool.uv.index]] if you meant it, or run `make lock`"
                )
        elif kind in OWN_SOURCES and where == ".":
            continue
        elif str(where) not in pyproject_text:
            raise LockError(
                f"uv.lock: {name} comes from {kind} {where}, which pyproject.toml does not name: "
                "add it to the dependencies if you meant it, or run `make lock`"
            )
        files = [package.get("sdist", {}), *package.get("wheels", [])]
        for file in files:
            url = file.get("url")
            if url and kind == "registry" and not canonical_url(str(url)):
                raise LockError(
                    f"uv.lock: {name} is fetched from {url!r}, not a URL in canonical form (a backslash, userinfo, "
                    "a port, an encoded separator...), whose host uv may read differently from this check: the lock "
                    "was edited; restore it (git checkout uv.lock) or `make lock`"
                )
            if url and kind == "registry" and urlsplit(url).hostname not in hosts:
                raise LockError(
                    f"uv.lock: {name} is fetched from {url}, not from the host of an index pyproject.toml names "
                    f"({', '.join(sorted(hosts))}): the lock was edited; restore it (git checkout uv.lock) or "
                    "`make lock`"
                )
    return len(packages)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lock", type=Path, default=Path("uv.lock"))
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    try:
        lock = tomllib.loads(args.lock.read_text(encoding="utf-8"))
        count = check_lock(lock, args.pyproject.read_text(encoding="utf-8"), dict(os.environ))
    except (OSError, tomllib.TOMLDecodeError) as error:
        print(f"error: {args.lock}: not readable as a uv lock ({error})", file=sys.stderr)
        sys.exit(2)
    except LockError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(f"{args.lock}: {count} packages, each from a source pyproject.toml names")


if __name__ == "__main__":
    main()
