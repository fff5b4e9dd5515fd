"""Answers are data: cookiecutter must not evaluate Jinja that an answer carries.

Cookiecutter renders every value of the context as a Jinja template before any hook runs
(``cookiecutter.prompt.render_variable``): that is how ``project_slug``'s default follows
``project_name``. An answer given on the command line or in a user config goes through the same
call, so ``description={{ 7*7 }}`` would bake ``49``, and an expression reaching Python objects
would run code before ``hooks/pre_gen_project.py`` could look at it. (An answer typed at a prompt is
not rendered.)

:class:`AnswersAreData` sees every source cookiecutter renders from a string. A source with Jinja
syntax is rendered only if the template itself declares it: a value of ``cookiecutter.json``, the
text of a file in ``hooks/``, or a path of the template (whose only Jinja is ``{{cookiecutter.<name>}}``).
Anything else is an answer with template syntax: the bake stops, in one line naming the text, before
anything is written.
"""

import json
import re
import sys
from pathlib import Path

from cookiecutter.exceptions import FailedHookException
from jinja2.ext import Extension

ROOT = Path(__file__).resolve().parent
SYNTAX = re.compile(r"\{\{|\{%|\{#")
PATH_SUBSTITUTION = re.compile(r"\{\{\s*cookiecutter\.\w+\s*\}\}")


def _strings(value: object) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(_strings(k) | _strings(v) for k, v in value.items())) if value else set()
    if isinstance(value, list):
        return set().union(*map(_strings, value)) if value else set()
    return set()


def declared_sources() -> set[str]:
    """The template's own strings with Jinja in them: cookiecutter.json's values and the hooks' texts.

    Read from this checkout and from every template checkout on ``sys.path`` (cookiecutter and cruft
    put the one they render there; ``cruft update`` renders two releases, whose hooks may differ).
    """
    roots = {ROOT, *(Path(entry) for entry in sys.path if entry and (Path(entry) / "cookiecutter.json").is_file())}
    declared: set[str] = set()
    for root in roots:
        declared |= _strings(json.loads((root / "cookiecutter.json").read_text(encoding="utf-8")))
        declared |= {hook.read_text(encoding="utf-8") for hook in (root / "hooks").glob("*.py")}
    return {source for source in declared if SYNTAX.search(source)}


class AnswersAreData(Extension):
    """Refuse to render a string source with Jinja syntax that the template does not declare (module docstring)."""

    def __init__(self, environment) -> None:
        super().__init__(environment)
        self.declared = declared_sources()

    def preprocess(self, source: str, name: str | None, filename: str | None = None) -> str:
        if name is not None or filename is not None or not SYNTAX.search(source) or source in self.declared:
            return source  # a template file (rendered by name), plain text, or the template's own
        if not SYNTAX.search(PATH_SUBSTITUTION.sub("", source)):
            return source  # a path of the template: {{cookiecutter.<name>}} substitutions only
        shown = source if len(source) <= 80 else source[:77] + "..."
        raise FailedHookException(
            f"An answer holds template syntax ({shown!r}): answers are data, and cookiecutter would evaluate it. "
            "Give the text without '{{', '{%' or '{#'."
        )
