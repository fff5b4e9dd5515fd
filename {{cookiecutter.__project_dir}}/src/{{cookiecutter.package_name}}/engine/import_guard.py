"""The trust rule (:mod:`engine.trust`) enforced where the imports and reads happen: :func:`loading`.

:func:`engine.trust.check_checkpoint` walks a checkpoint's arguments before anything is built; this module
guards the build itself, so that a form nobody listed is refused too: jsonargparse's own import-path policy
denies every value that names or resolves to something outside the rule; a ``sys.meta_path`` finder refuses to
import any module that is neither in the rule nor installed code (a module planted in the working folder, say
``labtools``, is neither); and an audit hook refuses to open, while the arguments are parsed, any file whose path
the arguments name (a YAML config that names a class).
"""

import argparse
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .checkpoints import CheckpointError
from .errors import causes
from .trust import CLASSES_ONLY, MAX_DEPTH, MAX_VALUES, PROJECT_PACKAGE, UntrustedCheckpointError


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
    """Parse and build what ``tree`` names (a checkpoint's arguments) under the trust rule.

    Inside, jsonargparse imports only values that name, and resolve to, the project's package,
    ``torch.optim``/``torch.nn``, ``trust`` and ``also`` (its import-path policy, set for the
    block and restored after); no module is imported that is neither trusted nor installed code
    (``sys.meta_path``); and while jsonargparse parses, no file whose path ``tree`` names is opened
    (an audit hook). ``trust``: modules the user vouches for; ``also``: what the kind of file may
    name besides (``LIGHTNING_OWN``).

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


def _parse_failure(error: BaseException) -> str | None:
    """jsonargparse's refusal of a value somewhere in ``error``'s chain, as one line; else None."""
    from .errors import readable_parser_message

    failure = next((e for e in causes(error) if isinstance(e, argparse.ArgumentError)), None)
    return None if failure is None else readable_parser_message(str(failure))


def _denied_import_path(error: BaseException) -> str | None:
    """The import path jsonargparse's policy denied somewhere in ``error``'s chain (or its message), else None."""
    marker = "Importing '"
    for current in causes(error):
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


def _strings(tree: Any, depth: int = 0, budget: list[int] | None = None) -> Iterator[str]:
    """Every string of ``tree`` at any depth, and the strings of YAML held in a string (``MAX_VALUES`` at most)."""
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        return
    if isinstance(tree, dict):
        for key, value in tree.items():
            if isinstance(key, str):
                yield key
            yield from _strings(value, depth + 1, budget)
    elif isinstance(tree, list | tuple):
        for item in tree:
            yield from _strings(item, depth + 1, budget)
    elif isinstance(tree, str):
        yield tree
        if any(mark in tree for mark in ":{[-\n"):
            try:
                parsed = yaml.safe_load(tree)
            except yaml.YAMLError:
                return
            if isinstance(parsed, dict | list):
                yield from _strings(parsed, depth + 1, budget)


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
