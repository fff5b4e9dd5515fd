"""Every reference a bake's text makes resolves in that bake: each sentence true in every combination of answers.

Not a list of names an answer prunes (``pruned_names_left``), but a rule over every file: a ``make <target>``
written as code names a target of the bake's Makefile; a repository path (``configs/...``, ``docs/...``,
``scripts/...``, ``src/...``, ``tests/...``, ``evals/...``) exists; a dotted name rooted in the bake's package
(``engine.callbacks.PredictionWriter``, ``serving.api``, ``<package>.data.digits.DigitsDataModule``) names a module,
and a class, function or assignment in it, that the bake holds; a ``--model.init_args.x``, ``--data.init_args.x``,
``--model.init_args.net.init_args.x`` or ``--trainer.x`` option names an ``__init__`` argument of a class of the bake
at that position (its models, its DataModules, its nets) or of Lightning's ``Trainer``.
"""

import ast
import inspect
import re
from functools import cache
from pathlib import Path

# Inline code: `...` or ``...`` (Markdown, docstrings, comments), and Sphinx roles (:mod:`...`).
CODE_SPAN = re.compile(r"(`+)([^`\n]+?)\1")
# A command line: in a code span, in a fenced block or a recipe, or after a shell prompt.
MAKE = re.compile(r"(?:^|[;&|]\s*|\$ )make ((?:[a-z][\w-]*)(?:\s*/\s*[a-z][\w-]*)*)")
# A path of this repository; one that goes on with a backslash is part of a regular expression.
PATH = re.compile(r"(?<![\w./~$-])((?:configs|docs|scripts|src|tests|evals)/[\w./-]*\w)(?![\w\\])")
# "the template's docs/a.md, docs/b.py": paths of the template repository, not of the bake.
THE_TEMPLATES = re.compile(r"template's (?:[`\s,]|and |(?:configs|docs|scripts|src|tests|evals)/[\w./-]*)*$")
# A bare file name (`transfer-learning.yaml`, "a sweep's best.yaml"): a file of the bake, or one its code names.
# Read in the text users read (Markdown, configs, src/); tests name files they make. Lightning's loggers write
# hparams.yaml themselves.
FILE_NAME = re.compile(r"(?<![\w./<{-])([A-Za-z_][\w-]*\.(?:yaml|py|md|sbatch))(?![\w/])")
WRITTEN_BY_LIGHTNING = {"hparams.yaml"}
# A section named as a place to read: (see "Use a trained model") in the same file, or (see docs/shipping.md,
# "Ship a trained model") in another.
SECTION = re.compile(r"\bsee (?:`?([\w/.-]+\.md)`?,? )?\"([^\"]+)\"")
PACKAGES = ("engine", "data", "models", "nets", "serving", "commands")
# A CLI option into a config position: --trainer.max_epochs, --model.init_args.net.init_args.n_layer.
OPTION = re.compile(r"(?<![\w-])--((?:model|data|trainer)\.[\w.]*\w)")
# The classes that may stand at a position the bake's own code fills, by the modules that define them.
POSITIONS = {"model": ("models", "engine/module.py"), "data": ("data", "engine/datamodule.py"), "net": ("nets",)}
TEXT_SUFFIXES = {".md", ".py", ".yaml", ".yml", ".toml", ".sbatch", ".sh", ".cfg", ".txt", ".jsonl"}


def false_references(project: Path) -> list[str]:
    """``file:line: what`` for each reference of the bake's text that does not resolve in the bake."""
    package = next(path.name for path in (project / "src").iterdir() if (path / "__init__.py").is_file())
    targets = make_targets(project / "Makefile")
    files = _file_names(project)
    found = []
    for path in sorted(project.rglob("*")):
        if not path.is_file() or ".git" in path.parts or not (path.suffix in TEXT_SUFFIXES or path.name == "Makefile"):
            continue
        relative = path.relative_to(project)
        script = path.suffix not in (".md", ".py")  # a Makefile, a shell script: every line but a comment is a command
        fenced, previous = False, ""
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if path.suffix == ".md" and line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            command_line = fenced or (script and not line.lstrip().startswith("#"))
            commands = [line] if command_line else [span for _, span in CODE_SPAN.findall(line)]
            if path.suffix == ".py":  # a comment or docstring line that is a shell command
                commands += [line.strip().removeprefix("# ")] if line.strip().startswith(("make ", "# make ")) else []
            for command in commands:
                for match in MAKE.finditer(command.strip()):
                    for target in re.split(r"\s*/\s*", match.group(1)):
                        if target not in targets:
                            found.append(f"{relative}:{number}: make {target} (no such target in the Makefile)")
            # The line before's end too: "the template's" may end it, a wrapped sentence going on here.
            context = f"{previous[-60:]} {line}" if previous else line
            previous = line
            for named in _paths(context, len(line)):
                if not (project / named).exists() and not _generated(named):
                    found.append(f"{relative}:{number}: {named} (no such file or folder)")
            for name in FILE_NAME.findall(line) if relative.parts[0] not in ("tests", "pyproject.toml") else ():
                if name not in files:
                    found.append(f"{relative}:{number}: {name} (no such file in the bake, nor named by its code)")
            for where, section in SECTION.findall(line):
                if section not in _sections(project / where if where else path):
                    place = where or relative.name
                    found.append(f'{relative}:{number}: see "{section}" (no such section in {place})')
            for option in OPTION.findall(line) if relative.parts[0] != "tests" else ():  # tests try bad ones
                problem = unknown_option(project / "src" / package, option)
                if problem:
                    found.append(f"{relative}:{number}: --{option} ({problem})")
            for _, span in CODE_SPAN.findall(line):
                for name in re.findall(r"[\w.]+", span):
                    problem = unresolved(project / "src" / package, package, name)
                    if problem:
                        found.append(f"{relative}:{number}: {name} ({problem})")
    return found


def _file_names(project: Path) -> set[str]:
    """The names of the bake's files, and every file name a string of its code or its Makefile holds (the
    files a run writes or reads: ``best.yaml``, ``test_metrics.json``)."""
    names = {path.name for path in project.rglob("*") if path.is_file()} | WRITTEN_BY_LIGHTNING
    for path in [*project.glob("src/**/*.py"), *project.glob("scripts/**/*.py"), project / "Makefile"]:
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            documents = {  # a docstring is text about files, not code that writes or reads them
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.body
                and isinstance(node.body[0], ast.Expr)
            }
            strings = [
                node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in documents
            ]
            names |= {name for text in strings if isinstance(text, str) for name in FILE_NAME.findall(text)}
        else:
            names |= set(FILE_NAME.findall(path.read_text()))
    return names


def _sections(path: Path) -> set[str]:
    """The headings of a Markdown file (none if there is no such file), without their ``#`` marks."""
    lines = path.read_text().splitlines() if path.is_file() else []
    return {line.lstrip("#").strip() for line in lines if line.startswith("#")}


def _paths(text: str, tail: int) -> list[str]:
    """The repository paths that start within the last ``tail`` characters of ``text``."""
    return [
        match.group(1)
        for match in PATH.finditer(text)
        if match.start(1) >= len(text) - tail and not THE_TEMPLATES.search(text[: match.start(1)])
    ]


def make_targets(makefile: Path) -> set[str]:
    """The targets a Makefile defines (``name:`` at a line's start, ``.PHONY`` aside)."""
    return {
        target
        for line in makefile.read_text().splitlines()
        if (match := re.match(r"([\w][\w -]*):(?!=)", line))
        for target in match.group(1).split()
    }


def _generated(path: str) -> bool:
    """Paths that runs write, not the bake: what ``make install``, ``make lock`` and tests create."""
    return path.endswith((".lock", ".egg-info")) or "__pycache__" in path


def unresolved(source: Path, package: str, name: str) -> str | None:
    """Why the dotted ``name`` does not resolve in the package at ``source``; None when it does, or when it
    is not a name of the package (``trainer.max_epochs``, ``torch.nn.Module``, ``data.batch_size``)."""
    parts = name.strip(".").split(".")
    if parts[0] == package:
        parts = parts[1:]
    elif parts[0] == "src" or parts[0] not in PACKAGES or len(parts) < 2:
        return None
    if not parts or parts[0] not in PACKAGES:
        return None
    if parts[0] == "data" and not (source / "data" / f"{parts[1]}.py").exists() and not parts[1][:1].isupper():
        return None  # a config key (`data.batch_size`), not a module
    folder = source
    for at, part in enumerate(parts):
        if (folder / part).is_dir() and (folder / part / "__init__.py").exists():
            folder = folder / part
            continue
        module = folder / f"{part}.py"
        if module.is_file():
            rest = parts[at + 1 :]
            return _in_module(module, rest) if rest else None
        return _in_module(folder / "__init__.py", parts[at:])
    return None


def unknown_option(source: Path, option: str) -> str | None:
    """Why ``option`` (``model.init_args.net.init_args.n_layer``) names no argument at its position; None when
    it does, or when the position holds a class of another library (an optimizer, a logger, a callback)."""
    parts = option.split(".")
    if parts[0] == "trainer":
        return None if parts[1] in _trainer_arguments() else f"Lightning's Trainer takes no {parts[1]}"
    if "init_args" not in parts:
        return None  # --data.class_path=..., a whole class given in one value
    at = len(parts) - 1 - parts[::-1].index("init_args")
    position, argument = parts[at - 1], parts[at + 1] if at + 1 < len(parts) else None
    if position not in POSITIONS or argument is None:
        return None
    arguments = set().union(*(_init_arguments(path) for path in _modules(source, POSITIONS[position])))
    return None if argument in arguments else f"no {position} class of this bake takes {argument}"


@cache
def _trainer_arguments() -> set[str]:
    import lightning

    return set(inspect.signature(lightning.Trainer.__init__).parameters)


def _modules(source: Path, places: tuple[str, ...]) -> list[Path]:
    return [
        path
        for place in places
        for path in ([source / place] if place.endswith(".py") else (source / place).rglob("*.py"))
        if path.is_file()
    ]


@cache
def _init_arguments(module: Path) -> set[str]:
    """The argument names of every ``__init__`` of every class the module defines."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.ClassDef):
            for inner in node.body:
                if isinstance(inner, ast.FunctionDef) and inner.name == "__init__":
                    arguments = inner.args
                    names |= {arg.arg for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    return names


def _in_module(module: Path, names: list[str]) -> str | None:
    defined = _definitions(module)
    if names[0] not in defined:
        return f"{names[0]} is not defined in {module.name}"
    body = defined[names[0]]
    if len(names) > 1 and body is not None and names[1] not in body:
        return f"{names[0]} has no {names[1]}"
    return None


@cache
def _definitions(module: Path) -> dict[str, set[str] | None]:
    """The module's top-level names; for a class, the names its body and its methods (``self.x = ...``) define."""
    tree = ast.parse(module.read_text())
    names: dict[str, set[str] | None] = {}
    nodes = list(tree.body)
    for node in nodes:
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` imports, an optional dependency's fallback
            handlers = [inner for handler in getattr(node, "handlers", []) for inner in handler.body]
            nodes += node.body + getattr(node, "orelse", []) + handlers
        if isinstance(node, ast.ClassDef):
            members = {
                target.attr
                for inner in ast.walk(node)
                if isinstance(inner, (ast.Assign, ast.AnnAssign))
                for target in (inner.targets if isinstance(inner, ast.Assign) else [inner.target])
                if isinstance(target, ast.Attribute)
            }
            for inner in node.body:
                if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    members.add(inner.name)
                elif isinstance(inner, ast.AnnAssign) and isinstance(inner.target, ast.Name):
                    members.add(inner.target.id)
                elif isinstance(inner, ast.Assign):
                    members |= {target.id for target in inner.targets if isinstance(target, ast.Name)}
            # A base class from elsewhere may define more: only a class with no bases is checked member by member.
            names[node.name] = members if not node.bases else None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(alias.asname or alias.name).split(".")[0]: None for alias in node.names})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update({target.id: None for target in targets if isinstance(target, ast.Name)})
            if any(isinstance(target, ast.Name) and target.id == "__all__" for target in targets) and node.value:
                exported = ast.literal_eval(node.value)  # the names a module's __getattr__ imports on demand
                names.update({name: None for name in exported if name not in names})
    return names
