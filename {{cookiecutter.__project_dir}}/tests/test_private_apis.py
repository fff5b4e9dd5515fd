"""Every private API of another library this project relies on, in one place: where, why, the version seen.

A private name (a leading underscore) has no deprecation period: any release of Lightning, torch,
jsonargparse{{ ", optuna" if cookiecutter.use_sweeps == "yes" else "" }}{{ " or LitServe" if cookiecutter.use_serving == "yes" else "" }} may drop or reshape it, and the code
that used it then fails in a run, far from the cause, or (an override no longer called) silently
stops doing its job. Each row is one use; its test checks what the use relies on and fails naming
the row, so `make test` after an upgrade says which use to rework. Uses a public API serves are not
here: they were replaced. Message texts of another library read by pattern count too: they are no
API at all.
"""

import argparse
import importlib.util
import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

import pytest
import torch
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.cli import LightningCLI


@dataclass(frozen=True)
class PrivateUse:
    name: str  # the private name, as the library spells it
    where: str  # the file of this project that uses it
    why: str  # what it does for us, and why no public API does it
    seen: str  # the releases it was checked against
    holds: Callable[[], bool]  # what the use relies on
    extra: str = ""  # a module of the optional dependencies the use belongs to: without it, nothing to check

    def __str__(self) -> str:
        return self.name


def calls(owner: type, method: str) -> bool:
    """``owner``'s own code still calls ``self.<method>(`` (an override that is never called does nothing)."""
    return f"self.{method}(" in inspect.getsource(owner)


_module = importlib.import_module


def parameters(function: Callable) -> list[str]:
    return list(inspect.signature(function).parameters)


def _foreach_norms_and_scaling() -> bool:
    tensors = [torch.tensor([3.0, -4.0]), torch.tensor([float("nan")]), torch.ones(2, 2)]
    norms = torch._foreach_norm(tensors, 2.0)
    fine = len(norms) == 3 and norms[0].item() == 5.0 and norms[1].isnan().item() and norms[2].item() == 2.0
    torch._foreach_mul_(tensors, torch.tensor(0.5))
    return fine and tensors[0].tolist() == [1.5, -2.0] and tensors[2].sum().item() == 2.0


def _version_counter() -> bool:
    tensor = torch.zeros(2)
    before = tensor._version
    tensor.mul_(2)
    view = tensor[:1]
    view.add_(1)
    return isinstance(before, int) and tensor._version == before + 2 and view._version == tensor._version
{%- if cookiecutter.use_sweeps == "yes" %}


def _optuna_trial_id() -> bool:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study()
    trial = study.ask()
    (frozen,) = study.get_trials(deepcopy=False)
    return frozen._trial_id == trial._trial_id and hasattr(study._storage, "set_trial_state_values")
{%- endif %}


def _jsonargparse_import_path_policy() -> bool:
    from jsonargparse import _common

    return {"import_path_verdicts", "import_paths_enforced"} <= set(_common.parsing_settings)


def _jsonargparse_messages() -> bool:
    from jsonargparse import ArgumentParser

    from {{ cookiecutter.package_name }}.engine import errors

    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--x", type=int)
    said = []
    for args in (["--x=a"], ["--y=1"]):
        try:
            parser.parse_args(args)
        except Exception as error:  # jsonargparse's ArgumentError
            said.append(str(error))
    typed, unknown = said
    key, expected = typed.splitlines()[0], typed.splitlines()[-1].strip()
    return bool(errors._PARSER_KEY.match(key) and errors._EXPECTED_TYPE.match(expected)) and bool(
        errors._GOT_VALUE.search(expected) and errors._UNRECOGNIZED.match(unknown)
    )


def _fused_step_reads_found_inf() -> bool:
    optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True)
    return optimizer._step_supports_amp_scaling is True and "found_inf" in inspect.getsource(type(optimizer).step)


def _model_parallel_sizes() -> bool:
    from lightning.pytorch.strategies import ModelParallelStrategy

    strategy = ModelParallelStrategy(data_parallel_size="auto", tensor_parallel_size=1)
    source = inspect.getsource(ModelParallelStrategy.setup_environment)
    sizes_read = "self._data_parallel_size" in source and "self._tensor_parallel_size" in source
    return strategy._data_parallel_size == "auto" and strategy._save_distributed_checkpoint is True and sizes_read


PRIVATE_USES = [
    PrivateUse(
        "lightning.pytorch.core.mixins.hparams_mixin._given_hyperparameters",
        "engine/module.py",
        "whether LightningCLI built the module from a config (it sets this context variable): then the net, "
        "optimizer and schedule are saved as their class and arguments, else left out of the hyper-parameters",
        "lightning 2.6.0 to 2.6.6",
        lambda: isinstance(_module("lightning.pytorch.core.mixins.hparams_mixin")._given_hyperparameters, ContextVar),
    ),
    PrivateUse(
        "lightning.pytorch.loggers.WandbLogger._wandb_init",
        "engine/quiet.py",
        "the arguments the logger hands to wandb.init: an anonymous run's setting is dropped before wandb reads it",
        "lightning 2.6.0 to 2.6.6",
        lambda: "self._wandb_init" in inspect.getsource(_module("lightning.pytorch.loggers").WandbLogger),
    ),
    PrivateUse(
        "torch.optim.Optimizer._step_supports_amp_scaling, and the found_inf it reads",
        "engine/callbacks/finite.py",
        "a fused optimizer skips a step with a non-finite gradient on the device (GradScaler's protocol), "
        "without a host synchronisation; no public API skips one step",
        "torch 2.6 to 2.13",
        _fused_step_reads_found_inf,
    ),
    PrivateUse(
        "lightning.fabric.utilities.types._PATH",
        "engine/checkpoints.py",
        "the path type of Lightning's CheckpointIO methods, which the checkpoint plugin overrides",
        "lightning 2.6.0 to 2.6.6",
        lambda: hasattr(importlib.import_module("lightning.fabric.utilities.types"), "_PATH"),
    ),
{%- if cookiecutter.task == "language-model" %}
    PrivateUse(
        "lightning.pytorch.LightningModule._trainer",
        "models/language_model.py",
        "the trainer if one is attached, else None: the public self.trainer raises outside a run (generate, serve)",
        "lightning 2.6.0 to 2.6.6",
        lambda: importlib.import_module("lightning").LightningModule()._trainer is None,
    ),
{%- endif %}
    PrivateUse(
        "jsonargparse's error texts ('Parser key \"...\":', 'Expected a <class ...>', 'Got value:', "
        "'unrecognized arguments:')",
        "engine/errors.py",
        "read by pattern to say a config mistake in one line naming the key; jsonargparse's errors carry no fields",
        "jsonargparse 4.53",
        _jsonargparse_messages,
    ),
    PrivateUse(
        "ModelParallelStrategy._data_parallel_size and ._save_distributed_checkpoint",
        "engine/sharding.py",
        "FSDP2Strategy sets the data-parallel size to the world size, known only once the Trainer has set the "
        "devices and nodes (the public 'auto' means across nodes), and reads whether checkpoints are folders",
        "lightning 2.6.6",
        _model_parallel_sizes,
    ),
    PrivateUse(
        "lightning.pytorch.cli.LightningCLI._parse_ckpt_path",
        "engine/training_cli.py",
        "overridden: Lightning's reads the checkpoint a second time and rebuilds the model from every saved "
        "argument; ours takes the copy read once and checked by the trust rule, less the optimizer and schedule",
        "lightning 2.6.0 to 2.6.6",
        lambda: parameters(LightningCLI._parse_ckpt_path) == ["self"] and calls(LightningCLI, "_parse_ckpt_path"),
    ),
    PrivateUse(
        "lightning.pytorch.cli.LightningCLI._run_subcommand",
        "engine/training_cli.py",
        "wrapped: a data or config mistake found once fit started is one line, and the unstarted run folder removed",
        "lightning 2.6.0 to 2.6.6",
        lambda: (
            parameters(LightningCLI._run_subcommand) == ["self", "subcommand"]
            and calls(LightningCLI, "_run_subcommand")
        ),
    ),
    PrivateUse(
        "the _instantiator and _class_path keys of a LightningCLI model's saved hyperparameters",
        "engine/trust.py, engine/training_cli.py",
        "a checkpoint's class and the function Lightning rebuilds it with: checked by the trust rule before any load",
        "lightning 2.6.6 (2.6.6 refuses any other _instantiator itself: CVE-2026-58659)",
        lambda: all(
            f'"{key}"' in inspect.getsource(importlib.import_module("lightning.pytorch.cli"))
            for key in ("_instantiator", "_class_path")
        ),
    ),
    PrivateUse(
        "lightning.pytorch.callbacks.RichProgressBar._get_train_description",
        "engine/callbacks/progress.py",
        "overridden: where a step limit stops the epoch (Lightning's counts to max_epochs, which a step limit "
        "may never reach)",
        "lightning 2.6.0 to 2.6.6",
        lambda: (
            parameters(RichProgressBar._get_train_description) == ["self", "current_epoch"]
            and calls(RichProgressBar, "_get_train_description")
        ),
    ),
    PrivateUse(
        "argparse.ArgumentParser._actions",
        "engine/training_cli.py",
        "the option keys of the CLI's parser and its subcommands': a mistyped key's one-line error names the "
        "closest accepted one; argparse has no public list of its actions",
        "Python 3.11 to 3.13, jsonargparse 4.53",
        lambda: all(hasattr(action, "dest") for action in argparse.ArgumentParser(prog="p")._actions),
    ),
    PrivateUse(
        "jsonargparse._common.parsing_settings (import_path_verdicts, import_paths_enforced)",
        "engine/import_guard.py",
        "jsonargparse's own import-path policy, set to deny what the trust rule does not admit while a "
        "checkpoint's or run folder's classes are built (a second guard beside the rule's own walk)",
        "jsonargparse 4.53",
        _jsonargparse_import_path_policy,
    ),
    PrivateUse(
        "torch._foreach_norm, torch._foreach_mul_",
        "engine/gradients.py",
        "each gradient's 2-norm in one fused call, and clipping's scaling (as clip_grad_norm_ does): the "
        "non-finite guard names the parameters at fault; torch.nn.utils.get_total_norm gives only the total",
        "torch 2.6 to 2.13",
        _foreach_norms_and_scaling,
    ),
    PrivateUse(
        "torch.Tensor._version",
        "engine/gradients.py",
        "the in-place version counter: the step's norms are shared while the gradients are unchanged, and "
        "taken afresh once anything (clipping) changed them; no public API says a tensor was modified",
        "torch 2.6 to 2.13",
        _version_counter,
    ),
{%- if cookiecutter.use_serving == "yes" %}
    PrivateUse(
        "torch._inductor.aoti_compile_and_package, torch._inductor.aoti_load_package",
        "engine/export.py",
        "make export --aoti: AOTInductor's documented entry points, in a private module",
        "torch 2.9 to 2.13",
        lambda: (
            callable(getattr(importlib.import_module("torch._inductor"), "aoti_compile_and_package", None))
            and callable(getattr(importlib.import_module("torch._inductor"), "aoti_load_package", None))
        ),
        extra="onnx",  # the export extra, installed where torch can export (>= 2.9)
    ),
    PrivateUse(
        "the loggers torch.onnx._internal.exporter._registration and torch.utils._pytree",
        "engine/export.py",
        "silenced while make export runs (their notes are for torch's developers); a renamed module is heard again",
        "torch 2.9 to 2.13",
        lambda: all(
            importlib.util.find_spec(name) is not None
            for name in ("torch.onnx._internal.exporter._registration", "torch.utils._pytree")
        ),
        extra="onnx",
    ),
{%- if cookiecutter.task == "language-model" %}
    PrivateUse(
        "litserve.specs.openai.OpenAISpec._encode_response",
        "serving/openai_api.py",
        "each streamed piece encoded as LitServe's OpenAI spec does, around our own scores and errors",
        "litserve 0.2.19",
        lambda: (
            parameters(importlib.import_module("litserve.specs.openai").OpenAISpec._encode_response)
            == ["self", "output"]
        ),
        extra="litserve",
    ),
{%- endif %}
{%- endif %}
{%- if cookiecutter.use_sweeps == "yes" %}
    PrivateUse(
        "optuna.trial.FrozenTrial._trial_id",
        "commands/sweep.py",
        "a trial that died before reporting anything is marked failed in the storage, which takes the storage's "
        "trial id (the public number is per study)",
        "optuna 4.9",
        _optuna_trial_id,
        extra="optuna",
    ),
{%- endif %}
]


@pytest.mark.parametrize("use", PRIVATE_USES, ids=str)
def test_a_private_api_this_project_relies_on_is_still_what_it_uses(use: PrivateUse) -> None:
    if use.extra:
        pytest.importorskip(use.extra, reason=f"{use.extra} is not installed: its extra's private API is not used")
    assert use.holds(), f"{use.name} changed ({use.where}: {use.why}; seen in {use.seen}): rework that use"
