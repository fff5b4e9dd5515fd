"""make find-lr and make find-batch-size: a suggestion inside the searched range, printed as an override that parses,
written into a find folder of its own; the configs untouched, one device only."""

import hashlib
import json
import logging
import math
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, shrunk_args, user_error

from {{ cookiecutter.package_name }}.cli import main as cli_main
from {{ cookiecutter.package_name }}.commands.find import main, steepest_fall


def configs_digest() -> str:
    return hashlib.sha256(b"".join(path.read_bytes() for path in sorted(CONFIGS.rglob("*.yaml")))).hexdigest()


def override(printed: str) -> str:
    """The ``--key=value`` of the printed ``make train ARGS="..."`` line."""
    line = next(line for line in printed.splitlines() if line.startswith("Train with it: make train ARGS="))
    return line.split('ARGS="', 1)[1].split('"', 1)[0]


def test_find_lr_suggests_a_rate_inside_the_range_and_writes_the_plot(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    before = configs_digest()
    main(["lr", *shrunk_args(tmp_path), "--min_lr=1e-5", "--max_lr=0.5", "--num_training=30"])
    (folder,) = (tmp_path / "logs" / "find").iterdir()
    assert folder.name.startswith("lr-default-")
    written = {path.name for path in folder.iterdir()}
    assert written == {"config.yaml", "environment.json", "lr_find.json", "lr_find.png"}
    assert (folder / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = json.loads((folder / "lr_find.json").read_text())
    assert 1e-5 <= result["suggestion"] <= 0.5
    assert len(result["lr"]) == len(result["loss"]) == result["steps"] > 11  # smoothed: 10 skipped, 1 at the end
    assert result["lr"] == sorted(result["lr"])  # rising over the range
    assert configs_digest() == before  # the suggestion is printed, never written into a config
    given = override(capsys.readouterr().out)
    assert given == f"--model.init_args.optimizer.init_args.lr={result['suggestion']:.3g}"
    cli = cli_main([*shrunk_args(tmp_path), given], run=False)  # the printed override parses as make train's
    assert cli.config.model.init_args.optimizer.init_args.lr == pytest.approx(result["suggestion"], rel=1e-2)


def test_find_batch_size_suggests_the_largest_size_that_ran(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    before = configs_digest()
    # Doubling from 2 for 3 trials: 2, 4 and 8 ran, and nothing on a CPU runs out of memory at that size.
    main(["batch-size", *shrunk_args(tmp_path), "--mode=power", "--max_trials=3"])
    (folder,) = (tmp_path / "logs" / "find").iterdir()
    assert folder.name.startswith("batch-size-default-")
    result = json.loads((folder / "batch_size.json").read_text())
    assert result["suggestion"] == 8
    assert result["configured"] == cli_main(shrunk_args(tmp_path), run=False).datamodule.batch_size
    assert configs_digest() == before
    given = override(capsys.readouterr().out)
    assert given == "--data.init_args.batch_size=8"
    assert cli_main([*shrunk_args(tmp_path), given], run=False).datamodule.batch_size == 8


def test_find_batch_size_never_suggests_more_than_the_training_split(
    tmp_path: Path, monkeypatch, capsys, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    caplog.set_level(logging.INFO)
    # Lightning's search runs one batch larger than the split (it stops only once a size reaches it);
    # make train refuses a batch larger than the split, so the suggestion is the split's size at most.
{%- if cookiecutter.task == "language-model" %}
    # A split smaller than Lightning's own bound on the search (8192): 20 kB of text, a few hundred windows.
    (tmp_path / "small.txt").write_text("Call me Ishmael. Some years ago, never mind how long precisely. " * 320)
    main(["batch-size", *shrunk_args(tmp_path), f"--data.init_args.path={tmp_path / 'small.txt'}", "--mode=power"])
{%- else %}
    main(["batch-size", *shrunk_args(tmp_path), "--mode=power"])
{%- endif %}
    (folder,) = (tmp_path / "logs" / "find").iterdir()
    result = json.loads((folder / "batch_size.json").read_text())
    assert result["suggestion"] == result["train_samples"] > 0
    assert "limited by the training split" in capsys.readouterr().out
    # One answer: Lightning's own ("will continue with full run using batch size <larger>") is not said, nor
    # its note on the Tuner's checkpoint ("`weights_only` was not set").
    assert "Finished batch size finder" not in caplog.text and "weights_only" not in caplog.text
    assert "Batch size 2 succeeded" in caplog.text  # the search's progress is


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["lr", "--trainer.devices=2", "--trainer.strategy=ddp"], "searches on one device.*--trainer.devices=1"),
        (["lr", "--min_lr=0.1", "--max_lr=0.01"], "need 0 < --min_lr < --max_lr"),
    ],
)
def test_find_refuses_what_it_cannot_search_in_one_line_and_leaves_no_folder(
    tmp_path: Path, monkeypatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    with user_error(message):
        main([args[0], *shrunk_args(tmp_path), *args[1:]])
    assert not (tmp_path / "logs" / "find").exists()


def test_the_suggestion_is_the_steepest_fall_per_decade_not_the_noise_at_the_smallest_rates() -> None:
    # A range test's shape: flat with a little noise up to 1e-4, the loss falling fastest around 1e-2,
    # diverging past 0.3. Per unit of rate (Lightning 2.6's suggestion), the noise's tiny spacing wins.
    lrs = torch.logspace(-6, 0, 100).tolist()
    losses = [
        2.0 - 1.5 / (1 + math.exp(-3 * (math.log10(lr) + 2))) + 0.002 * (-1) ** i + (5 * lr if lr > 0.3 else 0)
        for i, lr in enumerate(lrs)
    ]
    assert 3e-3 < lrs[steepest_fall(lrs, losses)] < 3e-2
    losses[60] = float("nan")  # a non-finite step is passed over, not chosen
    assert 3e-3 < lrs[steepest_fall(lrs, losses)] < 3e-2
    assert steepest_fall(lrs[:12], losses[:12]) is None  # fewer than 2 points once the ends are skipped
