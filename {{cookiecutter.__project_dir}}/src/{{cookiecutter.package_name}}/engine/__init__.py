"""The reusable training core: every guarantee a task keeps when its data, model or net is replaced.

**For your own task you need what this list names; you need not read the rest of this package.**

- ``TrainingModule``: inherit it for your LightningModule and write ``shared_step(batch, metrics)``
  (the loss; update the torchmetrics given). The optimizer and schedule come from the config;
  compile, channels-last, precision rules, exact resume and cheap logging come with it
  (``models/`` holds this task's own, to copy).
- ``ResumableDataModule``: inherit it for your LightningDataModule and set ``self.train_set``,
  ``self.val_set``, ``self.test_set`` (anything with ``__len__`` and ``__getitem__``) in
  ``setup``; loaders that resume exactly mid-epoch, under DDP too, come with it. Its helpers
  ``split_indices`` (seeded, stratified train/val/test) and ``check_fractions`` are in
  ``datamodule.py``.
{%- if cookiecutter.task != "tabular" %} So is ``data_files``: a folder's data files at any depth, hidden ones
  and copies left out.
{%- endif %}
- ``errors.ConfigError`` and ``errors.DataError``: raise them with a message naming the field and
  the fix; the CLI prints the message as one line and exits with status 2, before anything is written.
- ``contract.py``: the hooks ``make predict``{{ ', export and serve' if cookiecutter.use_serving == 'yes' else '' }} call on a trained model's DataModule and task
  module, each with a default that works for a data set of tensors (override ``read_inputs`` to read
  your own files{{ ', ``raw_description`` to say what one input is' if cookiecutter.use_serving == 'yes' else '' }}).

The rest is the machinery that keeps those promises, each file one job: ``training_cli.py`` (the
CLI: options, resume, the trust rule, test after fit), ``runs.py`` (run folders: naming, finding,
resuming), ``run_files.py`` (what a run writes in its folder: config, environment, metrics),
``checkpoints.py`` (atomic writes, clear load errors), ``trust.py`` (what a checkpoint or run folder
may name, checked before every load), ``inference.py`` (a checkpoint alone -> model, DataModule and
a raw-input ``Predictor``), ``predict.py`` (``make predict``'s work), ``run_config.py`` (fix-ups before
anything is built), ``launch.py`` (srun/torchrun checks), ``precision.py``, ``gradients.py`` (a step's
gradient norms, computed once), ``optim.py`` (parameter groups, ``WarmupCosine``), ``environment.py``,
``quiet.py`` and ``callbacks/`` (pre-emption, RNG state, non-finite stop, plots, the predictions writer,
the progress bar).
{%- if cookiecutter.use_prepared == "yes" %}
``prepared.py``: prepared data sets (``make prepare``).
{%- endif %}
{%- if cookiecutter.task == "tabular" %}
``tables.py``: CSV, Parquet and Arrow tables read as written.
{%- elif cookiecutter.task == "language-model" %}
``text_files.py``: a corpus's text files, and a dataset's Parquet, Arrow or JSON Lines files (read by
``table_files.py``).
{%- else %}
``image_tables.py``: a Hugging Face image dataset's shards (read by ``table_files.py``).
{%- endif %}
{%- if cookiecutter.use_serving == 'yes' %}
``export.py``: ONNX, torch.export, AOTInductor, int8, each checked against eager PyTorch; the HTTP
APIs of ``make serve`` live in ``serving/``.
{%- endif %}
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .datamodule import ResumableDataModule
    from .module import TrainingModule
    from .optim import WarmupCosine

__all__ = ["ResumableDataModule", "TrainingModule", "WarmupCosine"]

# Imported when first asked for (PEP 562): ``engine.errors`` stays importable without Lightning,
# so a plain-PyTorch net can raise its ConfigError.
_SOURCES = {"ResumableDataModule": ".datamodule", "TrainingModule": ".module", "WarmupCosine": ".optim"}


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_SOURCES[name], __name__), name)
