"""Precision rules (engine/precision.py) that hold on any machine: a fused optimizer under bf16-mixed."""

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CONFIGS, shrunk_args

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine.gradients import gradient_norms


def sgd_at_lr_1_clipped(tmp_path: Path, clip: float, *extra: str) -> list[str]:
    """Arguments of a shrunk run with plain SGD at lr 1, no schedule, clipping at ``clip``: a step moves the
    weights by exactly the clipped gradient."""
    return [
        *shrunk_args(tmp_path),
        "--model.init_args.optimizer=torch.optim.SGD",
        "--model.init_args.optimizer.init_args.lr=1.0",
        "--model.init_args.optimizer.init_args.weight_decay=0.0",
        "--model.init_args.lr_scheduler=null",
        f"--trainer.gradient_clip_val={clip}",
        "--test_after_fit=false",
        *extra,
    ]


def test_a_fused_optimizer_trains_under_bf16_mixed_with_its_gradients_clipped(tmp_path: Path) -> None:
    # Lightning's mixed-precision plugin refuses fused optimizers with gradient clipping (a rule for
    # float16's loss scaler); bf16 has no scaler, so the module clips itself. Plain SGD at lr 1 moves
    # the weights by exactly the clipped gradient: the step's length is the clip value.
    clip = 1e-3
    args = sgd_at_lr_1_clipped(tmp_path, clip, "--trainer.precision=bf16-mixed", "--trainer.max_steps=1")
    args.append("--model.init_args.optimizer.init_args.fused=true")
    cli = main(args, run=False)
    before = {name: p.detach().clone() for name, p in cli.model.named_parameters()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.optimizers[0].defaults["fused"]
    moved = [torch.linalg.vector_norm(p.detach() - before[name]) for name, p in cli.model.named_parameters()]
    assert torch.linalg.vector_norm(torch.stack(moved)).item() == pytest.approx(clip, rel=0.02)


class NormBeforeClipping(L.Callback):
    """Each step's total gradient norm as torch computes it, before the guard, the logging and clipping."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        # One norm per tensor, not torch._foreach_norm: the test counts the calls of that.
        norms = [torch.linalg.vector_norm(p.grad) for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack(norms)).item())


def test_the_gradient_norms_are_computed_once_a_step_for_the_guard_the_log_and_clipping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # engine.gradients: the non-finite guard, the logged train/grad_norm and clipping read one
    # computation a step (each walked every gradient before: three norm passes on a logging step).
    steps = 3
    args = [
        *shrunk_args(tmp_path),
        "--trainer.gradient_clip_val=1e-3",
        "--trainer.log_every_n_steps=1",
        f"--trainer.max_steps={steps}",
        "--test_after_fit=false",
    ]
    cli = main(args, run=False)
    watch = NormBeforeClipping()
    cli.trainer.callbacks.insert(0, watch)
    assert any(type(c).__name__ == "StopOnNonFinite" for c in cli.trainer.callbacks)
    logged: list[float] = []
    log = cli.model.log

    def keep_norm(name: str, value, **kwargs) -> None:
        if name == "train/grad_norm":
            logged.append(value.item())
        log(name, value, **kwargs)

    cli.model.log = keep_norm
    norm_passes = []
    real = torch._foreach_norm
    monkeypatch.setattr(torch, "_foreach_norm", lambda *a, **kw: norm_passes.append(1) or real(*a, **kw))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert len(norm_passes) == steps
    # The logged norm is the one before clipping; above the clip value, so every step was clipped.
    assert logged == pytest.approx(watch.norms[:steps], rel=1e-5)
    assert min(watch.norms) > 1e-3


class StepLosses(L.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, *args) -> None:
        self.losses.append(outputs["loss"].item())


@pytest.mark.slow
def test_the_cuda_graphs_preset_trains_to_the_eager_losses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # On a CPU, compile_mode reduce-overhead compiles without graphs; the run still takes the preset's
    # path (the compiled net, each step marked for CUDA graph trees) with clipping and the NaN guard on.
    caplog.set_level(logging.INFO)
    marks = []
    mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1) or mark())
    steps, losses = 4, {}
    no_dropout = ["--model.init_args.net.init_args.dropout=0"]  # compiled dropout draws other masks than eager
    for name, preset in (("eager", []), ("graphs", [f"--config={CONFIGS / 'presets' / 'cuda-graphs.yaml'}"])):
        args = [*shrunk_args(tmp_path / name), *preset, f"--trainer.max_steps={steps}", "--test_after_fit=false"]
        args += no_dropout
        cli = main(args, run=False)
        record = StepLosses()
        cli.trainer.callbacks.append(record)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        losses[name] = torch.tensor(record.losses)
    assert cli.model.hparams.compile_mode == "reduce-overhead" and len(marks) == steps
    assert "compile_mode=reduce-overhead: on cpu it compiles without CUDA graphs" in caplog.text  # said, not silent
    assert len(losses["eager"]) == steps
    torch.testing.assert_close(losses["graphs"], losses["eager"], rtol=1e-3, atol=1e-5)


# Lightning's warning for the very case under test: a training_step that returns None.
@pytest.mark.filterwarnings("ignore:`training_step` returned `None`")
def test_a_step_without_gradients_and_clipping_by_value_train(tmp_path: Path) -> None:
    # Lightning skips the backward pass of a training_step that returns None (a user's own skip), but still
    # asks for clipping: with no gradient there is nothing to clip. Clipping by value, the other algorithm,
    # bounds every gradient element: plain SGD at lr 1 moves no weight by more than the clip value.
    clip = 1e-4
    args = sgd_at_lr_1_clipped(tmp_path, clip, "--trainer.gradient_clip_algorithm=value", "--trainer.max_steps=2")
    cli = main(args, run=False)
    step = cli.model.training_step
    cli.model.training_step = lambda batch, batch_idx: None if batch_idx == 0 else step(batch, batch_idx)
    before = {name: p.detach().clone() for name, p in cli.model.named_parameters()}
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    moved = max((p.detach() - before[name]).abs().max().item() for name, p in cli.model.named_parameters())
    assert 0 < moved <= clip * 1.001


class _Trainer:
    """What gradient_norms reads of a trainer, for a module outside fit."""

    model = None
    strategy = None


def test_gradient_norms_are_shared_until_the_gradients_change_in_place() -> None:
    module = L.LightningModule()
    module.layer = torch.nn.Linear(3, 2)
    module._trainer = _Trainer()
    module.layer(torch.ones(4, 3)).sum().backward()
    first = gradient_norms(module)
    torch.testing.assert_close(first.norms, torch.stack([p.grad.norm() for p in module.parameters()]))
    assert gradient_norms(module).norms is first.norms  # the same gradients, unchanged: not computed again
    first.clip_(0.1)  # in place: the next call sees the clipped gradients
    torch.testing.assert_close(gradient_norms(module).total, torch.tensor(0.1), rtol=1e-4, atol=0)
    for param in module.parameters():  # zero_grad(set_to_none=False): the same tensors, new values
        param.grad.zero_()
    module.layer(2 * torch.ones(4, 3)).sum().backward()
    expected = torch.stack([p.grad.norm() for p in module.parameters()])
    torch.testing.assert_close(gradient_norms(module).norms, expected)
