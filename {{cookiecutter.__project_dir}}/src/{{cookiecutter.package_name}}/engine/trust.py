"""Which names a checkpoint may make this program import: the trust rule, checked in one place.

A checkpoint stores the arguments of the run's model and DataModule as data (``hyper_parameters``,
``datamodule_hyper_parameters``). Loading it hands them to jsonargparse (Lightning's
``instantiate_module``, LightningCLI's ``--ckpt_path``), which imports a module for every name it
finds where a class or a callable is expected: a ``class_path``, a bare string ``"pkg.Class"``, a
string holding YAML (``"{class_path: pkg.Class}"``), a Callable-typed argument such as
``LambdaLR``'s ``lr_lambda: "pkg.function"``, at any depth, in lists too. Importing a module runs
its code, so a checkpoint could decide what code runs. :func:`check_checkpoint` reads every string
of those arguments first, and refuses the file, before anything is imported, when one names
something outside the trusted modules:

- this project's package: any class or function;
- ``torch.optim`` and ``torch.nn``: classes only (an optimizer, a schedule, a layer), never a
  function, since a callable from a checkpoint is code that runs;
- the modules the user trusts: ``--trust my_lab.data`` on predict, export, serve, serve-bench and
  generate (``make predict TRUST=my_lab.data``), ``load_trained(path, trust=[...])`` in Python; for
  ``fit``/``test``/``predict --ckpt_path`` and ``make resume``, the modules the run's own config names.

A dotted string that names no importable module (``"best.ckpt"``) is data and passes. The keys
``hparams`` and ``module_arguments`` (Lightning merges them into the model's arguments; this project
never writes them) and an ``_instantiator`` other than Lightning's own are refused outright.
"""

import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError

PROJECT_PACKAGE = __name__.split(".")[0]
CLASSES_ONLY = ("torch.optim", "torch.nn")
ARGUMENT_KEYS = ("hyper_parameters", "datamodule_hyper_parameters")
# Lightning's own legacy keys for a model's arguments (lightning.pytorch.core.saving.CHECKPOINT_PAST_HPARAMS_KEYS).
LEGACY_KEYS = ("hparams", "module_arguments")
INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
DOTTED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
MAX_DEPTH = 32


class UntrustedCheckpointError(CheckpointError):
    """A checkpoint names code outside the trusted modules; the message names the key, the name and ``--trust``."""


def trusted_modules(option: str | Sequence[str] | None) -> tuple[str, ...]:
    """``--trust`` as given on a command line ("my_lab.data,my_lab.nets") or as a list -> module names."""
    names = option.split(",") if isinstance(option, str) else (option or ())
    return tuple(name.strip() for name in names if name.strip())


def check_checkpoint(checkpoint: dict[str, Any], path: str | Path, trust: Sequence[str] = ()) -> None:
    """Refuse ``checkpoint`` if its arguments name code outside the trust rule (module docstring); import the rest.

    Every string of the model's and the DataModule's arguments is read, at any depth; none is
    imported until all passed. The trusted classes' modules are then imported, because Lightning
    builds only classes already imported.

    Raises:
        UntrustedCheckpointError: one line naming the key path (``hyper_parameters.lr_scheduler.
            init_args.lr_lambda``), the name, and the ``--trust`` that would allow it.
        CheckpointError: a trusted class whose module does not import.
    """
    for key in LEGACY_KEYS:
        if key in checkpoint:
            raise UntrustedCheckpointError(
                f"{path}: has the legacy key {key!r}, which Lightning would merge into the model's arguments "
                "unchecked; this project never writes it: refused. Use a checkpoint written by `make train`"
            )
    classes = []
    for key in ARGUMENT_KEYS:
        for where, name, is_class_path in _names(checkpoint.get(key), key, 0, path):
            if is_class_path and not DOTTED_NAME.fullmatch(name):  # make train saves full paths: pkg.module.Class
                raise UntrustedCheckpointError(f"{path}: {where} is {name!r}, not a full class path: refused")
            _check_name(name, where, path, trust)
            if is_class_path:
                classes.append((where, name))
    for where, name in classes:  # only once every name passed: nothing untrusted is imported
        module = name.rpartition(".")[0]
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise CheckpointError(
                f"{path}: {where} names the class {name}, whose module does not import ({error}); "
                "install it or put its folder on PYTHONPATH"
            ) from error


def trusted_by_config(config: Any) -> tuple[str, ...]:
    """The modules of every class a (user's own) parsed config names: a run's config is the user's input."""
    names = _names(_plain(config), "config", 0, "config")
    modules = {name.rpartition(".")[0] for _, name, is_class in names if is_class}
    return tuple(sorted(module for module in modules if module))


def _plain(config: Any) -> Any:
    """A jsonargparse Namespace (nested) -> dicts and lists."""
    if hasattr(config, "as_dict"):
        return config.as_dict()
    return config


def _names(tree: Any, where: str, depth: int, path: str | Path) -> Iterator[tuple[str, str, bool]]:
    """``(key path, name, is a class_path)`` for every string of ``tree`` that jsonargparse could import."""
    if depth > MAX_DEPTH:
        raise UntrustedCheckpointError(f"{path}: {where} is nested deeper than {MAX_DEPTH} levels: refused")
    if isinstance(tree, dict):
        for key, value in tree.items():
            inner = f"{where}.{key}"
            if key == "_instantiator":
                if value != INSTANTIATOR:
                    raise UntrustedCheckpointError(
                        f"{path}: {inner} is {value!r}, not Lightning's own {INSTANTIATOR}: refused"
                    )
            elif key in ("class_path", "_class_path") and isinstance(value, str):
                yield inner, value, True
            else:
                yield from _names(value, inner, depth + 1, path)
    elif isinstance(tree, list | tuple):
        for index, item in enumerate(tree):
            yield from _names(item, f"{where}[{index}]", depth + 1, path)
    elif isinstance(tree, str):
        text = tree.strip()
        if DOTTED_NAME.fullmatch(text):
            yield where, text, False
        elif any(mark in text for mark in ":{[-"):  # jsonargparse parses a string as YAML where it expects a class
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError:
                return
            if isinstance(parsed, dict | list):
                yield from _names(parsed, f"{where}<yaml>", depth + 1, path)


def _check_name(name: str, where: str, path: str | Path, trust: Sequence[str]) -> None:
    if _within(name, (PROJECT_PACKAGE, *trust)) or not _importable(name.split(".")[0]):
        return
    module = name.rpartition(".")[0]
    allow = f"If you trust this checkpoint, allow the module: --trust {module} (make predict/export/serve TRUST=...)"
    if _within(name, CLASSES_ONLY):
        if isinstance(_resolve(name), type):
            return
        raise UntrustedCheckpointError(
            f"{path}: {where} names {name}, which is not a class: from torch.optim and torch.nn a checkpoint may "
            f"name classes only, a function is code: refused. {allow}"
        )
    raise UntrustedCheckpointError(
        f"{path}: {where} names {name}, outside this project's package ({PROJECT_PACKAGE}), torch.optim and "
        f"torch.nn: refused before importing it. {allow}"
    )


def _within(name: str, modules: Sequence[str]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in modules)


def _importable(top: str) -> bool:
    """Whether ``top`` is a module Python would find (finding runs no code of it)."""
    if top in sys.modules:
        return True
    try:
        return importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False


def _resolve(name: str) -> Any:
    """The object a dotted name inside torch.optim / torch.nn names (importing those runs only their own code)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            target = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            target = getattr(target, attribute, None)
        return target
    return None
