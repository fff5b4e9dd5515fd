"""The reusable training core: every guarantee a task keeps when its data, model or net is replaced.

This package is the same in every bake that has its files (a choice at bake time prunes whole files, never
lines of one), so it can be read, tested and upgraded as one piece. **Its lid is** ``__all__`` **below**: the
project's own code (data, models, nets, commands) imports the engine only through it
(``from <package>.engine import TrainingModule``), so what lies under it may change without touching that code.
A task's or a chosen capability's own engine module (a data format's reader, data sets written ahead of
training, exports: files that only some bakes have) is a lid of its own, its ``__all__`` the names other code
may import from it.

**For your own task you need what this list names; you need not read the rest of this package.**

- ``TrainingModule``: inherit it for your LightningModule and write ``shared_step(batch, metrics)``
  (the loss; update the torchmetrics given). The optimizer and schedule come from the config;
  compile, channels-last, precision rules, exact resume and cheap logging come with it
  (``models/`` holds this task's own, to copy).
- ``ResumableDataModule``: inherit it for your LightningDataModule and set ``self.train_set``,
  ``self.val_set``, ``self.test_set`` (anything with ``__len__`` and ``__getitem__``) in
  ``setup``; loaders that resume exactly mid-epoch, under DDP too, come with it. Its helpers
  ``split_indices`` (seeded, stratified train/val/test), ``check_fractions`` and ``data_files`` (a
  folder's data files at any depth, hidden ones and copies left out) are in ``datamodule.py``.
- ``errors.ConfigError`` and ``errors.DataError``: raise them with a message naming the field and
  the fix; the CLI prints the message as one line and exits with status 2, before anything is written.
- ``contract.py``: the hooks the commands that use a trained model call on its DataModule and task
  module, each with a default that works for a data set of tensors (override ``read_inputs`` to read
  your own files).

The rest is the machinery that keeps those promises, each file one job: ``training_cli.py`` (the
CLI: options, resume, the trust rule, test after fit), ``preflight.py`` (config checks and fix-ups before
anything is built), ``run_folders.py`` (run folders: naming, finding, claiming, resuming),
``run_records.py`` (what a run writes in its folder: config, environment, metrics), ``checkpoints.py``
(atomic writes, clear load errors), ``trust.py`` (what a checkpoint may name, checked before every load),
``import_guard.py`` (the same rule where the imports happen), ``inference.py`` (a checkpoint alone -> model,
DataModule and a raw-input ``Predictor``), ``predict.py`` (``make predict``'s work), ``launch.py``
(srun/torchrun checks), ``precision.py``, ``gradients.py`` (a step's gradient norms, computed once),
``optim.py`` (parameter groups, ``WarmupCosine``), ``metrics.py`` (``WeightedMean``: a mean without a host sync),
``environment.py``, ``files.py`` (files named by data), ``sharding.py`` (FSDP2), ``quiet.py`` and ``callbacks/``
(pre-emption, RNG state, non-finite stop, plots, the predictions writer, the progress bar, EMA). Each task's and
each chosen capability's own engine files (its data formats, exports, ...) say their job in their first line.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .callbacks import NonFiniteError, PreemptionCheckpoint
    from .checkpoints import CheckpointError, read_checkpoint
    from .contract import ShippableData, ShippableModel, stack_samples
    from .datamodule import (
        ResumableDataModule,
        WholeBatches,
        check_folds,
        check_fractions,
        data_files,
        left_out_note,
        listed,
        split_indices,
        written_by_a_tool,
    )
    from .errors import (
        ConfigError,
        DataError,
        LaunchError,
        MissingFileError,
        UserError,
        config_paths,
        exit_on_user_error,
    )
    from .files import check_as_written, read_text
    from .import_guard import loading
    from .inference import Trained, build_model, load_trained, nonfinite_message, nonfinite_rows, trusted_modules
    from .metrics import WeightedMean
    from .module import TrainingModule
    from .optim import WarmupCosine
    from .precision import fused_optimizer_allowed
    from .predict import write_predictions
    from .quiet import silence_dependency_noise, silence_srun_hint
    from .run_folders import best_checkpoint, finish_logger_runs, run_dir
    from .training_cli import TrainingCLI, run_cli
    from .trust import check_checkpoint, checkpoint_arguments

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataError",
    "LaunchError",
    "MissingFileError",
    "NonFiniteError",
    "PreemptionCheckpoint",
    "ResumableDataModule",
    "ShippableData",
    "ShippableModel",
    "Trained",
    "TrainingCLI",
    "TrainingModule",
    "UserError",
    "WarmupCosine",
    "WeightedMean",
    "WholeBatches",
    "best_checkpoint",
    "build_model",
    "check_as_written",
    "check_checkpoint",
    "check_folds",
    "check_fractions",
    "checkpoint_arguments",
    "config_paths",
    "data_files",
    "exit_on_user_error",
    "finish_logger_runs",
    "fused_optimizer_allowed",
    "left_out_note",
    "listed",
    "load_trained",
    "loading",
    "nonfinite_message",
    "nonfinite_rows",
    "read_checkpoint",
    "read_text",
    "run_cli",
    "run_dir",
    "silence_dependency_noise",
    "silence_srun_hint",
    "split_indices",
    "stack_samples",
    "trusted_modules",
    "write_predictions",
    "written_by_a_tool",
]

# Each name of the lid and the module that defines it, imported when first asked for (PEP 562): the names of
# ``engine.errors`` need no Lightning, so a plain-PyTorch net can raise its ConfigError.
_SOURCES = {
    # for your own task: the two bases and their helpers, the schedule, the errors that become one line
    "TrainingModule": ".module",
    "ResumableDataModule": ".datamodule",
    "WholeBatches": ".datamodule",
    "split_indices": ".datamodule",
    "check_fractions": ".datamodule",
    "check_folds": ".datamodule",
    "data_files": ".datamodule",
    "written_by_a_tool": ".datamodule",
    "listed": ".datamodule",
    "left_out_note": ".datamodule",
    "WarmupCosine": ".optim",
    "WeightedMean": ".metrics",
    "UserError": ".errors",
    "ConfigError": ".errors",
    "DataError": ".errors",
    "MissingFileError": ".errors",
    "LaunchError": ".errors",
    "config_paths": ".errors",
    "exit_on_user_error": ".errors",
    # a trained model: its contract, checked checkpoints, the trust rule, loading, predict
    "ShippableData": ".contract",
    "ShippableModel": ".contract",
    "stack_samples": ".contract",
    "CheckpointError": ".checkpoints",
    "read_checkpoint": ".checkpoints",
    "check_checkpoint": ".trust",
    "checkpoint_arguments": ".trust",
    "loading": ".import_guard",
    "Trained": ".inference",
    "load_trained": ".inference",
    "build_model": ".inference",
    "trusted_modules": ".inference",
    "nonfinite_rows": ".inference",
    "nonfinite_message": ".inference",
    "write_predictions": ".predict",
    # files named by data, run folders, the command line, the precision rules, quiet output, callbacks
    "read_text": ".files",
    "check_as_written": ".files",
    "run_dir": ".run_folders",
    "best_checkpoint": ".run_folders",
    "finish_logger_runs": ".run_folders",
    "TrainingCLI": ".training_cli",
    "run_cli": ".training_cli",
    "fused_optimizer_allowed": ".precision",
    "silence_dependency_noise": ".quiet",
    "silence_srun_hint": ".quiet",
    "PreemptionCheckpoint": ".callbacks",
    "NonFiniteError": ".callbacks",
}


def __getattr__(name: str):
    if name not in _SOURCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_SOURCES[name], __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
