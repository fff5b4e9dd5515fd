"""Precision rules (engine/precision.py) that hold on any machine: a fused optimizer under bf16-mixed."""

from pathlib import Path

import pytest
import torch
from conftest import shrunk_args

from {{ cookiecutter.package_name }}.cli import main


def test_a_fused_optimizer_trains_under_bf16_mixed_with_its_gradients_clipped(tmp_path: Path) -> None:
    # Lightning's mixed-precision plugin refuses fused optimizers with gradient clipping (a rule for
    # float16's loss scaler); bf16 has no scaler, so the module clips itself. Plain SGD at lr 1 moves
    # the weights by exactly the clipped gradient: the step's length is the clip value.
    clip = 1e-3
    args = [
        *shrunk_args(tmp_path),
        "--trainer.precision=bf16-mixed",
        "--model.init_args.optimizer=torch.optim.SGD",
        "--model.init_args.optimizer.init_args.lr=1.0",
        "--model.init_args.optimizer.init_args.weight_decay=0.0",
        "--model.init_args.optimizer.init_args.fused=true",
        "--model.init_args.lr_scheduler=null",
        f"--trainer.gradient_clip_val={clip}",
        "--trainer.max_steps=1",
        "--test_after_fit=false",
    ]
    cli = main(args, run=False)
    before = {name: p.detach().clone() for name, p in cli.model.named_parameters()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.optimizers[0].defaults["fused"]
    moved = [torch.linalg.vector_norm(p.detach() - before[name]) for name, p in cli.model.named_parameters()]
    assert torch.linalg.vector_norm(torch.stack(moved)).item() == pytest.approx(clip, rel=0.02)
