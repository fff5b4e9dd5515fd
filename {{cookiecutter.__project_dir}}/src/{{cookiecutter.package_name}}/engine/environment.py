"""The software and hardware a run trained with: ``environment.json`` (``run_records.record_environment`` writes it).

A checkpoint says what was trained; this says with what: the Python, the torch build (its CUDA and
cuDNN versions), the GPUs, the version of every installed distribution and the project's uv.lock
(its SHA-256, and each installed version that differs from it), so that a result can be reproduced
(`make install` from the same lock, with the same TORCH=) or a difference between two runs traced
to an upgrade.
"""

import hashlib
import importlib.metadata
import os
import platform
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import torch

# src/<package>/engine/environment.py -> the project folder, where uv.lock lies (an editable install).
LOCK = Path(__file__).resolve().parents[3] / "uv.lock"

# A process that starts many runs (a sweep's trials, a test suite) reads the same lock and the same
# installed distributions each time: 0.25 s a run on 2 cores, most of it parsing a 1 MB uv.lock and
# reading 150 METADATA files. Each is kept under a key that changes with what it was read from.
_locked_by_sha256: dict[str, dict[str, list[str]]] = {}
_installed_by_folders: dict[tuple, dict[str, str]] = {}


def normalized(name: str) -> str:
    """A distribution name as uv.lock writes it (PEP 503: lowercase, runs of -_. as one -)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def describe_lock(packages: dict[str, str], lock: Path = LOCK) -> dict[str, Any] | None:
    """``lock``'s SHA-256 and the installed ``packages`` whose version it does not list; None without a lock.

    ``differs`` maps a name to ``{"installed": version, "locked": [versions]}`` (a universal lock may
    list several versions of one package, one per Python or platform); empty after `make install`
    with uv. torch is not locked (its build is the machine's choice) and so never differs.
    """
    if not lock.is_file():
        return None
    data = lock.read_bytes()
    sha256 = hashlib.sha256(data).hexdigest()
    if sha256 not in _locked_by_sha256:
        locked: dict[str, list[str]] = {}
        for package in tomllib.loads(data.decode("utf-8")).get("package", []):
            if "version" in package:
                locked.setdefault(normalized(package["name"]), []).append(package["version"])
        _locked_by_sha256.clear()  # one lock at a time: the project's
        _locked_by_sha256[sha256] = locked
    locked = _locked_by_sha256[sha256]
    differs = {
        name: {"installed": version, "locked": sorted(locked[name])}
        for name, version in packages.items()
        if name in locked and version not in locked[name]
    }
    return {"path": str(lock), "sha256": sha256, "differs": differs}


def installed_versions() -> dict[str, str]:
    """Every distribution this process can import, by normalized name: ``{name: version}``.

    Read again whenever a folder on ``sys.path`` changed since the last read: installing, removing or
    upgrading a distribution adds or removes its ``*.dist-info`` folder, which changes the folder's mtime.
    """
    folders = tuple((entry, os.stat(entry).st_mtime_ns) for entry in sys.path if os.path.isdir(entry))
    if folders not in _installed_by_folders:
        packages = {}
        for distribution in importlib.metadata.distributions():
            name = distribution.metadata["Name"]
            if name:
                packages[normalized(name)] = distribution.version
        _installed_by_folders.clear()
        _installed_by_folders[folders] = dict(sorted(packages.items()))
    return dict(_installed_by_folders[folders])


def describe_environment() -> dict[str, Any]:
    """This process's environment: python, platform, torch build, accelerators, the command, every
    package, and the project's uv.lock (see :func:`describe_lock`)."""
    packages = installed_versions()
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # None for a CPU build
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpus": [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())] if cuda else [],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "packages": packages,
        "lock": describe_lock(packages),
    }
