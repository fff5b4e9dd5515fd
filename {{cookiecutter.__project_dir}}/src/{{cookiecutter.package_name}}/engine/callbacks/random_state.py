"""Random number generator states in checkpoints, so a resumed run draws the same numbers as an uninterrupted one.

Lightning's checkpoints hold weights, optimizer, schedulers and loop progress, but not the global
RNGs: after a resume, dropout masks (and anything else drawing from ``torch``, ``numpy`` or
``random``) would differ from the uninterrupted run. The DataModule's loaders draw from
generators of their own, and their shuffle order is a function of (seed, epoch).
"""

import random
from typing import Any

import lightning as L
import numpy as np
import torch


class RandomStateCheckpoint(L.Callback):
    """Saves the torch (CPU and CUDA), numpy and Python RNG states in every checkpoint and restores them on resume.

    The states are stored as tensors and plain Python values, so checkpoints still load with
    ``torch.load(weights_only=True)``. Each process restores the state rank 0 saved; under DDP the
    processes' dropout masks then differ from an uninterrupted run, which matters only for exact
    reproduction (compare single-process runs).
    """

    def state_dict(self) -> dict[str, Any]:
        kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
        version, python_state, gauss = random.getstate()
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {
                "kind": kind,
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "position": position,
                "has_gauss": has_gauss,
                "cached_gauss": cached_gauss,
            },
            "python": {"version": version, "state": list(python_state), "gauss": gauss},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["torch"])
        if state_dict["cuda"] and torch.cuda.is_available() and len(state_dict["cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state_dict["cuda"])
        numpy_state = state_dict["numpy"]
        np.random.set_state(
            (
                numpy_state["kind"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["position"],
                numpy_state["has_gauss"],
                numpy_state["cached_gauss"],
            )
        )
        python_state = state_dict["python"]
        random.setstate((python_state["version"], tuple(python_state["state"]), python_state["gauss"]))
