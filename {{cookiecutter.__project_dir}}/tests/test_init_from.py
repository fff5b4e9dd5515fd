"""``model.init_from``: a new run that starts from an earlier run's weights (engine/module.py)."""

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, fit_in_subprocess, shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import CLI, main

{% if cookiecutter.task == "language-model" -%}
# A net argument that changes a weight's shape, with the value the shrunk config gives it.
OTHER_NET = ("--data.init_args.block_size=64", "block_size: 32 in the checkpoint, 64 here")
{%- elif cookiecutter.task == "tabular" -%}
OTHER_NET = (
    "--model.init_args.net.init_args.hidden_sizes=[32]",
    "hidden_sizes: [128, 64] in the checkpoint, [32] here",
)
{%- else -%}
OTHER_NET = ("--model.init_args.net.init_args.channels=[8, 16]", "channels: [32, 64] in the checkpoint, [8, 16] here")
{%- endif %}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last checkpoint of a short run of the shrunk config."""
    folder = tmp_path_factory.mktemp("pretrained")
    cli = main(["fit", *shrunk_args(folder), "--test_after_fit=false"])
    return Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt"


def net_weights(state: dict) -> dict[str, torch.Tensor]:
    return {key: value for key, value in state.items() if key.startswith("net.") and isinstance(value, torch.Tensor)}


def test_a_new_run_starts_from_the_checkpoints_weights_and_trains_on(pretrained: Path, tmp_path: Path) -> None:
    saved = net_weights(torch.load(pretrained, map_location="cpu", weights_only=True)["state_dict"])
    cli = main([*shrunk_args(tmp_path), f"--model.init_args.init_from={pretrained}"], run=False)
    fresh = net_weights(cli.model.state_dict())
    assert any(not torch.equal(fresh[key], saved[key]) for key in saved)  # a new net differs ...
    cli.model.setup("fit")
    started = net_weights(cli.model.state_dict())
    assert all(torch.equal(started[key], saved[key]) for key in saved)  # ... until fit starts from the checkpoint
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step > 0 and cli.trainer.current_epoch == 1  # a fresh loop: step 0, epoch 0


def test_a_net_built_otherwise_is_refused_before_the_run_names_what_differs(pretrained: Path, tmp_path: Path) -> None:
    option, difference = OTHER_NET
    with user_error(r"model\.init_from: .*does not fit.*net\.init_args\." + re.escape(difference)):
        main(["fit", *shrunk_args(tmp_path), f"--model.init_args.init_from={pretrained}", option])
    assert not list((tmp_path / "logs").rglob("*"))  # no run folder, nothing written


def test_a_missing_or_corrupt_checkpoint_is_one_line_before_the_run(pretrained: Path, tmp_path: Path) -> None:
    with user_error("no such checkpoint"):
        main(["fit", *shrunk_args(tmp_path), f"--model.init_args.init_from={tmp_path / 'gone.ckpt'}"])
    corrupt = tmp_path / "corrupt.ckpt"
    corrupt.write_bytes(pretrained.read_bytes()[:1000])
    with user_error("not a readable checkpoint"):
        main(["fit", *shrunk_args(tmp_path), f"--model.init_args.init_from={corrupt}"])
    assert not list((tmp_path / "logs").rglob("*"))


def test_only_the_weights_of_init_from_are_read_never_the_code_it_names(
    pretrained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hostile checkpoint: its config names a planted module at every place a class could go. init_from
    # takes the tensors only (torch.load weights_only); nothing it names is imported.
    marker = tmp_path / "imported"
    (tmp_path / "labtools_init.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    checkpoint = torch.load(pretrained, map_location="cpu", weights_only=True)
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        checkpoint[key]["class_path"] = "labtools_init.Evil"
    checkpoint["hyper_parameters"]["net"]["class_path"] = "labtools_init.Net"
    hostile = tmp_path / "hostile.ckpt"
    torch.save(checkpoint, hostile)
    cli = main([*shrunk_args(tmp_path), f"--model.init_args.init_from={hostile}"], run=False)
    cli.model.setup("fit")
    started = net_weights(cli.model.state_dict())
    assert all(torch.equal(started[key], value) for key, value in net_weights(checkpoint["state_dict"]).items())
    assert not marker.exists() and "labtools_init" not in sys.modules


@pytest.mark.filterwarnings("ignore:Experiment logs directory .* exists and is not empty")
@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_a_resumed_run_continues_its_own_weights_without_reading_init_from(pretrained: Path, tmp_path: Path) -> None:
    moved = tmp_path / "moved.ckpt"
    moved.write_bytes(pretrained.read_bytes())
    args = [*shrunk_args(tmp_path), f"--model.init_args.init_from={moved}", "--test_after_fit=false"]
    first: CLI = main(["fit", *args])
    last = Path(first.trainer.checkpoint_callback.dirpath) / "last.ckpt"
    moved.unlink()  # the file it started from is gone: resuming needs only the run's own checkpoint
    resumed = main(["fit", *args, "--trainer.max_epochs=2", f"--ckpt_path={last}"])
    assert resumed.trainer.current_epoch == 2
{%- if cookiecutter.task == "language-model" %}


def test_weights_of_another_tokenizer_are_refused(pretrained: Path, tmp_path: Path) -> None:
    checkpoint = torch.load(pretrained, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["tokenizer"] = "some-org/some-model"
    other = tmp_path / "other-tokenizer.ckpt"
    torch.save(checkpoint, other)
    with user_error("trained with the tokenizer 'some-org/some-model' and this run's data uses 'bytes'"):
        main(["fit", *shrunk_args(tmp_path), f"--model.init_args.init_from={other}"])
{%- endif %}


@pytest.mark.slow  # two processes
def test_under_ddp_every_process_starts_from_the_checkpoints_weights(pretrained: Path, tmp_path: Path) -> None:
    # Each process reads init_from in its own setup, before DDP wraps the model and broadcasts
    # rank 0's weights: every process must start from the checkpoint, not from a fresh net.
    folder = {"folder": str(tmp_path)}
    record = json.dumps({"class_path": "conftest.StartingWeights", "init_args": folder})
    ddp = [f"--config={CONFIGS / 'presets' / 'ddp.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2"]
    fit_in_subprocess(
        [*shrunk_args(tmp_path), *ddp, f"--model.init_args.init_from={pretrained}", f"--trainer.callbacks+={record}"]
    )
    saved = net_weights(torch.load(pretrained, map_location="cpu", weights_only=True)["state_dict"])
    for rank in (0, 1):
        started = net_weights(torch.load(tmp_path / f"rank{rank}.pt", weights_only=True))
        assert set(started) == set(saved)
        assert all(torch.equal(started[key], saved[key]) for key in saved), f"rank {rank}"
    assert list((tmp_path / "logs").rglob("last.ckpt"))  # and trained on
