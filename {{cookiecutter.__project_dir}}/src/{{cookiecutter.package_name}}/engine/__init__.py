"""The reusable training core: every guarantee a task keeps when its data, model or net is replaced.

- :class:`TrainingModule` (``module.py``): optimizer and schedule from the config, compile,
  channels-last, precision rules, cheap logging. Task LightningModules inherit it.
- :class:`ResumableDataModule` (``data.py``): loaders that resume exactly mid-epoch for any
  map-style data set. Task LightningDataModules inherit it.
{%- if cookiecutter.use_prepared == "yes" %}
- ``prepared.py``: prepared data sets (``make prepare``): fixed-size records in shards, written
  atomically, checked before training, read from disk with memory flat in their size.
{%- endif %}
- ``runs.py`` (run folders, resume, test after fit), ``checkpoints.py`` (atomic writes, clear load
  errors), ``launch.py`` (srun/torchrun checks), ``precision.py``, ``optim.py``, ``config.py``
  (fix-ups before anything is built) and ``callbacks/`` (pre-emption, RNG state, NaN stop, plots,
  the predictions writer).
- ``trust.py`` (which names a checkpoint may make the program import: checked before every load),
  ``contract.py`` (what a trained model needs of its DataModule and task module, with defaults) and
  ``inference.py`` (a checkpoint alone -> model, DataModule and a raw-input ``Predictor``): ``make predict``.
{%- if cookiecutter.use_serving == 'yes' %}
- ``export.py`` (ONNX, torch.export, AOTInductor, int8, each checked against eager PyTorch): ``make
  export``; the HTTP APIs of ``make serve`` live in ``serving/``.
{%- endif %}
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .data import ResumableDataModule
    from .module import TrainingModule
    from .optim import WarmupCosine

__all__ = ["ResumableDataModule", "TrainingModule", "WarmupCosine"]

# Imported when first asked for (PEP 562): ``engine.errors`` stays importable without Lightning,
# so a plain-PyTorch net can raise its ConfigError.
_SOURCES = {"ResumableDataModule": ".data", "TrainingModule": ".module", "WarmupCosine": ".optim"}


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_SOURCES[name], __name__), name)
