"""The LightningModule: a smoke fit, overfitting one batch, the schedule and compile."""

from functools import partial
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import CONFIGS

from {{ cookiecutter.package_name }}.cli import main
from {{ cookiecutter.package_name }}.engine import WarmupCosine
from {{ cookiecutter.package_name }}.models import ImageClassifier
from {{ cookiecutter.package_name }}.nets import CNN, MLP


def test_debug_preset_fits_validates_and_tests_a_few_batches_and_writes_nothing(
    cli_args: list[str], tmp_path: Path
) -> None:
    cli = main(["fit", *cli_args, f"--config={CONFIGS / 'presets' / 'debug.yaml'}"])
    assert cli.trainer.state.finished
    assert cli.trainer.global_step == 5
    assert torch.isfinite(cli.trainer.callback_metrics["test/loss"])
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


# Lightning turns off train shuffling itself for overfit_batches, and says so with a UserWarning.
@pytest.mark.filterwarnings("ignore:You requested to overfit but enabled train dataloader shuffling")
def test_overfits_one_batch(cli_args: list[str]) -> None:
    cli = main(
        [
            "fit",
            *cli_args,
            "--trainer.overfit_batches=1",
            "--trainer.max_epochs=40",
            "--trainer.log_every_n_steps=1",
            "--model.init_args.net.init_args.dropout=0.0",
            "--test_after_fit=false",
        ]
    )
    assert cli.trainer.callback_metrics["train/acc"] >= 0.99
    assert cli.trainer.callback_metrics["train/loss"] < 0.05


def _with_steps(model: ImageClassifier, total_steps: int) -> ImageClassifier:
    # configure_optimizers reads only trainer.estimated_stepping_batches and trainer.precision.
    model.trainer = SimpleNamespace(estimated_stepping_batches=total_steps, precision="32-true")
    return model


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    model = ImageClassifier(
        net=MLP(hidden_sizes=(8,)),
        optimizer=partial(torch.optim.AdamW, lr=1e-2),
        lr_scheduler=partial(WarmupCosine, warmup_ratio=0.25, min_lr_ratio=0.01),
    )
    model = _with_steps(model, total_steps=40)
    config = model.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(40):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    warmup = 10
    assert lrs[0] == pytest.approx(1e-2 / warmup)
    assert lrs[warmup] == pytest.approx(1e-2)
    assert all(a < b for a, b in pairwise(lrs[: warmup + 1]))  # rising
    assert all(a > b for a, b in pairwise(lrs[warmup:]))  # falling
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.01)  # after the last step


def test_weight_decay_skips_biases_and_norms() -> None:
    model = _with_steps(ImageClassifier(net=CNN(channels=(4,))), total_steps=10)
    groups = model.configure_optimizers()["optimizer"].param_groups
    decayed = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] > 0 and groups[1]["weight_decay"] == 0
    for name, param in model.named_parameters():
        is_matrix_or_kernel = name.endswith("weight") and "norm" not in name
        assert (id(param) in decayed) == is_matrix_or_kernel, name


@pytest.mark.slow
def test_compile_keeps_checkpoint_keys_of_eager(cli_args: list[str]) -> None:
    eager_keys = set(ImageClassifier(net=CNN()).state_dict())
    cli = main(
        [
            "fit",
            *cli_args,
            "--model.init_args.compile=true",
            "--trainer.limit_train_batches=3",
            "--trainer.log_every_n_steps=1",
            "--trainer.limit_val_batches=1",
            "--test_after_fit=false",
        ]
    )
    checkpoint = torch.load(Path(cli.trainer.checkpoint_callback.dirpath) / "last.ckpt", weights_only=True)
    assert set(checkpoint["state_dict"]) == eager_keys
    assert not any("_orig_mod" in key for key in checkpoint["state_dict"])


def test_channels_last_changes_the_memory_layout_not_the_outputs() -> None:
    torch.manual_seed(0)
    standard = ImageClassifier(net=CNN()).eval()
    nhwc = ImageClassifier(net=CNN(), channels_last=True).eval()
    nhwc.load_state_dict(standard.state_dict())
    nhwc.setup("fit")
    kernel = nhwc.net.blocks[1].conv1.weight  # (64, 32, 3, 3): the two layouts differ
    assert kernel.is_contiguous(memory_format=torch.channels_last) and not kernel.is_contiguous()
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(nhwc(images), standard(images))
