"""Every class of user error ends in one line that names the file or field, exit status 2, no traceback."""

import functools
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, ROOT, shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine import preflight


def test_a_yaml_syntax_error_names_its_file_line_and_column(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainer:\n  max_epochs: [1\n")
    with user_error(rf"{broken}: not valid YAML at line 3, column 1"):
        main(["fit", *shrunk_args(tmp_path), f"--config={broken}"])


def test_a_yaml_syntax_error_in_a_file_a_config_names_names_that_file(tmp_path: Path) -> None:
    # default.yaml reads its Trainer from trainer.yaml (a section given as a file): an edit that breaks it.
    configs = shutil.copytree(CONFIGS, tmp_path / "configs")
    trainer = configs / "trainer.yaml"
    trainer.write_text(trainer.read_text().replace("max_epochs: ", "max_epochs: [", 1))
    with user_error(rf"{trainer}: not valid YAML at line \d+, column \d+"):
        main(["fit", *shrunk_args(tmp_path), f"--config={configs / 'default.yaml'}"])


@pytest.mark.parametrize("overlay", sorted(p.relative_to(ROOT).as_posix() for p in CONFIGS.glob("*/*.yaml")))
def test_an_overlay_given_as_the_whole_config_says_how_to_give_it(overlay: str, monkeypatch) -> None:
    # `make train CONFIG=configs/experiments/<name>.yaml` (and every command taking CONFIG): the file sets only what it
    # changes, so alone it failed deep in the parse ("the following arguments are required: fit.model").
    monkeypatch.chdir(ROOT)
    with user_error(rf"^{overlay} is an overlay on a whole config, not one: .*ARGS=\"--config {overlay}\""):
        main(["fit", "--config", overlay, "--trainer.max_epochs=1"])


def test_a_value_a_class_refuses_is_reported_alone(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # The constructor's own message, without jsonargparse's type-union noise around it.
    with user_error(r"^model\.init_args\.net\.init_args\.dropout must be in \[0, 1\), got 1\.5$"):
        main(["fit", *shrunk_args(tmp_path), "--model.init_args.net.init_args.dropout=1.5"])
    err = capsys.readouterr().err
    assert err.rstrip().splitlines()[-1] == "error: model.init_args.net.init_args.dropout must be in [0, 1), got 1.5"
    assert "NoneType" not in err and "Namespace(" not in err


def test_an_unreadable_checkpoint_is_named(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with user_error(rf"{garbage}: not a readable checkpoint"):
        main(["test", *shrunk_args(tmp_path), f"--ckpt_path={garbage}"])


def test_resuming_with_another_optimizer_is_refused_before_training(tmp_path: Path) -> None:
    # Lightning would load AdamW's state into SGD and fail at the first step (KeyError: 'momentum').
    main(["fit", *shrunk_args(tmp_path), "--test_after_fit=false"])
    last = next(tmp_path.rglob("last.ckpt"))
    before = last.read_bytes()
    switched = ["--model.init_args.optimizer=torch.optim.SGD", "--trainer.max_epochs=2", "--resume=true"]
    with user_error(r"was trained with model\.init_args\.optimizer torch\.optim\.AdamW, .* now says torch\.optim\.SGD"):
        main(["fit", *shrunk_args(tmp_path), *switched])
    assert last.read_bytes() == before  # nothing trained, nothing written


class RunsCode:
    """Unpickling this calls print: what a malicious checkpoint would do with os.system."""

    def __reduce__(self):
        return (print, ("code from the checkpoint ran",))


def test_a_checkpoint_holding_code_is_refused_as_such_not_as_corrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    planted = tmp_path / "planted.ckpt"
    hyper_parameters = {"x": RunsCode()}
    torch.save({"state_dict": {}, "hyper_parameters": hyper_parameters}, planted)
    with user_error(rf"^{planted}: holds Python code \((builtins\.)?print\) that weights-only loading .* refuses"):
        main(["test", *shrunk_args(tmp_path), f"--ckpt_path={planted}"])
    err = capsys.readouterr()
    assert "code from the checkpoint ran" not in err.out
    assert len(err.err.strip().splitlines()[-1]) < 300  # one line, not torch's page


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the presets are valid here")
@pytest.mark.parametrize(
    ("preset", "message"),
    [
        ("gpu", r"trainer\.accelerator=gpu .* needs a CUDA GPU"),
        ("fsdp", r"trainer\.strategy=.*FSDPStrategy \(configs/presets/fsdp\.yaml\) .* use configs/presets/ddp\.yaml"),
    ],
)
def test_a_gpu_preset_on_a_machine_without_one_says_so(tmp_path: Path, preset: str, message: str) -> None:
    with user_error(message):
        main(["fit", *shrunk_args(tmp_path), f"--config={CONFIGS / 'presets' / f'{preset}.yaml'}"])
    assert not (tmp_path / "logs").exists()


def test_a_bug_in_a_nets_constructor_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only our own argument checks (ConfigError) become one line: a plain ValueError raised while a
    # user's net is built is a bug, and must reach the user with its traceback.
    net_class = _default_net_class()
    build = net_class.__init__

    @functools.wraps(build)
    def buggy(self, *args, **kwargs):
        raise ValueError("a bug in the net")

    monkeypatch.setattr(net_class, "__init__", buggy)
    with pytest.raises(ValueError) as raised:
        main(["fit", *shrunk_args(tmp_path)])
    chain = [raised.value]
    while chain[-1].__cause__ or chain[-1].__context__:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    assert "a bug in the net" in [str(error) for error in chain]


def _default_net_class() -> type:
    class_path = yaml.safe_load((CONFIGS / "default.yaml").read_text())["model"]["init_args"]["net"]["class_path"]
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_nets_raise_config_errors_without_importing_lightning() -> None:
    # nets/ stay plain PyTorch: their ConfigError comes from a module that imports no framework.
    code = "import sys, {{ cookiecutter.package_name }}.nets; print('lightning' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "False"


def test_a_bug_keeps_its_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the user's mistakes are shortened: an error of our own code must stay debuggable.
    def broken(*args, **kwargs):
        raise KeyError("a bug in prepare")

    monkeypatch.setattr(preflight, "prepare", broken)
    with pytest.raises(KeyError, match="a bug in prepare"):
        main(["fit", *shrunk_args(tmp_path)])


@pytest.mark.slow
def test_the_command_line_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    # A fresh process, as `make train CONFIG=...` runs: stderr ends with the message, and holds no traceback.
    command = [sys.executable, "-m", "{{ cookiecutter.package_name }}", "test", *shrunk_args(tmp_path)]
    done = subprocess.run(
        [*command, f"--ckpt_path={tmp_path / 'nowhere.ckpt'}"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.rstrip().splitlines()[-1] == f"error: {tmp_path / 'nowhere.ckpt'}: no such checkpoint. " + (
        f"`ls {tmp_path}` shows the ones there are."
    )
