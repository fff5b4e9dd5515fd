"""The software and hardware a run trained with, written beside its config: ``environment.json``.

A checkpoint says what was trained; this says with what: the Python, the torch build (its CUDA and
cuDNN versions), the GPUs, and the version of every installed distribution, so that a result can
be reproduced, or a difference between two runs traced to an upgrade.
"""

import importlib.metadata
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch


def describe_environment() -> dict[str, Any]:
    """This process's environment: python, platform, torch build, accelerators, the command, every package."""
    packages = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            packages[name.lower()] = distribution.version
    cuda = torch.cuda.is_available()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # None for a CPU build
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "gpus": [torch.cuda.get_device_name(index) for index in range(torch.cuda.device_count())] if cuda else [],
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "packages": dict(sorted(packages.items())),
    }


def record_environment(folder: Path) -> Path:
    """Write :func:`describe_environment` to ``folder/environment.json``; a resumed run whose environment
    differs (an upgrade between a job and its requeue) adds ``environment-resumed-<n>.json`` beside it."""
    text = json.dumps(describe_environment(), indent=2) + "\n"
    path = folder / "environment.json"
    if path.exists():
        first = json.loads(path.read_text())
        now = json.loads(text)
        if {k: v for k, v in first.items() if k != "command"} == {k: v for k, v in now.items() if k != "command"}:
            return path
        path = folder / f"environment-resumed-{1 + len(list(folder.glob('environment-resumed-*.json')))}.json"
    path.write_text(text)
    return path
