"""Which code a checkpoint may make this program import: the trust rule, and its check of a checkpoint's names.

A checkpoint is data, whoever wrote it (docs/trust.md); a config file is code, like a ``.py`` file. A
checkpoint stores the arguments of the run's model and DataModule (``hyper_parameters``,
``datamodule_hyper_parameters``); loading it hands them to jsonargparse (Lightning's
``instantiate_module``, LightningCLI's ``--ckpt_path``, ``make resume``), which imports a module for
every name it finds where a class or a callable is expected, and reads a file for a path given where
a class is expected. Importing a module runs its code, so such a file could decide what code runs.
The rule is by type and position (:class:`Positions`), not by module:

- every class a checkpoint names must be a **class** (never a function, method or builtin) that
  subclasses the type its position declares: a LightningModule for the model, a LightningDataModule
  for the data, ``nn.Module`` for ``net``, the constructor's annotation for any argument inside;
  every other argument is plain data (numbers, strings, lists and mappings of these);
- the class must be defined in this project's ``data/``, ``models/``, ``nets/`` or ``engine/`` (never in
  ``engine/training_cli.py`` or the engine's own ``tests/``, nor anywhere else in the package: its commands,
  CLI and entry points),
  ``torch.optim`` or ``torch.nn``, or in the modules the user vouches for: ``--trust my_lab.data`` on
  every command that loads a checkpoint and ``python -m <package> fit|test|predict``
  (``make predict TRUST=my_lab.data``),
  ``load_trained(path, trust=[...])`` in Python; besides, for ``fit``/``test``/``predict`` and
  ``make resume``, the modules the command line and its config files name (``configs/`` and any
  ``--config``: code the user runs);
- a loading command builds only what it needs: a checkpoint's optimizer and schedule are never
  parsed (:func:`checkpoint_arguments`).

A name is judged by what it resolves to (the object's own module), not by its prefix: the project's
``engine.checkpoints.os._exit`` is ``os._exit``. It is enforced in two places, one module each:

- here, :func:`check_checkpoint` checks every argument against its position's declared type first and
  refuses the file in one line naming the key; the keys ``hparams`` and ``module_arguments`` and an
  ``_instantiator`` other than Lightning's own are refused outright;
- :func:`engine.import_guard.loading` wraps the parsing and building itself, so that a form nobody listed is
  refused too, where the import or the read happens.
"""

import dataclasses
import enum
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import os
import types
import typing
from collections import abc
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
import yaml

from .checkpoints import CheckpointError

PROJECT_PACKAGE = __name__.split(".")[0]
CLASSES_ONLY = ("torch.optim", "torch.nn")
# Lightning's own parts: the config (code) names them, and they are built with a checkpoint's arguments.
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
    """Refuse ``checkpoint`` unless its arguments build classes of the declared base at every position.

    The model's arguments (``hyper_parameters``) must name a LightningModule, the DataModule's
    (``datamodule_hyper_parameters``) a LightningDataModule, and every argument inside them a class
    of the type the constructor declares there (an ``nn.Module`` for ``net``, an optimizer class for
    ``optimizer``), or plain data where the declared type takes no class (:class:`Positions`).
    Every name is resolved, and the modules that hold the classes imported, only once the module
    rule allows it (module docstring).

    Raises:
        UntrustedCheckpointError: one line naming the key path (``hyper_parameters.optimizer.class_path``),
            the name and what it is, and the ``--trust`` that would allow a module.
        CheckpointError: arguments that are not a mapping, or a trusted class whose module does not import.
    """
    for key in LEGACY_KEYS:
        if key in checkpoint:
            raise UntrustedCheckpointError(
                f"{path}: has the legacy key {key!r}, which Lightning would merge into the model's arguments "
                "unchecked; this project never writes it: refused. Use a checkpoint written by `make train`"
            )
    positions = Positions(path, trust)
    for key, base in _argument_bases():
        if checkpoint.get(key) is not None:
            positions.saved_arguments(checkpoint[key], base, key)


def _argument_bases() -> tuple[tuple[str, type], tuple[str, type]]:
    return (("hyper_parameters", L.LightningModule), ("datamodule_hyper_parameters", L.LightningDataModule))


# ---- the type at each position --------------------------------------------------------------

# The project's packages whose classes a file may name, declared: the room's data, models and nets, and the
# engine less its CLI half and its own tests. The rest of the package (its commands, CLI and entry points, and
# whatever module comes next) never is, even when trusted.
BUILDABLE = tuple(f"{PROJECT_PACKAGE}.{name}" for name in ("data", "models", "nets", "engine"))
NEVER_TARGETS = tuple(f"{PROJECT_PACKAGE}.engine.{name}" for name in ("training_cli", "tests"))


def never_built(name: str) -> bool:
    """Whether the dotted ``name`` lies in this project's package but outside what a file may name (``BUILDABLE``)."""
    return _within(name, (PROJECT_PACKAGE,)) and (not _within(name, BUILDABLE) or _within(name, NEVER_TARGETS))


# The keys jsonargparse reads in a class spec; the ones a checkpoint's own arguments carry.
SPEC_KEYS = {"class_path", "init_args", "dict_kwargs"}
SAVED_KEYS = {"_class_path", "_instantiator"}
MAX_VALUES = 100_000  # values of one file's arguments walked at most (shared lists make a small file a big tree)
_PLAIN_TYPES = (type(None), bool, int, float, str, bytes, complex, Path, os.PathLike, torch.device, torch.dtype)
_LISTS = (list, tuple, set, frozenset, abc.Sequence, abc.MutableSequence, abc.Iterable, abc.Collection, abc.Set)
_MAPPINGS = (dict, abc.Mapping, abc.MutableMapping)


class Positions:
    """The type at each position of a file's arguments: what may be built there, checked before anything is.

    A position is an argument of a class that will be built. Its declared type (the constructor's
    annotation) decides what a file may put there:

    - a class type (``nn.Module``, ``Callback``; ``Callable[..., Optimizer]``, which jsonargparse
      builds from a class; unions and lists of these): a class spec (``class_path`` +
      ``init_args``) or a dotted class path, naming a **class** (never a function, method or
      builtin) that subclasses the declared type, defined in a module the module rule allows and
      within the project's ``BUILDABLE`` packages when it is the project's; its ``init_args`` are
      checked the same way against its own constructor;
    - a function type (``Callable`` that returns no class, ``type[...]``): nothing (None) from a file;
    - anything else (numbers, strings, ``Literal``, ``Any``, a parameter without annotation,
      ``**kwargs``): plain data (None, booleans, numbers, strings, lists and mappings of these)
      holding no class spec, not even as YAML inside a string, since jsonargparse builds one it
      finds where a type accepts any value.

    ``trust`` and ``also`` extend the modules the rule allows; the walk reads at most
    ``MAX_VALUES`` values and ``MAX_DEPTH`` levels, so a small file cannot make it spin.
    """

    def __init__(self, path: str | Path, trust: Sequence[str] = (), also: Sequence[str] = ()) -> None:
        self.path, self.trust = path, tuple(trust)
        self.allowed = tuple(dict.fromkeys((PROJECT_PACKAGE, *CLASSES_ONLY, *trust, *also)))
        self.values = 0

    # -- entry points ---------------------------------------------------------------------------
    def saved_arguments(self, arguments: Any, base: type, where: str) -> None:
        """A checkpoint's arguments: ``{"_class_path": ..., "_instantiator": ..., <argument>: <value>}``."""
        if not isinstance(arguments, dict):
            raise UntrustedCheckpointError(
                f"{self.path}: {where} is {type(arguments).__name__}, not the mapping of arguments `make train` "
                "saves: refused. Use a checkpoint written by `make train`"
            )
        instantiator = arguments.get("_instantiator", INSTANTIATOR)
        if instantiator != INSTANTIATOR:
            raise UntrustedCheckpointError(
                f"{self.path}: {where}._instantiator is {instantiator!r}, not Lightning's own {INSTANTIATOR}: refused"
            )
        name = arguments.get("_class_path")
        if not isinstance(name, str):
            raise CheckpointError(
                f"{self.path}: no {'model' if where == 'hyper_parameters' else 'datamodule'} class saved in it "
                f"({where}); use a checkpoint written by `make train` (python -m <package> fit)"
            )
        target = self.resolve(name, (base,), f"{where}._class_path")
        parameters = _parameters(target)
        given = {
            key: value
            for key, value in arguments.items()
            # An optimizer or a schedule is never built from a file (checkpoint_arguments): not read either.
            if key not in SAVED_KEYS and not (key in parameters and _training_only(parameters[key]))
        }
        self.arguments(given, target, where)

    def arguments(self, given: dict[str, Any], target: Any, where: str) -> None:
        """``given`` keyword arguments of ``target`` (a class), each against its declared type."""
        parameters = _parameters(target)
        for key, value in given.items():
            inner = f"{where}.{key}"
            # jsonargparse appends to a list given as `callbacks+`
            parameter = parameters.get(key.removesuffix("+")) if isinstance(key, str) else None
            if parameter is not None and parameter.kind not in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
                self.value(value, parameter.annotation, inner)
            else:  # **kwargs, or a key jsonargparse refuses by itself (with the closest accepted one)
                self.plain(value, inner)

    # -- one position ---------------------------------------------------------------------------
    def value(self, value: Any, annotation: Any, where: str, depth: int = 0) -> None:
        self._count(where, depth)
        classes, function = _declared(annotation)
        if value is None or isinstance(value, bool | int | float):
            return
        if function and not classes:
            raise UntrustedCheckpointError(
                f"{self.path}: {where} takes a function (or a type that does not resolve here: "
                f"{_type_name(annotation)}), and a file may not name code there: refused (remove the key to use "
                "the default)"
            )
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                self.value(item, annotation, f"{where}[{index}]", depth + 1)
        elif isinstance(value, dict) and value.keys() & (SPEC_KEYS | SAVED_KEYS):
            if not classes:
                raise UntrustedCheckpointError(
                    f"{self.path}: {where} holds a class spec, and its declared type "
                    f"({_type_name(annotation)}) takes plain data: refused"
                )
            self.spec(value, classes, where, depth)
        elif isinstance(value, dict) and classes:
            # A mapping without class_path where a class is declared: the declared class's own arguments
            # (a dataclass of settings, or the init_args of the default's class).
            declared = next((c for c in classes if dataclasses.is_dataclass(c)), None)
            if declared is not None:
                self.arguments(value, declared, where)
            else:
                self.plain(value, where, depth)
        elif isinstance(value, str) and classes and _dotted(value.strip()):
            self.resolve(value.strip(), classes, where)
        elif isinstance(value, str) and classes and isinstance(parsed := _yaml(value), dict | list):
            self.value(parsed, annotation, f"{where}<yaml>", depth + 1)  # jsonargparse reads YAML there
        elif isinstance(value, str) and classes and not _takes_text(annotation):
            # jsonargparse would read it as a class name, or as the path of a config file to read.
            raise UntrustedCheckpointError(
                f"{self.path}: {where} is {value[:300]!r}, where a class spec or a full class path is declared: refused"
            )
        else:
            self.plain(value, where, depth)

    def spec(self, spec: dict[str, Any], classes: tuple[type, ...], where: str, depth: int) -> None:
        unknown = sorted(str(key) for key in spec.keys() - SPEC_KEYS)
        if unknown:
            raise UntrustedCheckpointError(
                f"{self.path}: {where} has {unknown[0]!r}, not a key of a class spec (class_path, init_args): refused"
            )
        name = spec.get("class_path")
        if name is None and "class_path" not in spec:  # a preset's init_args, merged into the class given before
            # Its class is not known here: each argument may still name classes only, from allowed modules.
            for key in ("init_args", "dict_kwargs"):
                given = spec.get(key)
                for inner, value in given.items() if isinstance(given, dict) else [(None, given)]:
                    self.value(value, Unresolved("a class given elsewhere"), f"{where}.{key}.{inner}", depth + 1)
            return
        if not isinstance(name, str):
            raise UntrustedCheckpointError(f"{self.path}: {where}.class_path is {name!r}, not a class path: refused")
        target = self.resolve(name.strip(), classes, f"{where}.class_path")
        for key in ("init_args", "dict_kwargs"):
            given = spec.get(key)
            if given is None:
                continue
            if not isinstance(given, dict):
                raise UntrustedCheckpointError(f"{self.path}: {where}.{key} is not a mapping: refused")
            self.arguments(given, target, f"{where}.{key}")

    def plain(self, value: Any, where: str, depth: int = 0) -> None:
        """Plain data: None, booleans, numbers, strings, lists and mappings of these; no class spec anywhere."""
        self._count(where, depth)
        if value is None or isinstance(value, bool | int | float):
            return
        if isinstance(value, str):
            if "class_path" in value:  # YAML in a string, parsed where a type takes any value
                raise UntrustedCheckpointError(
                    f"{self.path}: {where} is a string that holds a class spec ({value[:60]!r}), where plain "
                    "data is declared: refused"
                )
            return
        if isinstance(value, list | tuple):
            for index, item in enumerate(value):
                self.plain(item, f"{where}[{index}]", depth + 1)
            return
        if isinstance(value, dict):
            for key, item in value.items():
                if key in SPEC_KEYS | SAVED_KEYS:
                    raise UntrustedCheckpointError(
                        f"{self.path}: {where}.{key} is a class spec where plain data is declared: refused"
                    )
                self.plain(key, f"{where}.{key}", depth + 1)
                self.plain(item, f"{where}.{key}", depth + 1)
            return
        raise UntrustedCheckpointError(
            f"{self.path}: {where} is a {type(value).__name__}, not plain data (numbers, strings, lists, "
            "mappings): refused"
        )

    def resolve(self, name: str, classes: tuple[type, ...], where: str) -> type:
        """The class ``name`` names, once the module rule allows its module; a class of ``classes``, else refused."""
        allow = f"If you trust this file, allow the module: --trust {name.rpartition('.')[0] or name}"
        if not _dotted(name):
            raise UntrustedCheckpointError(f"{self.path}: {where} is {name!r}, not a full class path: refused")
        if never_built(name) or not _within(name, self.allowed):
            raise UntrustedCheckpointError(
                f"{self.path}: {where} names {name}, outside the modules a file may name ({', '.join(self.allowed)}; "
                f"of {PROJECT_PACKAGE} only .data, .models, .nets and .engine, never .engine.training_cli or "
                f".engine.tests): refused before importing it. {allow}"
            )
        target = _resolve(name)
        if target is None:
            raise CheckpointError(
                f"{self.path}: {where} names {name}, which does not import; install its package or put "
                "its folder on PYTHONPATH"
            )
        home = _defined_in(target)
        expected = " or ".join(_qualified(c) for c in classes)
        if not inspect.isclass(target):
            raise UntrustedCheckpointError(
                f"{self.path}: {where} names {name}, which is {_what(target)}, not a class: a file may name "
                f"classes only ({expected} here), a function is code: refused"
            )
        if never_built(home) or not _within(home, self.allowed):
            raise UntrustedCheckpointError(
                f"{self.path}: {where} names {name}, which is the class {home}.{target.__qualname__}, defined "
                f"outside the modules a file may name: refused. {allow}"
            )
        if not issubclass(target, classes):
            raise UntrustedCheckpointError(
                f"{self.path}: {where} names {name}, a class that is not a {expected}, the type declared there: refused"
            )
        return target

    def _count(self, where: str, depth: int) -> None:
        self.values += 1
        if depth > MAX_DEPTH:
            raise UntrustedCheckpointError(f"{self.path}: {where} is nested deeper than {MAX_DEPTH} levels: refused")
        if self.values > MAX_VALUES:
            raise UntrustedCheckpointError(
                f"{self.path}: its arguments hold more than {MAX_VALUES:,} values (at {where}): refused"
            )


def _parameters(target: Any) -> dict[str, inspect.Parameter]:
    """The constructor parameters of class ``target`` with their annotations resolved (self left out).

    An annotation that does not resolve stays a string, which :func:`_declared` reads as plain data.
    """
    init = target.__init__ if inspect.isclass(target) else target
    try:
        parameters = dict(inspect.signature(init).parameters)
    except (TypeError, ValueError):
        return {}
    if inspect.isclass(target) and parameters:
        parameters.pop(next(iter(parameters)), None)  # self
    if inspect.isclass(target) and any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        # **kwargs passed on to a base class (a user's task module on TrainingModule): the base declares them
        for base in target.__mro__[1:]:
            if "__init__" in vars(base) and base is not object:
                inherited = _parameters(base) if base.__init__ is not target.__init__ else {}
                parameters |= {name: p for name, p in inherited.items() if name not in parameters}
    # Annotations written as strings resolve in the defining module, with typing's and collections.abc's
    # names for those a module imports only for type checkers.
    namespace = dict(vars(typing))
    namespace |= {k: v for k, v in vars(abc).items() if not k.startswith("_")}
    namespace["Tensor"] = torch.Tensor
    namespace |= getattr(inspect.unwrap(init), "__globals__", {})
    for name, parameter in parameters.items():
        if parameter.annotation is not inspect.Parameter.empty:
            parameters[name] = parameter.replace(annotation=_resolved(parameter.annotation, namespace))
    return parameters


def _resolved(annotation: Any, namespace: dict[str, Any]) -> Any:
    """``annotation`` with its strings and forward references evaluated; :class:`Unresolved` where one fails."""
    if isinstance(annotation, str | typing.ForwardRef):
        text = annotation if isinstance(annotation, str) else annotation.__forward_arg__
        try:
            return _resolved(eval(text, namespace), namespace)
        except Exception:
            return Unresolved(text)
    arguments = typing.get_args(annotation)
    if not arguments:
        return annotation
    if typing.get_origin(annotation) is abc.Callable:  # only what it returns decides the position
        return abc.Callable[..., _resolved(arguments[-1], namespace)]
    inner = tuple(
        [_resolved(a, namespace) for a in argument] if isinstance(argument, list) else _resolved(argument, namespace)
        for argument in arguments
    )
    if all(a is b for a, b in zip(inner, arguments, strict=True)):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.Union[inner]  # noqa: UP007 - built from a tuple
    try:
        return annotation.copy_with(inner)
    except Exception:
        return Unresolved(str(annotation))


class Unresolved(str):
    """An annotation string that does not resolve: no class spec and no dotted name may be given there."""


def _declared(annotation: Any) -> tuple[tuple[type, ...], bool]:
    """``(classes a class spec may name, whether a function may be named)`` at a position of type ``annotation``."""
    if annotation is inspect.Parameter.empty or annotation is Any or annotation is object:
        return (), False
    if isinstance(annotation, Unresolved):  # the type is unknown here: a name there must at least be a class
        return (object,), False
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        found = [_declared(argument) for argument in arguments]
        return tuple(dict.fromkeys(c for classes, _ in found for c in classes)), any(f for _, f in found)
    if origin is abc.Callable:
        returned = arguments[-1] if arguments else None
        classes = _declared(returned)[0] if returned is not None else ()
        return (classes, False) if classes else ((), True)
    if origin is type:  # a class itself, not built: jsonargparse imports it from its dotted path
        return _declared(arguments[0]) if arguments else ((), True)
    if origin is typing.Literal:
        return (), False
    if origin in _LISTS or origin in _MAPPINGS:
        found = [_declared(argument) for argument in arguments if argument is not Ellipsis]
        return tuple(dict.fromkeys(c for classes, _ in found for c in classes)), any(f for _, f in found)
    if origin is not None:  # another generic (typing.Annotated, a user generic): its origin decides
        return _declared(origin)
    if annotation is abc.Callable or annotation is typing.Callable:
        return (), True
    if not inspect.isclass(annotation) or issubclass(annotation, _PLAIN_TYPES) or issubclass(annotation, enum.Enum):
        return (), False
    if annotation in _LISTS or annotation in _MAPPINGS:
        return (), False
    return (annotation,), False


def _takes_text(annotation: Any) -> bool:
    """Whether a string is a value of ``annotation`` itself (``str``, a ``Literal`` of strings, a path)."""
    if isinstance(annotation, Unresolved) or annotation in (str, Path, torch.device):
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_takes_text(argument) for argument in typing.get_args(annotation))
    return False


def _training_only(parameter: inspect.Parameter) -> bool:
    """Whether a parameter builds only what training uses (an optimizer, a schedule) and has a default."""
    if parameter.default is inspect.Parameter.empty:
        return False
    classes, _ = _declared(parameter.annotation)
    schedules = (torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)
    schedules += (torch.optim.lr_scheduler.ReduceLROnPlateau,)
    return bool(classes) and all(issubclass(c, schedules) for c in classes)


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def _qualified(target: Any) -> str:
    return f"{_defined_in(target)}.{_name_of(target)}"


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _what(target: Any) -> str:
    if inspect.ismodule(target):
        return f"the module {target.__name__}"
    kind = "function" if callable(target) else type(target).__name__
    return f"the {kind} {_qualified(target)}"


def trusted_by_arguments(args: Sequence[str]) -> tuple[str, ...]:
    """The modules the user vouches for on a command line: ``--trust a,b``, the modules of every class or
    callable the arguments name themselves (``--model.init_args.net=my_lab.Net``), and those the ``--config``
    files name: a config is code, whoever wrote it (docs/trust.md)."""
    modules: set[str] = set()
    previous = None
    for arg in args:
        flag, _, value = arg.partition("=") if arg.startswith("--") else (previous, "", arg)
        previous = arg if arg.startswith("--") and "=" not in arg else None
        if not value:
            continue
        if flag in ("--config", "-c"):
            modules |= set(trusted_by_config_files([value]))
            continue
        if flag == "--trust":
            modules |= set(trusted_modules(value))
            continue
        modules |= {name.rpartition(".")[0] for _, name, _ in _names(value, str(flag), 0, "the command line")}
    return tuple(sorted(module for module in modules if module))


def trusted_by_config_files(files: Sequence[str | Path] | None = None) -> tuple[str, ...]:
    """The modules named by config files (by default the project's own, ``configs/**/*.yaml``): a config is code,
    and a checkpoint may name what the configs of the command name."""
    modules: set[str] = set()
    for config in sorted(Path("configs").glob("**/*.yaml")) if files is None else map(Path, files):
        try:
            tree = yaml.safe_load(config.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError, UntrustedCheckpointError):
            continue  # not a config this can read (the parser names what is wrong with it)
        modules |= {name.rpartition(".")[0] for _, name, _ in _names(tree, "config", 0, config)}
    return tuple(sorted(module for module in modules if module))


def checkpoint_arguments(
    checkpoint: dict[str, Any], path: str | Path = "checkpoint", trust: Sequence[str] = ()
) -> dict[str, Any]:
    """What a loading command parses of a checked checkpoint: the model's and the DataModule's arguments,
    less every argument that builds only what training uses (an optimizer, a learning-rate schedule).

    A loading command, ``--ckpt_path`` and resume never parse nor build the checkpoint's
    optimizer or schedule: inference has no use for them, and a resumed fit takes them from the
    user's own config (:func:`engine.checkpoints.check_optimizer_continues` compares the names only).
    """
    parsed = {}
    for key, base in _argument_bases():
        arguments = checkpoint.get(key)
        if isinstance(arguments, dict) and isinstance(arguments.get("_class_path"), str):
            target = Positions(path, trust).resolve(arguments["_class_path"], (base,), f"{key}._class_path")
            parameters = _parameters(target)
            arguments = {k: v for k, v in arguments.items() if not (k in parameters and _training_only(parameters[k]))}
        parsed[key] = arguments
    return parsed


def _names(
    tree: Any, where: str, depth: int, path: str | Path, budget: list[int] | None = None
) -> Iterator[tuple[str, str, bool]]:
    """``(key path, name, is a class_path)`` for every string of ``tree`` that jsonargparse could import."""
    budget = [MAX_VALUES] if budget is None else budget
    budget[0] -= 1
    if depth > MAX_DEPTH or budget[0] < 0:
        raise UntrustedCheckpointError(
            f"{path}: {where} is nested deeper than {MAX_DEPTH} levels or holds more "
            f"than {MAX_VALUES:,} values: refused"
        )
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
                yield from _names(value, inner, depth + 1, path, budget)
    elif isinstance(tree, list | tuple):
        for index, item in enumerate(tree):
            yield from _names(item, f"{where}[{index}]", depth + 1, path, budget)
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
                yield from _names(parsed, f"{where}<yaml>", depth + 1, path, budget)


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
