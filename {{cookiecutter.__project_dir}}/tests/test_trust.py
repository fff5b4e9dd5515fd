"""A checkpoint is data: every command that loads one refuses a name outside the trust rule before importing it.

Each hostile form below names a planted module that leaves a marker file when imported (a
``labtools.py`` beside the project, as ``python -m`` would find it). Every loading command of this
bake gets every form: it must exit 2 with one line naming the key and the name, and the module must
never be imported (``engine/trust.py``).
"""

import contextlib
import importlib.util
{%- if cookiecutter.use_pretrained == "yes" and cookiecutter.task == "image-classification" %}
import json
{%- endif %}
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import {{ "ROOT, " if cookiecutter.use_serving == "yes" else "" }}shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.commands.predict import main as predict_main
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.engine.trust import Positions, UntrustedCheckpointError, check_checkpoint

Checkpoint = dict[str, Any]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder of one shrunk epoch (its checkpoints/last.ckpt is a real checkpoint of this bake)."""
    folder = tmp_path_factory.mktemp("trust")
    main(["fit", *shrunk_args(folder), "--test_after_fit=false"])
    return folder


def last_checkpoint(folder: Path) -> Path:
    (path,) = folder.rglob("last.ckpt")
    return path


def _net(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["hyper_parameters"]["net"] = {"class_path": f"{module}.Net"}
        return f"hyper_parameters.net.class_path names {module}.Net"

    return plant


def _legacy(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        net = {"class_path": f"{module}.Net"}
        checkpoint["hparams"] = {"net": net}  # Lightning merges it into the arguments
        return "legacy key 'hparams'"

    return plant


def _bare_string(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["hyper_parameters"]["net"] = f"{module}.Net"  # jsonargparse reads it as a class path
        return f"hyper_parameters.net names {module}.Net"

    return plant


def _yaml_string(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["hyper_parameters"]["net"] = "{class_path: " + module + ".Net}"  # parsed as YAML
        return rf"hyper_parameters.net<yaml>.class_path names {module}.Net"

    return plant


def _callable_argument(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        # An allowed class of the declared type (an nn.Module), a callable by name in its arguments.
        arguments = {"d_model": 8, "nhead": 2, "activation": f"{module}.f"}
        layer = {"class_path": "torch.nn.TransformerEncoderLayer", "init_args": arguments}
        checkpoint["hyper_parameters"]["net"] = layer
        return f"hyper_parameters.net.init_args.activation names {module}.f, outside the modules"

    return plant


def _averaged_model(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        net = checkpoint["hyper_parameters"]["net"]
        checkpoint["hyper_parameters"]["net"] = {
            "class_path": "torch.optim.swa_utils.AveragedModel",
            "init_args": {"model": net, "avg_fn": f"{module}.f"},
        }
        return f"hyper_parameters.net.init_args.avg_fn names {module}.f, outside the modules"

    return plant


def _list_element(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        modules = [{"class_path": "torch.nn.Identity"}, {"class_path": f"{module}.Net"}]
        arguments = {"modules": modules}
        checkpoint["hyper_parameters"]["net"] = {"class_path": "torch.nn.ModuleList", "init_args": arguments}
        return rf"hyper_parameters.net.init_args.modules\[1\].class_path names {module}.Net"

    return plant


def _datamodule(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["datamodule_hyper_parameters"]["_class_path"] = f"{module}.Data"
        return f"datamodule_hyper_parameters._class_path names {module}.Data"

    return plant


def _instantiator(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["hyper_parameters"]["_instantiator"] = f"{module}.build"
        return f"hyper_parameters._instantiator is '{module}.build', not Lightning's own"

    return plant


def _non_ascii_name(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        checkpoint["hyper_parameters"]["net"] = f"{module}.Évil"  # imported before Évil is looked up
        return f"hyper_parameters.net names {module}.Évil"

    return plant


def _config_file(module: str, relative: bool) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        # A path where a class is expected: jsonargparse reads the file as a config and imports what it names.
        folder = Path(importlib.util.find_spec(module).origin).parent  # finding runs none of the module
        config = folder / "evilnet.yaml"
        config.write_text(f"class_path: {module}.Net\n")
        named = os.path.relpath(config) if relative else str(config)
        checkpoint["hyper_parameters"]["net"] = named
        # Refused when the parser would read it; where it does not read it (generate's parser), it is
        # refused as a class path that is none. Either way the key and the path are named.
        return rf"net\b.*{re.escape(named)}"

    return plant


def _through_a_trusted_prefix(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        # The project's package, walked through to a function of another module: it is os.getcwd.
        checkpoint["hyper_parameters"]["net"] = {"class_path": "{{ cookiecutter.package_name }}.engine.trust.os.getcwd"}
        return r"net.class_path names {{ cookiecutter.package_name }}\.engine\.trust\.os\.getcwd, which is the function \w+\.getcwd"

    return plant


def _class_reexported_by_torch_nn(module: str) -> Callable[[Checkpoint], str]:
    def plant(checkpoint: Checkpoint) -> str:
        # A class by a torch.nn name, defined elsewhere (logging): trusted by where it is defined.
        name = "torch.nn.parallel.distributed.logging.FileHandler"
        arguments = {"filename": "x.log"}
        checkpoint["hyper_parameters"]["net"] = {"class_path": name, "init_args": arguments}
        return "net.class_path names torch.nn.parallel.distributed.logging.FileHandler, which is the class"

    return plant


FORMS = {
    "net class_path": _net,
    "legacy hparams key": _legacy,
    "bare string": _bare_string,
    "YAML in a string": _yaml_string,
    "Callable argument of an allowed class": _callable_argument,
    "AveragedModel avg_fn": _averaged_model,
    "list element": _list_element,
    "DataModule class": _datamodule,
    "instantiator": _instantiator,
    "non-ASCII name": _non_ascii_name,
    "config file, absolute path": lambda module: _config_file(module, relative=False),
    "config file, relative path": lambda module: _config_file(module, relative=True),
    "a trusted prefix walked through": _through_a_trusted_prefix,
    "a class re-exported by torch.nn": _class_reexported_by_torch_nn,
}
# The forms the guard catches by itself where the imports and reads happen, with the walk switched off
# (the legacy key and the instantiator are refused by the walk alone: Lightning reads them, not jsonargparse).
# The DataModule's class is not parsed by the CLI, and Lightning 2.6.6 itself refuses one not yet imported.
# A callable's name where a string is declared too (TransformerEncoderLayer's activation) is read as a string.
GUARDED_FORMS = [
    form
    for form in FORMS
    if form not in ("legacy hparams key", "instantiator", "DataModule class", "Callable argument of an allowed class")
]


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> tuple[str, Path]:
    """A module on sys.path that writes ``marker`` when imported: ``(its name, the marker)``."""
    name = f"labtools_{abs(hash(request.node.nodeid)) % 10**8}"
    marker = tmp_path / "imported"
    code = f"open({str(marker)!r}, 'w').close()\nimport torch\nclass Net(torch.nn.Identity): ...\n"
    code += "class Data: ...\ndef f(*args): return 1.0\ndef build(*args): return None\n"
    (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, marker
    sys.modules.pop(name, None)


def hostile_copy(run: Path, tmp_path: Path, form: str, module: str) -> tuple[Path, Path, str]:
    """A copy of ``run`` whose last.ckpt carries ``form``: ``(the copy, its last.ckpt, the expected message)``."""
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    path = last_checkpoint(folder)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    expected = FORMS[form](module)(checkpoint)
    torch.save(checkpoint, path)
    return folder, path, expected


def _load_trained(folder: Path, path: Path) -> None:
    load_trained(path)


def _predict(folder: Path, path: Path) -> None:
    predict_main(["--ckpt", str(path)])
{%- if cookiecutter.use_serving == "yes" %}


def _export(folder: Path, path: Path) -> None:
    pytest.importorskip("onnxruntime", reason="the export extra is not installed")
    from {{ cookiecutter.package_name }}.commands.export import main as export_main

    export_main(["--ckpt", str(path)])


def _serve(folder: Path, path: Path) -> None:
    pytest.importorskip("litserve", reason="the serve extra is not installed")
    from {{ cookiecutter.package_name }}.commands.serve import main as serve_main

    serve_main(["--ckpt", str(path), "--port", "0"])


def _serve_bench(folder: Path, path: Path) -> None:
    pytest.importorskip("litserve", reason="the serve extra is not installed")
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "scripts" / "serve_load.py")
    serve_load = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(serve_load)
    serve_load.main(["--ckpt", str(path)])
{%- endif %}


def _cli(subcommand: str) -> Callable[[Path, Path], None]:
    def run(folder: Path, path: Path) -> None:  # LightningCLI parses the checkpoint's arguments into the config
        main([subcommand, *shrunk_args(folder), f"--ckpt_path={path}"])

    return run


def _resume(folder: Path, path: Path) -> None:  # make resume: the latest run's newest checkpoint
    main(["fit", *shrunk_args(folder), "--trainer.max_epochs=2", "--resume=true"])


COMMANDS = {
    "load_trained": _load_trained,
    "predict": _predict,
{%- if cookiecutter.use_serving == "yes" %}
    "export": _export,
    "serve": _serve,
    "serve-bench": _serve_bench,
{%- endif %}
    "fit --ckpt_path": _cli("fit"),
    "test --ckpt_path": _cli("test"),
    "predict --ckpt_path": _cli("predict"),
    "resume": _resume,
}
{%- if cookiecutter.task == "language-model" %}


def _generate(folder: Path, path: Path) -> None:
    from {{ cookiecutter.package_name }}.commands.generate import main as generate_main

    generate_main(["--ckpt", str(path), "--max_new_tokens", "2"])


COMMANDS["generate"] = _generate
{%- elif cookiecutter.task == "tabular" %}


def _from_checkpoint(folder: Path, path: Path) -> None:
    from {{ cookiecutter.package_name }}.data import TabularDataModule

    TabularDataModule.from_checkpoint(path)  # {{ "the server's and export's" if cookiecutter.use_serving == "yes" else "predict's" }} encoder of raw rows


COMMANDS["TabularDataModule.from_checkpoint"] = _from_checkpoint
{%- endif %}


# Quick: every form through load_trained, every command with one form; the whole matrix is slow.
QUICK_FORM, QUICK_COMMAND = "Callable argument of an allowed class", "load_trained"
CASES = [
    pytest.param(form, command, marks=() if form == QUICK_FORM or command == QUICK_COMMAND else pytest.mark.slow)
    for form in FORMS
    for command in COMMANDS
    # make resume builds the run from its own config, and from_checkpoint builds the DataModule alone:
    # the model's arguments are never parsed there, so a path in them is never read
    # (test_a_run_folders_config_is_data_too covers what resume does parse).
    if not ((command == "resume" or command.endswith(".from_checkpoint")) and form.startswith("config file"))
]


@pytest.mark.parametrize(("form", "command"), CASES)
def test_a_hostile_checkpoint_is_refused_by_every_loading_command_before_any_import(
    trained_run: Path, tmp_path: Path, planted: tuple[str, Path], form: str, command: str
) -> None:
    module, marker = planted
    folder, path, expected = hostile_copy(trained_run, tmp_path, form, module)
    with user_error(expected):
        try:
            COMMANDS[command](folder, path)
        except UntrustedCheckpointError as error:  # load_trained raises; the commands print it and exit 2
            raise SystemExit(2) from error
    assert not marker.exists() and module not in sys.modules, f"{command} imported the planted module ({form})"


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("torch.nn.functional.relu", "which is the function torch.nn.functional.relu, not a class"),  # code
        ("torch.optim.AdamW", "a class that is not a torch.nn.modules.module.Module"),  # a class of another type
        ("os.system", "outside the modules a file may name"),  # a module already imported is still outside
        ("builtins.eval", "outside the modules a file may name"),
        ("{{ cookiecutter.package_name }}.engine.module.adamw", "which is the function"),  # the project's own function
        ("{{ cookiecutter.package_name }}.cli.CLI", "of {{ cookiecutter.package_name }} only .data, .models, .nets and .engine"),
        # The CLI's task-free half: in the engine, and as much never a target.
        ("{{ cookiecutter.package_name }}.engine.training_cli.TrainingCLI", "never .engine.training_cli"),
        # The engine's own tests' toy classes: in the engine's folder, never a target either.
        ("{{ cookiecutter.package_name }}.engine.tests.test_training.Classifier", "never .engine.training_cli or .engine.tests"),
    ],
)
def test_a_checkpoint_may_name_classes_of_the_declared_type_only(trained_run: Path, name: str, refusal: str) -> None:
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["net"] = {"class_path": name}
    with pytest.raises(UntrustedCheckpointError, match=rf"hyper_parameters\.net\.class_path names {name}.*{refusal}"):
        check_checkpoint(checkpoint, "x.ckpt")
    checkpoint["hyper_parameters"]["net"] = {"class_path": "Identity"}  # not a path: refused in one line
    with pytest.raises(UntrustedCheckpointError, match=r"net.class_path is 'Identity', not a full class path"):
        check_checkpoint(checkpoint, "x.ckpt")


def test_strings_that_name_nothing_are_plain_data_and_class_specs_in_them_are_not() -> None:
    positions = Positions("x.ckpt")
    positions.plain(["best.ckpt", "val/loss", "e.g. this: {a: b}", {"data.csv": 1}], "notes")
    with pytest.raises(UntrustedCheckpointError, match=r"notes\[1\] is a string that holds a class spec"):
        positions.plain(["x", "{class_path: os.system}"], "notes")
    with pytest.raises(UntrustedCheckpointError, match=r"notes\.a\.class_path is a class spec where plain data"):
        spec = {"class_path": "torch.nn.Identity"}
        positions.plain({"a": spec}, "notes")


def test_a_trusted_module_is_imported_and_its_class_still_must_be_of_the_declared_type(
    trained_run: Path, tmp_path: Path, planted: tuple[str, Path]
) -> None:
    module, marker = planted
    assert load_trained(last_checkpoint(trained_run)).model is not None  # the project's own names pass
    _, path, _ = hostile_copy(trained_run, tmp_path, "DataModule class", module)
    # Trusted, the module is imported, and its class is refused: not a LightningDataModule.
    with pytest.raises(UntrustedCheckpointError, match=rf"{module}\.Data, a class that is not a .*LightningDataModule"):
        load_trained(path, trust=[module])
    assert marker.exists()


@pytest.mark.slow
def test_python_m_predict_refuses_a_planted_module_beside_the_project_in_one_line(
    trained_run: Path, tmp_path: Path
) -> None:
    # The real situation: `python -m` puts the working folder first on sys.path.
    (tmp_path / "labtools.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    _, path, _ = hostile_copy(trained_run, tmp_path, "Callable argument of an allowed class", "labtools")
    for command in (["predict", "--ckpt", str(path)],{{ ' ["export", "--ckpt", str(path)]' if cookiecutter.use_serving == "yes" else "" }}):
        result = subprocess.run(
            [sys.executable, "-m", f"{{ cookiecutter.package_name }}.commands.{command[0]}", *command[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2, result.stderr[-2000:]
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "activation names labtools.f" in lines[0] and "--trust labtools" in lines[0], lines
        assert not (tmp_path / "imported").exists()


def _without_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Switch check_checkpoint off everywhere it is called: only the guard of engine.import_guard.loading is left."""
    import {{ cookiecutter.package_name }}.engine.inference as inference
    import {{ cookiecutter.package_name }}.engine.training_cli as training_cli

    for where in (training_cli, inference):
        monkeypatch.setattr(where, "check_checkpoint", lambda *args, **kwargs: None)


# Quick through load_trained (every command but the CLI's loads that way); the CLI's parse is slow.
GUARD_COMMANDS = [
    pytest.param(command, marks=() if command == "load_trained" else pytest.mark.slow)
    for command in ("load_trained", "test --ckpt_path", "fit --ckpt_path")
]


@pytest.mark.parametrize("command", GUARD_COMMANDS)
@pytest.mark.parametrize("form", GUARDED_FORMS)
def test_the_guard_alone_refuses_every_form_where_the_import_happens(
    trained_run: Path,
    tmp_path: Path,
    planted: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    form: str,
    command: str,
) -> None:
    # Fails with engine.import_guard.loading replaced by a no-op: each form then imports the planted module
    # (or, for the resolved names, runs sys.exit / builds a logging.FileHandler).
    module, marker = planted
    folder, path, _ = hostile_copy(trained_run, tmp_path, form, module)
    _without_the_walk(monkeypatch)
    with user_error("does not allow: refused before importing or reading it"):
        try:
            COMMANDS[command](folder, path)
        except UntrustedCheckpointError as error:
            raise SystemExit(2) from error
    assert not marker.exists() and module not in sys.modules, f"{command} imported the planted module ({form})"


def _hostile_value(rng: random.Random, module: str, folder: Path) -> Any:
    """One of the ways a value can name the planted module, chosen by ``rng``."""
    name = rng.choice(["Net", "Ñet", "f", "Évil", "sub.Net"])
    config = folder / f"form{rng.randrange(10**6)}.yaml"
    config.write_text(f"class_path: {module}.Net\n")
    forms = [
        f"{module}.{name}",
        {"class_path": f"{module}.{name}", "init_args": dict()},
        "{class_path: " + f"{module}.{name}" + "}",
        [rng.choice([1, "x", None]), f"{module}.{name}"],
        str(config),
        os.path.relpath(config),
        {"class_path": "torch.optim.lr_scheduler.LambdaLR", "init_args": dict(lr_lambda=f"{module}.{name}")},
    ]
    return rng.choice(forms)


def _plant_at_random(rng: random.Random, checkpoint: Checkpoint, value: Any) -> tuple[str, Any]:
    """Put ``value`` under an existing or a new key of a random depth; returns the key path and the value
    it replaced (None for a new key)."""
    key = rng.choice(["hyper_parameters", "datamodule_hyper_parameters"])
    tree, where = checkpoint[key], key
    for _ in range(rng.randrange(3)):  # descend into the config where it is a dict
        inner = [k for k, v in tree.items() if isinstance(v, dict) and not k.startswith("_")]
        if not inner:
            break
        chosen = rng.choice(inner)
        tree, where = tree[chosen], f"{where}.{chosen}"
    existing = [k for k in tree if not k.startswith("_")]
    leaf = rng.choice([*existing, "class_path", "init_args", "extra", "dict_kwargs"])
    replaced, tree[leaf] = tree.get(leaf), value
    return f"{where}.{leaf}", replaced


@pytest.mark.parametrize("seed", range(12))
def test_generated_forms_never_import_the_planted_module(
    trained_run: Path, tmp_path: Path, planted: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    # Forms nobody listed: the planted name at random keys and depths, in random shapes, with the
    # walk on and then off (the guard alone). The load fails, and nothing of the module runs.
    module, marker = planted
    rng = random.Random(seed)
    folder = Path(importlib.util.find_spec(module).origin).parent
    path = tmp_path / "generated.ckpt"
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    value = _hostile_value(rng, module, folder)
    where, replaced = _plant_at_random(rng, checkpoint, value)
    torch.save(checkpoint, path)
    # A string in place of a string (an encoding, a name) may be refused, or load as text never imported.
    may_load = isinstance(value, str) and isinstance(replaced, str)
    # An optimizer or a schedule is never read by a loading command (engine.trust.checkpoint_arguments).
    may_load |= where.startswith(("hyper_parameters.optimizer", "hyper_parameters.lr_scheduler"))

    def refused():  # any refusal; jsonargparse may refuse the key first
        return contextlib.suppress(Exception) if may_load else pytest.raises(Exception)

    with refused():
        load_trained(path)
    assert not marker.exists(), f"imported through {where}"
    _without_the_walk(monkeypatch)
    with refused():
        load_trained(path)
    assert not marker.exists() and module not in sys.modules, f"imported through {where} with the guard alone"


def test_formatting_an_error_imports_nothing_the_input_names(
    trained_run: Path, tmp_path: Path, planted: tuple[str, Path]
) -> None:
    # jsonargparse's message quotes the value; the formatter once imported the module it saw there.
    module, marker = planted
    folder, path, _ = hostile_copy(trained_run, tmp_path, "net class_path", module)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["net"] = last_checkpoint_net(trained_run)
    checkpoint["hyper_parameters"]["compile"] = f"module '{module}' has no attribute 'x'"  # a bool, in the message
    torch.save(checkpoint, path)
    with pytest.raises(SystemExit) as exit_info:
        COMMANDS["test --ckpt_path"](folder, path)
    assert exit_info.value.code == 2
    # make predict: one line naming the file and the key, not jsonargparse's traceback.
    with user_error(rf"^{re.escape(str(path))}: its saved arguments do not build \(.*compile"):
        COMMANDS["predict"](folder, path)
    assert not marker.exists() and module not in sys.modules


def last_checkpoint_net(run: Path) -> Any:
    return torch.load(last_checkpoint(run), map_location="cpu", weights_only=True)["hyper_parameters"]["net"]


# ---- trust by type and position: every function and class of the package, and known gadgets -----------


def _package_objects() -> dict[str, Any]:
    """Every function, class and method defined in this project's package, by dotted name (modules whose
    optional dependencies are missing are left out)."""
    import inspect
    import pkgutil

    import {{ cookiecutter.package_name }} as package

    found: dict[str, Any] = {}
    for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        for name, value in vars(module).items():
            if getattr(value, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(value):
                found[f"{module.__name__}.{name}"] = value
                for attribute, member in vars(value).items():
                    if callable(member) or isinstance(member, staticmethod | classmethod):
                        found[f"{module.__name__}.{name}.{attribute}"] = member
            elif inspect.isfunction(value):
                found[f"{module.__name__}.{name}"] = value
    return found


def _gadget_spec(name: str, marker: Path) -> dict[str, Any]:
    """``name`` as a class spec with arguments that would write ``marker`` if it ran as the gadget it is."""
    write = f"open({str(marker)!r}, 'w').close()"
    init_args = {
        "torch.fx.graph_module.reduce_graph_module": {"body": {"_code": ""}, "import_block": write},
        "subprocess.Popen": {"args": ["touch", str(marker)]},
        "builtins.exec": {"source": write},
        "functools.partial": {"func": "builtins.exec", "args": [write]},
        "operator.methodcaller": {"name": "system", "args": [f"touch {marker}"]},
    }.get(name, {"config": ["configs/default.yaml"], "extra": [f"--config={marker}"]})
    return {"class_path": name, "init_args": init_args}


GADGETS = ["torch.fx.graph_module.reduce_graph_module", "subprocess.Popen", "builtins.exec", "functools.partial"]
GADGETS += ["operator.methodcaller"]
# Where a checkpoint can put a name, and the type declared there (None: never read by a loading command).
POSITIONS = {
    "model": ("hyper_parameters._class_path", "LightningModule"),
    "net": ("hyper_parameters.net", "Module"),
    "nested init_args": ("hyper_parameters.net.init_args.model", "Module"),  # AveragedModel(model=...)
    "data": ("datamodule_hyper_parameters._class_path", "LightningDataModule"),
    "optimizer": ("hyper_parameters.optimizer", None),
    "lr_scheduler": ("hyper_parameters.lr_scheduler", None),
}


def _plant(checkpoint: Checkpoint, position: str, spec: dict[str, Any]) -> None:
    arguments, data = checkpoint["hyper_parameters"], checkpoint["datamodule_hyper_parameters"]
    if position == "model":
        arguments["_class_path"] = spec["class_path"]
    elif position == "data":
        data["_class_path"] = spec["class_path"]
    elif position == "nested init_args":
        wrapped = {"model": spec}
        arguments["net"] = {"class_path": "torch.optim.swa_utils.AveragedModel", "init_args": wrapped}
    else:
        arguments[position] = spec


def test_a_checkpoint_builds_only_classes_of_the_declared_type_at_every_position(
    trained_run: Path, tmp_path: Path
) -> None:
    # Every function, method and class of this bake's package and the known gadgets, at every position of a
    # checkpoint's arguments: refused in one line unless it is a class of the type declared there, and an
    # optimizer or schedule is never read at all. Fails with the position's type unchecked (Positions.resolve
    # without its issubclass or isclass test), or with the optimizer parsed again.
    import inspect

    import lightning as L

    from {{ cookiecutter.package_name }}.engine.trust import checkpoint_arguments, never_built

    bases = {"LightningModule": L.LightningModule, "Module": torch.nn.Module}
    bases["LightningDataModule"] = L.LightningDataModule
    saved = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    marker = tmp_path / "ran"
    objects = _package_objects()
    assert len(objects) > 100, "the package's functions and classes were not found"
    accepted = 0
    for name in [*objects, *GADGETS]:
        target = objects.get(name)
        for position, (where, base) in POSITIONS.items():
            checkpoint = {key: value for key, value in saved.items()}
            checkpoint["hyper_parameters"] = dict(saved["hyper_parameters"])
            checkpoint["datamodule_hyper_parameters"] = dict(saved["datamodule_hyper_parameters"])
            _plant(checkpoint, position, _gadget_spec(name, marker))
            if base is None:  # never read: checked, parsed and built without it
                check_checkpoint(checkpoint, "x.ckpt")
                assert position not in checkpoint_arguments(checkpoint, "x.ckpt")["hyper_parameters"]
                continue
            may_build = inspect.isclass(target) and issubclass(target, bases[base]) and not never_built(name)
            try:
                check_checkpoint(checkpoint, "x.ckpt")
            except UntrustedCheckpointError as error:
                assert "\n" not in str(error) and where.split(".")[0] in str(error), str(error)
                continue
            except Exception as error:  # the only other outcome allowed: one line naming the file
                assert may_build and "\n" not in str(error), f"{name} at {position}: {error!r}"
                continue
            assert may_build, f"{name} passed at {position} ({where}), which declares {base}"
            accepted += 1
    assert not marker.exists()
    assert accepted > 0  # the project's own nets, task modules and DataModules pass where their type is declared


# Lightning's warning for a checkpoint whose run folder was copied elsewhere (its callbacks' dirpath).
@pytest.mark.filterwarnings("ignore:The dirpath has changed from")
@pytest.mark.parametrize("command", ["load_trained", "predict", "test --ckpt_path", "fit --ckpt_path"])
def test_a_checkpoints_optimizer_and_schedule_are_never_built(trained_run: Path, tmp_path: Path, command: str) -> None:
    # The reproduction: a function of the project (or torch.fx's exec gadget) as the optimizer and
    # the schedule. No loading command parses them: inference has no use for them, and a resumed fit takes
    # the user's own (the names differ from the config's: refused in one line, nothing run).
    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    path = last_checkpoint(folder)
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    marker = tmp_path / "ran"
    checkpoint["hyper_parameters"]["optimizer"] = _gadget_spec("{{ cookiecutter.package_name }}.engine.module.adamw", marker)
    checkpoint["hyper_parameters"]["lr_scheduler"] = _gadget_spec("torch.fx.graph_module.reduce_graph_module", marker)
    torch.save(checkpoint, path)
    if command == "fit --ckpt_path":
        with user_error("was trained with model.init_args.optimizer .*adamw, and the config now says"):
            COMMANDS[command](folder, path)
    else:
        COMMANDS[command](folder, path)
    assert not marker.exists()


def test_a_net_is_built_on_the_meta_device_before_any_memory_is_allocated(trained_run: Path, tmp_path: Path) -> None:
    # A small file whose arguments ask for a huge net: refused by the shapes of its weights, having allocated
    # nothing (hundreds of GB if built for real). Fails with the meta build removed (the process runs out of memory).
    path = tmp_path / "huge.ckpt"
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    init_args = checkpoint["hyper_parameters"]["net"]["init_args"]
{%- if cookiecutter.task == "language-model" %}
    init_args.update(n_embd=65536, n_layer=64, n_head=1)
{%- elif cookiecutter.task == "tabular" %}
    init_args["hidden_sizes"] = [300_000, 300_000]
{%- else %}
    init_args["channels"] = [100_000, 100_000]
{%- endif %}
    torch.save(checkpoint, path)
    with pytest.raises(Exception, match=r"does not fit|disagree") as refused:
        load_trained(path)
    assert "shape mismatches" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("part", ["state_dict", "optimizer_states"])
def test_a_tensor_that_repeats_one_element_is_refused_before_it_expands(
    trained_run: Path, tmp_path: Path, part: str
) -> None:
    # A stride-0 view keeps its shape and one element in the file: any shape fits the net's, and a copy of it
    # (a model built to fit it, an optimizer state moved) allocates the whole shape. Seen here: a 5.6 KB file.
    path = tmp_path / "repeated.ckpt"
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    if part == "state_dict":
        key, tensor = next(iter(checkpoint["state_dict"].items()))
        checkpoint["state_dict"][key] = torch.zeros(1, dtype=tensor.dtype).expand(tensor.shape)
    else:
        state = next(iter(checkpoint["optimizer_states"][0]["state"].values()))
        key, tensor = next((name, value) for name, value in state.items() if value.dim() > 0)
        state[key] = torch.zeros(1, dtype=tensor.dtype).expand(tensor.shape)
    torch.save(checkpoint, path)
    expected = r"repeated\.ckpt: the tensor .* of shape .* is a view of \d+ bytes .* refused"
    with pytest.raises(Exception, match=expected) as refused:
        load_trained(path)
    assert "\n" not in str(refused.value)
    with user_error(expected):
        main(["fit", *shrunk_args(tmp_path / "resumed"), f"--ckpt_path={path}", "--trainer.max_epochs=2"])


# ---- files are data: what they hold is bounded, read once, and refused in one line -------------------


@pytest.mark.parametrize("key", ["hyper_parameters", "datamodule_hyper_parameters"])
@pytest.mark.parametrize("value", [7, ["x"]])
def test_arguments_of_the_wrong_kind_are_one_line(trained_run: Path, tmp_path: Path, key: str, value: Any) -> None:
    path = tmp_path / "odd.ckpt"
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    checkpoint[key] = value
    torch.save(checkpoint, path)
    with user_error(rf"odd\.ckpt: .*{key.removesuffix('_hyper_parameters').replace('hyper_parameters', 'model')}"):
        predict_main(["--ckpt", str(path)])


@pytest.mark.parametrize(
    ("position", "value", "named"),
    [
        ("loops/fit_loop/epoch_progress/current/completed", "one", r"\.completed holds str, not a number \(int\)"),
        ("loops/fit_loop/epoch_loop.state_dict", [1], r"fit_loop\.epoch_loop\.state_dict holds list, not a mapping"),
        ("loops/fit_loop/epoch_progress", None, r"loops\.fit_loop has no 'epoch_progress'"),
        ("callbacks/RandomStateCheckpoint/python/state", "abc", r"\.python\.state holds str, not a list"),
        ("callbacks/RandomStateCheckpoint/torch", torch.zeros(3), r"\.torch holds torch\.float32, not a tensor of \S+"),
        ("callbacks/RandomStateCheckpoint/numpy/position", 2.5, r"numpy\.position holds float, not a number \(int\)"),
        ("lr_schedulers/0/last_epoch", "7", r"lr_schedulers\[0\]\.last_epoch holds str, not a number \(int\)"),
        ("optimizer_states/0/param_groups/0/lr", [0.1], r"param_groups\[0\]\.lr holds list, not a number \(float\)"),
        ("optimizer_states/0/state/0/exp_avg", "m", r"state\.0\.exp_avg holds str, not a tensor of torch\.float32"),
        (
            "optimizer_states/0/state/1/exp_avg_sq",
            torch.zeros(1, dtype=torch.int8),
            r"exp_avg_sq holds torch\.int8, not a tensor of torch\.float32",
        ),
        ("optimizer_states/0/state/0/step", torch.zeros(5), r"state\.0\.step holds a tensor of shape \(5,\), not \(\)"),
        ("pytorch-lightning_version", "local:x", r"pytorch-lightning_version holds str 'local:x', not a version"),
    ],
)
def test_a_training_state_of_another_kind_is_refused_before_it_is_restored(
    trained_run: Path, tmp_path: Path, position: str, value: Any, named: str
) -> None:
    """Loop progress, callback, optimizer (its moments too) and schedule states are data Lightning restores as
    given (a traceback mid-restore, or at the first step)."""
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    *parents, last = position.split("/")
    place = checkpoint
    for key in parents:
        place = place[int(key) if key.isdigit() else key]
    if value is None:
        del place[last]
    else:
        place[last] = value
    torch.save(checkpoint, path := tmp_path / "odd.ckpt")
    with user_error(rf"odd\.ckpt: \S*{named}; this is not a training state a run of this project writes"):
        main(["fit", *shrunk_args(tmp_path / "resumed"), f"--ckpt_path={path}", "--trainer.max_epochs=2"])


@pytest.mark.parametrize("value", ["7", -1])
def test_a_datamodule_resume_position_of_another_kind_is_refused(trained_run: Path, tmp_path: Path, value: Any) -> None:
    """Where the resumed epoch starts (engine.datamodule.check_resume_position): a text, or a negative count, failed
    in the middle of the resumed run."""
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    (key,) = [key for key, state in checkpoint.items() if isinstance(state, dict) and "batches_done" in state]
    checkpoint[key]["batches_done"] = value
    torch.save(checkpoint, path := tmp_path / "odd.ckpt")
    shown = re.escape(f"{type(value).__name__} {str(value)!r}")
    with user_error(rf"odd\.ckpt: the DataModule's batches_done holds {shown}, not a whole number >= 0; this is not"):
        main(["fit", *shrunk_args(tmp_path / "resumed"), f"--ckpt_path={path}", "--trainer.max_epochs=2"])


# Lightning's ModelCheckpoint, restored from another run's folder (its callback state is read before the optimizer's).
@pytest.mark.filterwarnings("ignore:The dirpath has changed:UserWarning")
@pytest.mark.parametrize("other", ["another parameter's", "one-dimensional"])
def test_a_moment_of_another_shape_is_refused_when_the_optimizer_loads_it(
    trained_run: Path, tmp_path: Path, other: str
) -> None:
    """Which parameter a saved moment belongs to is known only once the optimizer pairs them: the load's own
    check (engine.checkpoints.guard_optimizer_loads), instead of torch's error at the first step."""
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    state = checkpoint["optimizer_states"][0]["state"]
    first, *rest = sorted(state)
    shape = tuple(state[first]["exp_avg"].shape)
    if other == "one-dimensional":
        wrong = (3,)
    else:
        wrong = next(tuple(state[at]["exp_avg"].shape) for at in rest if tuple(state[at]["exp_avg"].shape) != shape)
    state[first]["exp_avg"] = torch.zeros(wrong)
    torch.save(checkpoint, path := tmp_path / "odd.ckpt")
    shapes = rf"has shape {re.escape(str(wrong))}, where this run's has {re.escape(str(shape))}"
    with user_error(rf"optimizer state 'exp_avg' of parameter \S+ {shapes}; this is not a training state"):
        main(["fit", *shrunk_args(tmp_path / "resumed"), f"--ckpt_path={path}", "--trainer.max_epochs=2"])


def test_shared_lists_do_not_make_a_small_file_a_huge_walk(trained_run: Path, tmp_path: Path) -> None:
    # A list that holds itself ten times, twelve levels deep: 1.7 KB on disk, 10^12 values to walk.
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
    shared: Any = ["x"]
    for _ in range(12):
        shared = [shared] * 10
    checkpoint["hyper_parameters"]["extra"] = shared
    with pytest.raises(UntrustedCheckpointError, match="more than 100,000 values"):
        check_checkpoint(checkpoint, "x.ckpt")


def test_a_compressed_checkpoint_is_refused_before_it_expands(trained_run: Path, tmp_path: Path) -> None:
    # torch.save stores its members; the same file recompressed with deflate could expand to any size.
    import zipfile

    path = tmp_path / "deflated.ckpt"
    deflated = zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(last_checkpoint(trained_run)) as source, deflated as out:
        for info in source.infolist():
            out.writestr(info.filename, source.read(info.filename))
    with pytest.raises(Exception, match=r"compressed members .* refused") as refused:
        load_trained(path)
    assert "\n" not in str(refused.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_where_a_checkpoint_is_looked_for_never_blocks(trained_run: Path, tmp_path: Path) -> None:
    from {{ cookiecutter.package_name }}.engine.run_folders import latest_checkpoint

    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    (run,) = {path.parent.parent for path in folder.rglob("last.ckpt")}
    fifo = run / "checkpoints" / "interrupted-step999.ckpt"
    os.mkfifo(fifo)  # the newest entry: opening it to read would wait for a writer forever
    assert latest_checkpoint(run) == run / "checkpoints" / "last.ckpt"
    with user_error("not a regular file"):
        predict_main(["--ckpt", str(fifo)])


def test_a_truncated_or_foreign_test_summary_is_left_aside(trained_run: Path, tmp_path: Path) -> None:
    from {{ cookiecutter.package_name }}.engine.run_folders import best_checkpoint, read_test_metrics

    folder = tmp_path / "run"
    shutil.copytree(trained_run, folder)
    (run,) = {path.parent.parent for path in folder.rglob("last.ckpt")}
    for text in ('{"checkpoint": "x', '["x"]', '{"metrics": 5}'):
        (run / "test_metrics.json").write_text(text)
        assert read_test_metrics(run) is None
        assert best_checkpoint(folder).is_file()
{%- if cookiecutter.use_pretrained == "yes" and cookiecutter.task != "tabular" %}


def test_an_error_while_the_model_is_rebuilt_is_one_line(trained_run: Path, tmp_path: Path) -> None:
    # Raised inside jsonargparse's build (it wraps what a constructor raises): the user reads the cause.
    path = tmp_path / "rebuilt.ckpt"
    checkpoint = torch.load(last_checkpoint(trained_run), map_location="cpu", weights_only=True)
{%- if cookiecutter.task == "language-model" %}
    pytest.importorskip("transformers", reason="the finetune extra is not installed")  # its pretrained tokenizers
    checkpoint["hyper_parameters"]["tokenizer"] = "no-such-org/no-such-tokenizer"  # runs never download
    expected = "no-such-org/no-such-tokenizer is neither a folder nor in the local Hugging Face cache"
{%- else %}
    pytest.importorskip("peft", reason="the finetune extra is not installed")  # the net's own import comes first
    folder = tmp_path / "model"
    folder.mkdir()
    auto_map = {"AutoModel": "x.Y"}
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    net = {"class_path": "{{ cookiecutter.package_name }}.nets.HFImageClassifier"}
    net["init_args"] = {"model": str(folder), "num_classes": 10}
    checkpoint["hyper_parameters"]["net"] = net
    expected = r"maps model_type 'evil' to Python code in the folder \(auto_map\)"
{%- endif %}
    torch.save(checkpoint, path)
    with user_error(expected):
        predict_main(["--ckpt", str(path)])
{%- endif %}
{%- if cookiecutter.use_pretrained == "yes" and cookiecutter.task != "tabular" %}


def test_a_model_folder_holding_a_folder_named_as_a_model_file_is_one_line(tmp_path: Path) -> None:
    # transformers would open it as the weights file (IsADirectoryError and its traceback).
    from {{ cookiecutter.package_name }}.engine.errors import ConfigError
    from {{ cookiecutter.package_name }}.nets.hub import check_files_inside

    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "extra.safetensors").mkdir()
    with pytest.raises(ConfigError, match=r"extra\.safetensors is a folder where a model file of that name is read"):
        check_files_inside(tmp_path, "net.model", tmp_path)
{%- endif %}
