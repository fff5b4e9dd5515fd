"""User errors: a mistake the user can fix ends in one message and exit status 2, never a traceback.

Raise a :class:`UserError` subclass for anything caused by the user's input (a config value or
file, a data path or file, a checkpoint, a launch that does not match the config), with a message
that names the file or field and the fix. :func:`exit_on_user_error` (wrapped around every entry
point) prints it as ``error: <message>`` and exits 2, like an argparse error. Any other exception
is a bug and keeps its traceback.

Each subclass also derives from the built-in exception its callers would expect (``ValueError``
for a bad value, ``FileNotFoundError`` for a missing file), so ``except ValueError`` still works.

This module imports neither torch nor Lightning: a plain-PyTorch net in ``nets/`` raises
:class:`ConfigError` for a bad argument without pulling in a framework. Only a :class:`UserError`
becomes one line; any other exception, a ``ValueError`` from a bug included, keeps its traceback.
"""

import difflib
import inspect
import itertools
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml


class UserError(Exception):
    """A mistake in the user's input; the message names the file or field and how to fix it."""


def causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during, each once (a cycle ends the walk)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def user_error_in(error: BaseException) -> UserError | None:
    """The first :class:`UserError` among ``error`` and its causes (jsonargparse wraps what a constructor raises)."""
    return next((cause for cause in causes(error) if isinstance(cause, UserError)), None)


class ConfigError(UserError, ValueError):
    """A config value or config file that cannot work (``--trainer.*``, ``--model.*``, ``--data.*``, YAML)."""


class DataError(UserError, ValueError):
    """Data the DataModule cannot use: an unreadable file, an empty folder, a table without rows."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named (a data path, a checkpoint) does not exist."""


class LaunchError(UserError, RuntimeError):
    """The processes started (srun, torchrun) do not match what the config asks for."""


def check_config_files(args: Sequence[str]) -> None:
    """Parse every ``--config`` file of ``args`` as YAML first, so a syntax error names its file; and the
    files a config names for a whole section (``trainer: trainer.yaml``, read relative to that config).

    jsonargparse reports a YAML error as ``in "<unicode string>", line 2`` without the file's name, and
    a broken nested file as ``Unable to load config 'trainer.yaml'`` without the line.

    The first ``--config`` is a whole config: a file of ``configs/experiments/`` or ``configs/presets/``
    is an overlay (it sets only what it changes) and goes after one, as ``make`` passes it in ``ARGS``.

    Raises:
        ConfigError: a ``--config`` file, or a file one names, that is not valid YAML, with its path, line
            and column; an overlay given first.
    """
    paths = config_paths(args)
    overlay = Path(paths[0]).resolve().parent if paths else Path()
    if overlay.name in ("experiments", "presets") and overlay.parent.name == "configs":
        raise ConfigError(
            f"{paths[0]} is an overlay on a whole config, not one: give it after configs/default.yaml "
            f'(make: ARGS="--config {paths[0]}", CONFIG= names a whole config such as a sweep\'s best.yaml)'
        )
    for path in map(Path, paths):
        if not path.is_file():
            continue  # jsonargparse names a missing file itself
        tree = _read_yaml(path)
        nested = tree.values() if isinstance(tree, dict) else ()
        for value in nested:
            if isinstance(value, str) and value.endswith((".yaml", ".yml")) and (path.parent / value).is_file():
                _read_yaml(path.parent / value)


def config_paths(args: Sequence[str]) -> list[str]:
    """The files of ``args``' ``--config`` options (``--config <file>`` and ``--config=<file>``), in order."""
    return [
        arg.split("=", 1)[1] if arg.startswith("--config=") else value
        for arg, value in itertools.pairwise([*args, ""])
        if arg == "--config" or arg.startswith("--config=")
    ]


def _read_yaml(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(
            f"{path}: not valid YAML{where}: {problem}. Fix that line (lists are [a, b], maps are key: value)."
        ) from None


# The lines of jsonargparse's error for a value it refused, from the outer option to the inner one.
_PARSER_KEY = re.compile(r'^Parser key "(?P<key>[^"]+)":')
_CLASS_PROBLEM = re.compile(r"^Problem with given class_path '(?P<cls>[^']+)':")
_CALLABLE_PREFIX = re.compile(r"^Type .* expects a function or a callable class: ")  # an optimizer's arguments
_NOISE = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:", "Given value type:")
_UNKNOWN_OPTION = re.compile(r"Option '(?P<key>[^']+)' is not accepted")
_EXPECTED_TYPE = re.compile(r"^Expected a (?:<class '(?P<cls>[^']+)'>|typing\.Literal\[(?P<literal>.*)\])")
_NOT_IMPORTABLE = re.compile(r"^Expected a path but (?P<value>\S+) either not accessible or invalid")
_GOT_VALUE = re.compile(r"(?:Got|Given) value: (?P<value>.*?)(?:\. Got value: .*)?$")
_NO_ATTRIBUTE = re.compile(r"module '(?P<module>[^']+)' has no attribute '(?P<name>[^']+)'")
_CLASS_PATH_GIVEN = re.compile(r"class_path='(?P<cls>[^']+)'")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (?P<args>.+)$")
_NOT_ACCEPTED = re.compile(r"^Subcommand '[^']+' does not accept option '(?P<key>[^']+)'")


# Lightning's own checks of a config, raised only once fit has built the training loader.
VAL_CHECK_TOO_LONG = re.compile(
    r"`?val_check_interval`? \((\d+)\) must be less than or equal to the number of the training batches \((\d+)\)"
)


def lightning_config_error(error: Exception) -> ConfigError | None:
    """The one-line :class:`ConfigError` for a config mistake Lightning finds only when fit starts, or None.

    ``trainer.val_check_interval`` in steps longer than an epoch: Lightning 2.6 raises a ValueError
    naming the one setting, where the fix is in another (``check_val_every_n_epoch: null`` counts
    steps across epochs).
    """
    if match := VAL_CHECK_TOO_LONG.search(str(error)):
        steps, batches = match.groups()
        return ConfigError(
            f"trainer.val_check_interval={steps} steps is more than an epoch of {batches} training batches: give at "
            f"most {batches}, a fraction of an epoch (0.5), or trainer.check_val_every_n_epoch=null to validate every "
            f"{steps} steps across epochs"
        )
    return None


def readable_parser_message(message: str, known_keys: Iterable[str] = ()) -> str:
    """jsonargparse's error for a refused config value as one line: the full key, the problem, the fix.

    jsonargparse nests its message once per class it descends into and lists every alternative
    type it tried (``Expected a <class 'NoneType'>``, the whole given value). This keeps the dotted
    key as it is written in YAML (``model.init_args.net.init_args.dropout``), the innermost problem,
    and for a mistyped key or class the closest accepted one: from ``known_keys`` (the command's
    options), from the signature of the class the key was given to, or from the module named.
    """
    lines = [line.strip().removeprefix("- ") for line in message.splitlines() if line.strip()]
    if not lines:
        return message
    if match := _UNRECOGNIZED.match(lines[0]):
        keys = [arg.split("=", 1)[0].lstrip("-") for arg in match["args"].split() if arg.startswith("--")]
        return "; ".join(_unknown_key(key, known_keys) for key in keys) or message
    if match := _NOT_ACCEPTED.match(lines[0]):
        return _unknown_key(match["key"], known_keys)
    path: list[str] = []
    classes: list[str] = []
    problems: list[str] = []  # what the innermost option reported, one line per alternative type
    for line in lines:
        if prefix := _CALLABLE_PREFIX.match(line):
            remainder = line[prefix.end() :]
            if _PARSER_KEY.match(remainder):
                path.append("init_args")  # a callable's class (an optimizer) and its init_args
            line = remainder
        if match := _PARSER_KEY.match(line):
            path.append(match["key"])
            problems = []
        elif match := _CLASS_PROBLEM.match(line):
            classes.append(match["cls"])
            path.append("init_args")
            problems = []
        elif not line.startswith(_NOISE):
            problems.append(line)
    if not problems or not path:
        return message
    key = ".".join(path)
    for problem in problems:
        if match := _UNKNOWN_OPTION.search(problem):
            if given := _CLASS_PATH_GIVEN.search(problem):
                classes.append(given["cls"])
                key += ".init_args"
            return _unknown_key(f"{key}.{match['key']}", (), classes[-1] if classes else None)
    values = [match["value"] for problem in problems if (match := _GOT_VALUE.search(problem))]
    got = f", got {values[0]!r}" if values else ""
    for problem in problems:
        if match := _NO_ATTRIBUTE.search(problem):  # a mistyped class_path
            return _unimportable(key.removesuffix(".init_args") + ".class_path", f"{match['module']}.{match['name']}")
    types = [m["cls"] for p in problems if (m := _EXPECTED_TYPE.match(p)) and m["cls"] not in (None, "NoneType")]
    literals = [m["literal"] for p in problems if (m := _EXPECTED_TYPE.match(p)) and m["literal"]]
    if literals:
        types.append(f"one of {', '.join(literals)}")
    if types:
        # A NoneType alternative inside a class belongs to the outer option's union, not this key's.
        nullable = not classes and "Expected a <class 'NoneType'>" in problems
        expected = " or ".join(types + ["null"] * nullable)
        return f"{key}: expected {expected}{got}; fix the value in the config or on the command line"
    for problem in problems:
        if match := _NOT_IMPORTABLE.match(problem):
            return _unimportable(key, match["value"])
    problem = problems[0]
    return problem if key in problem else f"{key}: {problem}"


def _loaded(module: str) -> Any:
    """The module if it is already imported, else None.

    An error message is made of input (a config's or a checkpoint's values): formatting one must not
    import what it names, which would run that module's code (engine/trust.py).
    """
    return sys.modules.get(module)


def _unimportable(key: str, class_path: str) -> str:
    """'<key>: cannot import <class_path>' with the closest name of its module, when that module is loaded."""
    module, _, name = class_path.rpartition(".")
    loaded = _loaded(module)
    if loaded is None:
        return f"{key}: cannot import {class_path}; give the full class path, e.g. package.module.ClassName"
    names = [attribute for attribute in dir(loaded) if not attribute.startswith("_")]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    hint = f"did you mean {module}.{close[0]}?" if close else f"{module} has no {name}"
    return f"{key}: cannot import {class_path}; {hint}"


def _unknown_key(key: str, known_keys: Iterable[str], cls: str | None = None) -> str:
    """'<key>: no such option' with the closest accepted key, from ``known_keys`` or the class's arguments."""
    prefix = key.rpartition(".")[0]
    if cls:
        candidates = [f"{prefix}.{option}" for option in _class_arguments(cls)]
        where = f" of {cls}"
    else:
        candidates = list(known_keys)
        where = ""
    close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}?" if close else "run with --help to list the options"
    return f"{key}: no such option{where}; {hint}"


def _class_arguments(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s constructor accepts, a base class's too when it passes ``**kwargs``
    on ([] when its module is not loaded)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(_loaded(module), name)
        names = []
        for owner in (klass for klass in inspect.getmro(cls) if "__init__" in vars(klass)):
            parameters = inspect.signature(owner).parameters.values()  # **kwargs: the base class's go on
            names += [p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
            if all(p.kind is not p.VAR_KEYWORD for p in parameters):
                return names
        return names
    except (AttributeError, ValueError, TypeError):
        return []


@contextmanager
def exit_on_user_error(program: str = "error") -> Iterator[None]:
    """Turn a :class:`UserError` (or Lightning's MisconfigurationException) into one line on stderr and exit 2."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException  # here: nets import this module

    try:
        yield
    except (UserError, MisconfigurationException) as error:
        print(f"{program}: {str(error).strip()}", file=sys.stderr)
        raise SystemExit(2) from error  # the error stays reachable (``__cause__``) for tests and callers
