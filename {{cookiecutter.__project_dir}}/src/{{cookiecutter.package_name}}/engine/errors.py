"""User errors: a mistake the user can fix ends in one message and exit status 2, never a traceback.

Raise a :class:`UserError` subclass for anything caused by the user's input (a config value or
file, a data path or file, a checkpoint, a launch that does not match the config), with a message
that names the file or field and the fix. :func:`exit_on_user_error` (wrapped around every entry
point) prints it as ``error: <message>`` and exits 2, like an argparse error. Any other exception
is a bug and keeps its traceback.

Each subclass also derives from the built-in exception its callers would expect (``ValueError``
for a bad value, ``FileNotFoundError`` for a missing file), so ``except ValueError`` still works.
"""

import itertools
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException


class UserError(Exception):
    """A mistake in the user's input; the message names the file or field and how to fix it."""


class ConfigError(UserError, ValueError):
    """A config value or config file that cannot work (``--trainer.*``, ``--model.*``, ``--data.*``, YAML)."""


class DataError(UserError, ValueError):
    """Data the DataModule cannot use: an unreadable file, an empty folder, a table without rows."""


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the user named (a data path, a checkpoint) does not exist."""


class LaunchError(UserError, RuntimeError):
    """The processes started (srun, torchrun) do not match what the config asks for."""


def check_config_files(args: Sequence[str]) -> None:
    """Parse every ``--config`` file of ``args`` as YAML first, so a syntax error names its file.

    jsonargparse reports a YAML error as ``in "<unicode string>", line 2`` without the file's name.

    Raises:
        ConfigError: a ``--config`` file that is not valid YAML, with its path, line and column.
    """
    paths = [value for flag, value in itertools.pairwise(args) if flag == "--config"]
    paths += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    for path in map(Path, paths):
        if not path.is_file():
            continue  # jsonargparse names a missing file itself
        try:
            yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(error, "problem", None) or str(error)
            raise ConfigError(
                f"{path}: not valid YAML{where}: {problem}. Fix that line (lists are [a, b], maps are key: value)."
            ) from None


def readable_parser_message(message: str) -> str:
    """jsonargparse's message for a class that refused its config values, without its type-union noise.

    A ``--model`` or ``--data`` class is validated by building it; when its constructor raises,
    jsonargparse lists that error among the failures of every other type the option accepts
    (``Expected a <class 'NoneType'>``, the whole given Namespace). Only the constructor's own
    message is the user's business.
    """
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    reasons = [
        line.removeprefix("  - ")
        for line in message.splitlines()
        if line.startswith("  - ") and not line.startswith("  - Expected a <class 'NoneType'>")
    ]
    return "\n".join(reasons) or message


@contextmanager
def exit_on_user_error(program: str = "error") -> Iterator[None]:
    """Turn a :class:`UserError` (or Lightning's MisconfigurationException) into one line on stderr and exit 2."""
    try:
        yield
    except (UserError, MisconfigurationException) as error:
        print(f"{program}: {str(error).strip()}", file=sys.stderr)
        raise SystemExit(2) from error  # the error stays reachable (``__cause__``) for tests and callers
