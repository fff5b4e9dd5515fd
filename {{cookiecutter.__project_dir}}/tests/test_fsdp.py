"""The fsdp preset: which blocks are sharded and checkpointed, and (on a GPU) a sharded run loaded back in one process.

Lightning runs FSDP on GPUs only, so without one the preset is checked by building its strategy.
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import CONFIGS, fit_in_subprocess, shrunk_args
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import FSDPStrategy

from {{ cookiecutter.package_name }}.models import ImageClassifier
from {{ cookiecutter.package_name }}.nets import CNN
from {{ cookiecutter.package_name }}.nets.cnn import ConvBlock


def fsdp_strategy() -> FSDPStrategy:
    """The FSDPStrategy the preset describes, built as LightningCLI builds it (jsonargparse)."""
    config = yaml.safe_load((CONFIGS / "presets" / "fsdp.yaml").read_text())["trainer"]["strategy"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=FSDPStrategy)
    return parser.instantiate(parser.parse_object({"strategy": config})).strategy


def test_fsdp_preset_wraps_and_checkpoints_each_conv_block() -> None:
    strategy = fsdp_strategy()
    net = CNN(channels=(16, 32))
    for policy in (strategy.kwargs["auto_wrap_policy"], strategy._activation_checkpointing_kwargs["auto_wrap_policy"]):
        chosen = [name for name, module in net.named_modules() if policy(module, recurse=False)]
        assert chosen == [name for name, module in net.named_modules() if isinstance(module, ConvBlock)]
        assert len(chosen) == 2


def test_fsdp_preset_saves_sharded_checkpoints() -> None:
    strategy = fsdp_strategy()
    assert strategy._state_dict_type == "sharded"
    assert strategy.sharding_strategy.name == "FULL_SHARD"


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
        "--model.init_args.net={{ cookiecutter.package_name }}.nets.CNN",
    ]
    fit_in_subprocess(args, timeout=600)
    (sharded,) = (tmp_path / "logs").rglob("last.ckpt")
    assert sharded.is_dir()  # one shard file per process, plus metadata

    subprocess.run(
        [sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(sharded)],
        check=True,
        capture_output=True,
    )
    consolidated = sharded.with_name("last.ckpt.consolidated")
    model = ImageClassifier.load_from_checkpoint(consolidated, map_location="cpu", weights_only=True).eval()
    assert isinstance(model.net, CNN)
    with torch.no_grad():
        assert model(torch.randn(4, 1, 8, 8)).shape == (4, 10)
