"""The training step's host work, held in CI: eager ops dispatched per step of ``make train``'s path at most
``STEP_OPS_LIMIT`` times a plain PyTorch loop's doing the same work (``commands/bench.py`` counts both).

Counts, not times: the same on every machine, so a test can hold the line that ``make bench``'s time
ratio only reports. A feature that adds per-step work (a callback's hook, a value logged and read
every step) fails here before it shows as a slower bench. An epoch's end (metrics, checkpoint saves)
is counted apart by the bench and is not held to the step's limit.
"""

from pathlib import Path

import lightning as L
import pytest
import torch

from {{ cookiecutter.package_name }}.commands.bench import run_in_fresh_process

CONFIG = [Path(__file__).resolve().parents[1] / "configs" / "default.yaml"]
STEP_OPS_LIMIT = 1.10
STEPS = 24  # the bench counts steps 12 to 24: past the first steps' one-time work
SHAPES = {"default": []}
{%- if cookiecutter.task == "language-model" %}
# GPT-2 small's depth at a tiny width, compiled, fused AdamW, bf16 autocast (the template's docs/benchmarks.md):
# the model's own ops are few, so the framework's share of a step is at its largest.
SHAPES["gpt-12-layers"] = [
    *("--model.init_args.net.init_args.n_layer=12", "--model.init_args.net.init_args.n_embd=16"),
    *("--model.init_args.net.init_args.n_head=2", "--data.init_args.block_size=16", "--data.init_args.batch_size=2"),
    *("--trainer.precision=bf16-mixed", "--model.init_args.compile=true"),
    "--model.init_args.optimizer.init_args.fused=true",
]
{%- endif %}


class PerStepWork(L.Callback):
    """A callback that dispatches ``ops`` eager ops after every training step: the per-step work the guard is for."""

    def __init__(self, ops: int = 1) -> None:
        self.ops = ops

    def on_train_batch_end(self, *args) -> None:
        value = torch.zeros(())  # one op, then ops - 1 more
        for _ in range(self.ops - 1):
            value = value.add(1)


def step_ops(path: str, extra: list[str]) -> dict:
    return run_in_fresh_process(CONFIG, path, STEPS, extra)


def ratio(project: dict, plain: dict) -> float:
    return project["eager_ops_per_step"] / plain["eager_ops_per_step"]


@pytest.mark.slow  # two short runs under torch.profiler, each in a fresh process
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_training_step_dispatches_at_most_a_tenth_more_ops_than_a_plain_loop(shape: str) -> None:
    project, plain = step_ops("project_ops", SHAPES[shape]), step_ops("plain_ops", SHAPES[shape])
    print(f"{shape}: {project['eager_ops_per_step']:.1f} against {plain['eager_ops_per_step']:.1f} eager ops a step")
    # An epoch's end is counted apart (checkpoint saves are not a step's work){{ ": one falls in the window" if cookiecutter.task != "language-model" else "" }}.
    assert not any("ModelCheckpoint" in part or "save_checkpoint" in part for part in project["eager_ops_by_part"])
{%- if cookiecutter.task != "language-model" %}
    assert any(part.startswith("[Callback]ModelCheckpoint") for part in project["eager_ops_by_part_at_epoch_end"])
{%- endif %}
    assert ratio(project, plain) <= STEP_OPS_LIMIT, (
        f"{project['eager_ops_per_step']:.1f} eager ops a step against the plain loop's "
        f"{plain['eager_ops_per_step']:.1f}; by hook: {project['eager_ops_by_part']}"
    )


@pytest.mark.slow
def test_the_guard_fails_when_a_callback_adds_per_step_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fresh processes import this module by name: the tests folder on their path.
    monkeypatch.setenv("PYTHONPATH", f"{Path(__file__).parent}:{Path(__file__).parents[1] / 'src'}")
    project, plain = step_ops("project_ops", []), step_ops("plain_ops", [])
    added = int(0.15 * plain["eager_ops_per_step"])
    callback = ["--trainer.callbacks+=test_step_ops.PerStepWork", f"--trainer.callbacks.ops={added}"]
    heavier = step_ops("project_ops", callback)
    assert heavier["eager_ops_per_step"] - project["eager_ops_per_step"] == pytest.approx(added, abs=0.5)
    assert heavier["eager_ops_by_part"]["[Callback]PerStepWork.on_train_batch_end"] == added
    assert ratio(heavier, plain) > STEP_OPS_LIMIT >= ratio(project, plain)
