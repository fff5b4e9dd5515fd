"""The fsdp and fsdp2 presets: which blocks are sharded, checkpoints, and runs loaded back in one process.

Lightning runs FSDP1 (the fsdp preset) on GPUs only, so without one that preset is checked by building its
strategy. FSDP2 (the fsdp2 preset) runs on CPU processes too (gloo): trained on two, it matches DDP and
resumes exactly. Every task's default net is checked: the presets ship in every bake.
"""

import csv
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import (
    CONFIGS,
    DDP_ON_CPU,
    assert_same_training_state,
    fit_in_subprocess,
    fit_stopped_by_signal,
    resume_as_printed,
    shrunk_args,
)
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.checkpoints import read_checkpoint
from {{ cookiecutter.package_name }}.engine.inference import load_trained
from {{ cookiecutter.package_name }}.engine.sharding import consolidate, sharded_units

# Two processes on the CPU (gloo), sharded by the fsdp2 preset.
FSDP2_ON_CPU = [f"--config={CONFIGS / 'presets' / 'fsdp2.yaml'}", "--trainer.accelerator=cpu", "--trainer.devices=2"]
FSDP = yaml.safe_load((CONFIGS / "presets" / "fsdp.yaml").read_text())["trainer"]["strategy"]


def fsdp_strategy() -> FSDPStrategy:
    """The FSDPStrategy the preset describes, built as LightningCLI builds it (jsonargparse)."""
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=FSDPStrategy)
    return parser.instantiate(parser.parse_object({"strategy": FSDP})).strategy


def default_net(tmp_path: Path) -> nn.Module:
    """The net of the default config, as ``make train`` builds it."""
    return main(shrunk_args(tmp_path), run=False).model.net


def listed_blocks(net: nn.Module) -> list[nn.Module]:
    """The modules of ``net`` whose class the fsdp preset lists as its units (none: the net is one unit)."""
    listed = set(FSDP["init_args"].get("auto_wrap_policy") or ())
    return [module for module in net.modules() if f"{type(module).__module__}.{type(module).__qualname__}" in listed]


def test_fsdp_preset_wraps_and_checkpoints_each_block_it_lists(tmp_path: Path) -> None:
    strategy, net = fsdp_strategy(), default_net(tmp_path)
    checkpointed = strategy._activation_checkpointing_kwargs.get("auto_wrap_policy")
    for policy in (strategy.kwargs.get("auto_wrap_policy"), checkpointed):
        chosen = [] if policy is None else [module for module in net.modules() if policy(module, recurse=False)]
        assert chosen == listed_blocks(net)
    assert len(listed_blocks(net)) == {{ {"tabular": 0, "language-model": 1}.get(cookiecutter.task, 2) }}  # the default net's repeated blocks


def test_fsdp_preset_saves_sharded_checkpoints() -> None:
    strategy = fsdp_strategy()
    assert strategy._state_dict_type == "sharded"
    assert strategy.sharding_strategy.name == "FULL_SHARD"


def test_fsdp2_shards_the_same_blocks_as_the_fsdp_preset_then_the_net(tmp_path: Path) -> None:
    net = default_net(tmp_path)
    assert sharded_units(net) == listed_blocks(net)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Lightning runs FSDP on CUDA GPUs only")
def test_fsdp_run_on_a_gpu_loads_back_into_one_process(tmp_path: Path) -> None:
    args = [
        *shrunk_args(tmp_path),
        f"--config={CONFIGS / 'presets' / 'gpu.yaml'}",
        f"--config={CONFIGS / 'presets' / 'fsdp.yaml'}",
        "--trainer.accelerator=gpu",
        "--trainer.devices=1",
        "--trainer.max_epochs=3",
    ]
    fit_in_subprocess(args, timeout=600)
    (sharded,) = (tmp_path / "logs").rglob("last.ckpt")
    assert sharded.is_dir()  # one shard file per process, plus metadata

    subprocess.run(
        [sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(sharded)],
        check=True,
        capture_output=True,
    )
    trained = load_trained(sharded.with_name("last.ckpt.consolidated"))
    assert type(trained.model.net) is type(default_net(tmp_path / "default"))


def logged(run: Path, name: str) -> list[float]:
    """Every value of metric ``name`` in the run folder's metrics.csv, in order."""
    with (run / "metrics.csv").open() as file:
        return [float(row[name]) for row in csv.DictReader(file) if row.get(name)]


@pytest.mark.slow
def test_fsdp2_on_two_cpu_processes_matches_data_parallel_and_resumes_exactly(tmp_path: Path) -> None:
    # The same seed, batches and steps (2 processes, 3 epochs) under DDP and FSDP2.
    exact = ["--trainer.max_epochs=3", "--trainer.deterministic=true", "--test_after_fit=false"]
    every_step = ["--trainer.log_every_n_steps=1"]
    fit_in_subprocess([*shrunk_args(tmp_path / "ddp"), *exact, *every_step, *DDP_ON_CPU])
    fit_in_subprocess([*shrunk_args(tmp_path / "fsdp2"), *exact, *every_step, *FSDP2_ON_CPU])
    (replicated,) = (tmp_path / "ddp").rglob("last.ckpt")
    (sharded,) = (tmp_path / "fsdp2").rglob("last.ckpt")
    assert sharded.is_dir() and not list(sharded.parent.glob(".*partial*"))  # shards, renamed once whole
    straight = consolidate(sharded)
    ddp, fsdp2 = read_checkpoint(replicated), read_checkpoint(straight)
    assert fsdp2["global_step"] == ddp["global_step"] > 0
    # The same training up to the order of float sums (reduce-scatter against all-reduce): every step's loss
    # and gradient norm (FSDP2's over the whole model, from the DTensor shards) to 1 % (seen: 0.12 % at most;
    # a sum for a mean, or a missing shard, is a factor away), and the weights, where AdamW's division by each
    # gradient's running size shows the float order in the 4th decimal after a few steps.
    # Buffers are not compared: FSDP2 leaves each process its own BatchNorm running statistics (DDP overwrites
    # them with rank 0's at every step), and the checkpoint keeps one process's; so is validation, left out.
    for name in ("train/loss", "train/grad_norm"):
        expected, actual = logged(replicated.parent.parent, name), logged(sharded.parent.parent, name)
        assert len(actual) == len(expected) == ddp["global_step"]
        assert actual == pytest.approx(expected, rel=1e-2), name
    for key, value in ddp["state_dict"].items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and ".running_" not in key:
            assert torch.allclose(value, fsdp2["state_dict"][key], atol=5e-3), key

    # Stopped by SIGTERM after step 7 on both processes (saved at step 8, mid-epoch), resumed: the straight
    # run's state.
    args = [*shrunk_args(tmp_path / "stopped"), *exact, *FSDP2_ON_CPU]
    interrupted = fit_stopped_by_signal(args, step=7)
    assert interrupted.is_dir()
    fit_in_subprocess(resume_as_printed(interrupted))
    assert_same_training_state(straight, consolidate(interrupted.parent / "last.ckpt"))


@pytest.mark.slow
def test_fsdp2_with_the_ema_preset_is_refused_in_one_line(tmp_path: Path) -> None:
    ema = f"--config={CONFIGS / 'presets' / 'ema.yaml'}"
    done = fit_in_subprocess([*shrunk_args(tmp_path), *FSDP2_ON_CPU, "--trainer.devices=1", ema], check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "ema.yaml does not combine with the fsdp2 preset" in done.stderr and "Traceback" not in done.stderr
