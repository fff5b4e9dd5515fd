"""Which code a checkpoint or a run folder may make this program import: the trust rule, enforced where imports happen.

A checkpoint stores the arguments of the run's model and DataModule as data (``hyper_parameters``,
``datamodule_hyper_parameters``), and a run folder its config (``config.yaml``). Loading either
hands them to jsonargparse (Lightning's ``instantiate_module``, LightningCLI's ``--ckpt_path``,
``make resume``), which imports a module for every name it finds where a class or a callable is
expected, and reads a file for a path given where a class is expected. Importing a module runs
its code, so such a file could decide what code runs. The rule, what a checkpoint may name:

- this project's package: any class or function defined in it;
- ``torch.optim`` and ``torch.nn``: classes defined there only (an optimizer, a schedule, a layer),
  never a function, since a callable from a checkpoint is code that runs;
- Lightning's own callbacks, loggers, strategies and plugins, where a run folder's config names them;
- the modules the user vouches for: ``--trust my_lab.data`` on predict{{ ', export, serve, serve-bench' if cookiecutter.use_serving == 'yes' else '' }}{{ ' and generate' if cookiecutter.task == 'language-model' else '' }}
  (``make predict TRUST=my_lab.data``), ``load_trained(path, trust=[...])`` in
  Python; for ``fit``/``test``/``predict --ckpt_path`` and ``make resume``, the modules the user's
  own arguments and ``--config`` files name (never those of the run folder's ``config.yaml``).

A name is judged by what it resolves to (the object's own module), not by its prefix: the project's
``engine.checkpoints.os._exit`` is ``os._exit``. It is enforced in two places:

- :func:`check_checkpoint` reads every string of the arguments first and refuses the file in one
  line naming the key, for the forms known to be imported (class paths, dotted strings, YAML in a
  string, at any depth); the keys ``hparams`` and ``module_arguments`` and an ``_instantiator``
  other than Lightning's own are refused outright;
- :func:`loading` wraps the parsing and building itself, so that a form nobody listed is refused too:
  jsonargparse's own import-path policy denies every value that names or resolves to something
  outside the rule; a ``sys.meta_path`` finder refuses to import any module that is neither in the
  rule nor installed code (a planted ``labtools.py`` in the working folder is neither); and an
  audit hook refuses to open, while the arguments are parsed, any file whose path the arguments
  name (a YAML config that names a class).
"""

import argparse
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import site
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from {{ cookiecutter.package_name }}.engine.checkpoints import CheckpointError

PROJECT_PACKAGE = __name__.split(".")[0]
CLASSES_ONLY = ("torch.optim", "torch.nn")
# What a run folder's config.yaml may name besides the rule for checkpoints: Lightning's own parts.
LIGHTNING_PARTS = ("callbacks", "loggers", "strategies", "plugins", "profilers", "accelerators")
LIGHTNING_OWN = tuple(f"lightning.pytorch.{part}" for part in LIGHTNING_PARTS)
ARGUMENT_KEYS = ("hyper_parameters", "datamodule_hyper_parameters")
# Lightning's own legacy keys for a model's arguments (lightning.pytorch.core.saving.CHECKPOINT_PAST_HPARAMS_KEYS).
LEGACY_KEYS = ("hparams", "module_arguments")
INSTANTIATOR = "lightning.pytorch.cli.instantiate_module"
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
            if is_class_path and not _dotted(name):  # make train saves full paths: pkg.module.Class
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
    """The modules of every class or callable the user's own parsed arguments and ``--config`` files name."""
    names = _names(_plain(config), "config", 0, "config")
    modules = {name.rpartition(".")[0] for _, name, _ in names}
    return tuple(sorted(module for module in modules if module))


def trusted_by_config_files(folder: str | Path = "configs") -> tuple[str, ...]:
    """The modules named by the user's own config files (``configs/**/*.yaml``), which a run folder may name too."""
    modules: set[str] = set()
    for config in sorted(Path(folder).glob("**/*.yaml")):
        try:
            tree = yaml.safe_load(config.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not the user's config for this purpose; a run naming it fails on its own
        modules |= {name.rpartition(".")[0] for _, name, _ in _names(tree, "config", 0, config)}
    return tuple(sorted(module for module in modules if module))


def checkpoint_arguments(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The parts of a checkpoint that are parsed into objects: the model's and the DataModule's arguments."""
    return {key: checkpoint.get(key) for key in ARGUMENT_KEYS}


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
        if _dotted(text):
            yield where, text, False
        elif any(mark in text for mark in ":{[-"):  # jsonargparse parses a string as YAML where it expects a class
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError:
                return
            if isinstance(parsed, dict | list):
                yield from _names(parsed, f"{where}<yaml>", depth + 1, path)


def _check_name(name: str, where: str, path: str | Path, trust: Sequence[str]) -> None:
    if not _importable(name.split(".")[0]):
        return
    module = name.rpartition(".")[0]
    allow = f"If you trust this checkpoint, allow the module: --trust {module} (make predict/export/serve TRUST=...)"
    trusted = (PROJECT_PACKAGE, *trust)
    if _within(name, trusted):
        # Trusted by what it is: a class or function the trusted modules define, not one reached through them.
        target = _resolve(name)
        if target is None or _within(_defined_in(target), trusted):
            return
        if isinstance(target, type) and _within(_defined_in(target), CLASSES_ONLY):  # torch.optim.AdamW re-exported
            return
        raise UntrustedCheckpointError(
            f"{path}: {where} names {name}, which is {_defined_in(target) or 'an object'}.{_name_of(target)}, "
            f"not a class or function defined in this project's package ({PROJECT_PACKAGE}) or a trusted module: "
            f"refused. {allow}"
        )
    if _within(name, CLASSES_ONLY):
        target = _resolve(name)
        if isinstance(target, type) and _within(_defined_in(target), CLASSES_ONLY):
            return
        what = "not a class" if not isinstance(target, type) else f"the class {_defined_in(target)}.{target.__name__}"
        raise UntrustedCheckpointError(
            f"{path}: {where} names {name}, which is {what}: from torch.optim and torch.nn a checkpoint may "
            f"name classes defined there only, a function is code: refused. {allow}"
        )
    raise UntrustedCheckpointError(
        f"{path}: {where} names {name}, outside this project's package ({PROJECT_PACKAGE}), torch.optim and "
        f"torch.nn: refused before importing it. {allow}"
    )


def _defined_in(target: Any) -> str:
    """The module that defines ``target`` (a class's or function's ``__module__``; a module's own name)."""
    if inspect.ismodule(target):
        return target.__name__
    return getattr(target, "__module__", None) or getattr(type(target), "__module__", "") or ""


def _name_of(target: Any) -> str:
    return getattr(target, "__qualname__", None) or type(target).__qualname__


def _dotted(text: str) -> bool:
    """Whether ``text`` is a dotted import path (``pkg.Class``, ``paquete.Évil``): identifiers joined by dots."""
    parts = text.split(".")
    return len(parts) > 1 and all(part.isidentifier() for part in parts)


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


# ---- enforcement where the imports and reads happen ---------------------------------------------


class UntrustedImportError(ImportError):
    """Raised inside :func:`loading` in place of an import or a read that the trust rule refuses."""


class _Guard:
    """What :func:`loading` allows, and what it refused (modules and files, in order)."""

    def __init__(self, tree: Any, path: str | Path, trusted: tuple[str, ...]) -> None:
        self.tree = tree
        self.path = path
        self.trusted = trusted
        self.named_files = _named_files(tree)  # resolved path -> the string of tree that names it
        self.parsing = 0  # > 0 while jsonargparse parses: files named by the data are not read then
        self.refused: list[str] = []


_guard: _Guard | None = None


class _TrustFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path`` while a guard is active: a module outside the rule and outside the
    installed code (stdlib, site-packages) is refused before any of it runs."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        guard = _guard
        if guard is None or _related(fullname, guard.trusted):
            return None  # the normal finders decide
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or _installed(spec):
            return None
        guard.refused.append(fullname)
        raise UntrustedImportError(f"import of {fullname} refused by the trust rule ({spec.origin})")


_FINDER = _TrustFinder()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    guard = _guard
    if guard is None or not guard.parsing or event != "open" or not guard.named_files:
        return
    target = args[0] if args else None
    if not isinstance(target, str | bytes | os.PathLike):
        return  # a file descriptor
    try:
        resolved = Path(os.fsdecode(target)).expanduser().resolve()
    except (OSError, ValueError, RuntimeError):
        return
    if resolved in guard.named_files:
        guard.refused.append(guard.named_files[resolved])
        raise UntrustedImportError(f"{os.fsdecode(target)}: a file named by the loaded arguments is not read")


_AUDIT_HOOK: list[bool] = []  # an audit hook cannot be removed: added once, idle outside loading()


@contextmanager
def loading(tree: Any, path: str | Path, trust: Sequence[str] = (), also: Sequence[str] = ()) -> Iterator[None]:
    """Parse and build what ``tree`` names (a checkpoint's arguments, a run folder's config) under the trust rule.

    Inside, jsonargparse imports only values that name, and resolve to, the project's package,
    ``torch.optim``/``torch.nn``, ``trust`` and ``also`` (its import-path policy, set for the
    block and restored after); no module is imported that is neither trusted nor installed code
    (``sys.meta_path``); and while jsonargparse parses, no file whose path ``tree`` names is opened
    (an audit hook). ``trust``: modules the user vouches for; ``also``: what the kind of file may
    name besides (``LIGHTNING_OWN`` for a run folder's config).

    Raises:
        UntrustedCheckpointError: one line naming ``path``, the refused module, class or file, and
            the key of ``tree`` that holds it when one does; nothing of it was imported or read.
    """
    global _guard
    if _guard is not None:  # already inside a guarded load (load_trained builds the model, then the data)
        yield
        return
    from jsonargparse import ArgumentParser

    allowed = tuple(dict.fromkeys((PROJECT_PACKAGE, *CLASSES_ONLY, *trust, *also)))
    guard = _Guard(tree, path, allowed)
    if not _AUDIT_HOOK:
        sys.addaudithook(_audit)
        _AUDIT_HOOK.append(True)
    restore_policy = _deny_import_paths_except(allowed)
    parse_object = ArgumentParser.parse_object

    def parse_guarded(self, *args: Any, **kwargs: Any) -> Any:
        guard.parsing += 1
        try:
            return parse_object(self, *args, **kwargs)
        finally:
            guard.parsing -= 1

    ArgumentParser.parse_object = parse_guarded
    sys.meta_path.insert(0, _FINDER)
    _guard = guard
    try:
        yield
    except UntrustedCheckpointError:
        raise
    except Exception as error:
        refusal = guard.refused[0] if guard.refused else _denied_import_path(error)
        if refusal is not None:
            raise UntrustedCheckpointError(_refusal_message(path, guard.tree, refusal)) from error
        failure = _parse_failure(error)
        if failure is None:
            raise
        raise CheckpointError(
            f"{path}: its saved arguments do not build ({failure}); use a checkpoint written by `make train` "
            "with this version of the project"
        ) from error
    finally:
        _guard = None
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        ArgumentParser.parse_object = parse_object
        restore_policy()
    if guard.refused:  # refused, and a library went on without it: still a hostile file
        raise UntrustedCheckpointError(_refusal_message(path, guard.tree, guard.refused[0]))


def refusal_while_loading(error: BaseException | str | None) -> str | None:
    """Inside :func:`loading`: the one-line refusal for a parser error caused by the rule, else None.

    A parser reports a refused import as its own error; the CLI's parser asks here first, so the
    user reads what was refused and why instead of a type error about the key.
    """
    guard = _guard
    if guard is None:
        return None
    error = Exception(error) if isinstance(error, str) else error
    refused = guard.refused[0] if guard.refused else error and _denied_import_path(error)
    return None if refused is None else _refusal_message(guard.path, guard.tree, refused)


def _deny_import_paths_except(allowed: Sequence[str]) -> Any:
    """jsonargparse's import-path policy: deny every value's import path outside ``allowed``; returns its undo."""
    from jsonargparse import _common  # the policy's state, saved to be restored exactly

    keys = ("import_path_verdicts", "import_paths_enforced")
    if not all(key in getattr(_common, "parsing_settings", {}) for key in keys):
        return lambda: None  # a jsonargparse without the policy (not >= 4.53): the import hook still guards
    saved = {key: _common.parsing_settings[key] for key in keys}
    verdicts = {entry: False for entry in saved["import_path_verdicts"]} | {"*": False}
    verdicts |= {entry: True for entry in allowed}
    _common.parsing_settings["import_path_verdicts"] = verdicts
    _common.parsing_settings["import_paths_enforced"] = True

    def restore() -> None:
        _common.parsing_settings.update(saved)

    return restore


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during, each once."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _parse_failure(error: BaseException) -> str | None:
    """jsonargparse's refusal of a value somewhere in ``error``'s chain, as one line; else None."""
    from {{ cookiecutter.package_name }}.engine.errors import readable_parser_message

    failure = next((e for e in _chain(error) if isinstance(e, argparse.ArgumentError)), None)
    return None if failure is None else readable_parser_message(str(failure))


def _denied_import_path(error: BaseException) -> str | None:
    """The import path jsonargparse's policy denied somewhere in ``error``'s chain (or its message), else None."""
    marker = "Importing '"
    for current in _chain(error):
        text = str(current)
        if marker in text and "is not allowed" in text:
            start = text.index(marker) + len(marker)
            return text[start : text.index("'", start)]
    return None


def _refusal_message(path: str | Path, tree: Any, refused: str) -> str:
    where = (_key_holding(tree, refused, "") or "").lstrip(".")
    module = refused.rpartition(".")[0] or refused
    held = f"{where} names {refused}" if where else f"loading it asked for {refused}"
    allow = "" if os.sep in refused else f" If you trust this file, allow the module: --trust {module}"
    return (
        f"{path}: {held}, which the trust rule (engine/trust.py) does not allow: refused before importing or "
        f"reading it.{allow}"
    )


def _key_holding(tree: Any, needle: str, where: str, depth: int = 0) -> str | None:
    """The key path of the first string of ``tree`` that contains ``needle`` (or its first part), else None."""
    if depth > MAX_DEPTH:
        return None
    if isinstance(tree, dict):
        items = ((f"{where}.{key}", value) for key, value in tree.items())
    elif isinstance(tree, list | tuple):
        items = ((f"{where}[{index}]", value) for index, value in enumerate(tree))
    elif isinstance(tree, str):
        top = needle.split(".")[0]
        return where if needle in tree or (top and top in tree) or Path(needle).name in tree else None
    else:
        return None
    for inner, value in items:
        found = _key_holding(value, needle, inner, depth + 1)
        if found:
            return found
    return None


def _strings(tree: Any, depth: int = 0) -> Iterator[str]:
    """Every string of ``tree`` at any depth, and the strings of YAML held in a string."""
    if depth > MAX_DEPTH:
        return
    if isinstance(tree, dict):
        for key, value in tree.items():
            if isinstance(key, str):
                yield key
            yield from _strings(value, depth + 1)
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from _strings(item, depth + 1)
    elif isinstance(tree, str):
        yield tree
        if any(mark in tree for mark in ":{[-\n"):
            try:
                parsed = yaml.safe_load(tree)
            except yaml.YAMLError:
                return
            if isinstance(parsed, dict | list):
                yield from _strings(parsed, depth + 1)


def _named_files(tree: Any) -> dict[Path, str]:
    """The absolute paths the strings of ``tree`` could name (relative ones from the working folder), each
    with the string that names it."""
    files: dict[Path, str] = {}
    for text in _strings(tree):
        name = text.strip()
        if not name or len(name) > 4096 or "\0" in name:
            continue
        try:
            files.setdefault(Path(name).expanduser().resolve(), name)
        except (OSError, ValueError, RuntimeError):
            continue
    return files


def _related(name: str, modules: Sequence[str]) -> bool:
    """``name`` is one of ``modules``, inside one, or a package that holds one (imported on the way to it)."""
    return any(name == m or name.startswith(m + ".") or m.startswith(name + ".") for m in modules)


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    return tuple(Path(root).resolve() for root in roots if root)


def _installed(spec: importlib.machinery.ModuleSpec) -> bool:
    """Whether the module ``spec`` finds is installed code (the interpreter's, its site-packages'), not a stray file."""
    locations = [spec.origin] if spec.origin not in (None, "built-in", "frozen") else []
    locations += list(spec.submodule_search_locations or [])
    if not locations:
        return spec.origin in ("built-in", "frozen")
    roots = _installed_roots()
    return all(any(Path(location).resolve().is_relative_to(root) for root in roots) for location in locations)
