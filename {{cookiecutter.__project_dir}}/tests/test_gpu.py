"""The gpu preset on a CUDA GPU: mixed precision (bf16 and fp16 with loss scaling) and compile.

Skipped without CUDA{{ "; `make bench` on a GPU measures the same configurations' speed" if cookiecutter.use_benchmark == 'yes' else '' }}.
"""

import json
from pathlib import Path

import pytest
import torch
from conftest import CONFIGS, fit_in_subprocess, shrunk_args

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_gpu_preset_trains_to_high_accuracy(tmp_path: Path, precision: str, compile: bool) -> None:
    if precision == "bf16-mixed" and not torch.cuda.is_bf16_supported(including_emulation=False):
        pytest.skip(f"{torch.cuda.get_device_name()} has no bfloat16")
    args = [
        *shrunk_args(tmp_path),
        f"--config={CONFIGS / 'presets' / 'gpu.yaml'}",
        "--trainer.accelerator=gpu",
        f"--trainer.precision={precision}",
        f"--model.init_args.compile={str(compile).lower()}",
        "--trainer.max_epochs=5",
    ]
    fit_in_subprocess(args, timeout=600)
    summary = json.loads(next((tmp_path / "logs").rglob("test_metrics.json")).read_text())
    assert summary["metrics"]["test/acc"] > 0.95
