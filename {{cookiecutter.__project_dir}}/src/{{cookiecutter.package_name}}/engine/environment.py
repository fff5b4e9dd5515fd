"""The software and hardware a run trained with: ``environment.json`` (``run_records.record_environment`` writes it).

A checkpoint says what was trained; this says with what: the Python, the torch build (its CUDA and
cuDNN versions), the GPUs, the version of every installed distribution and the project's uv.lock
(its SHA-256, and each installed version that differs from it), so that a result can be reproduced
(`make install` from the same lock, with the same TORCH=) or a difference between two runs traced
to an upgrade.
"""

import functools
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
    locked = _locked_versions(data)
    differs = {
        name: {"installed": version, "locked": sorted(locked[name])}
        for name, version in packages.items()
        if name in locked and version not in locked[name]
    }
    return {"path": str(lock), "sha256": hashlib.sha256(data).hexdigest(), "differs": differs}


# A process that starts many runs (a sweep's trials, a test suite) parsed the same 1 MB lock and read the same
# 150 METADATA files at each (0.25 to 0.29 s a run on 2 cores): each is kept under a key that changes with its source.
@functools.lru_cache(maxsize=1)
def _locked_versions(lock: bytes) -> dict[str, list[str]]:
    locked: dict[str, list[str]] = {}
    for package in tomllib.loads(lock.decode("utf-8")).get("package", []):
        if "version" in package:
            locked.setdefault(normalized(package["name"]), []).append(package["version"])
    return locked


@functools.lru_cache(maxsize=1)
def _installed_versions(folders: tuple[tuple[str, int], ...]) -> dict[str, str]:
    # folders: sys.path's, each with its mtime, which an install, removal or upgrade (a dist-info folder) changes.
    found = ((dist.metadata["Name"], dist.version) for dist in importlib.metadata.distributions())
    return dict(sorted({normalized(name): version for name, version in found if name}.items()))


def installed_versions() -> dict[str, str]:
    """Every distribution this process can import: ``{normalized name: version}``, read again after any change."""
    folders = tuple((entry, os.stat(entry).st_mtime_ns) for entry in sys.path if os.path.isdir(entry))
    return dict(_installed_versions(folders))


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
