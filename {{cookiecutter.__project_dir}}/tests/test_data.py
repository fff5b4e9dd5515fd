"""The DataModule: splits, normalisation, batch shapes and bad settings."""

import pytest
import torch
from sklearn.datasets import load_digits

from {{ cookiecutter.package_name }}.data import DigitsDataModule

N_SAMPLES = 1797


@pytest.fixture(scope="module")
def digits() -> DigitsDataModule:
    datamodule = DigitsDataModule(batch_size=32)
    datamodule.setup("fit")
    return datamodule


def test_splits_are_disjoint_cover_everything_and_have_the_requested_sizes(digits: DigitsDataModule) -> None:
    splits = digits.split_indices
    everything = torch.cat(list(splits.values()))
    assert len(everything) == N_SAMPLES
    assert len(torch.unique(everything)) == N_SAMPLES
    assert len(splits["test"]) == pytest.approx(0.15 * N_SAMPLES, abs=1)
    assert len(splits["val"]) == pytest.approx(0.15 * N_SAMPLES, abs=1)


def test_splits_are_stratified(digits: DigitsDataModule) -> None:
    labels = torch.as_tensor(load_digits().target)
    overall = torch.bincount(labels, minlength=10) / len(labels)
    for name, idx in digits.split_indices.items():
        share = torch.bincount(labels[idx], minlength=10) / len(idx)
        # Two stratified cuts keep each class's share within two samples of the whole set's.
        assert torch.allclose(share, overall, atol=2.0 / len(idx)), name


def test_split_depends_on_split_seed_only() -> None:
    def split(seed: int) -> torch.Tensor:
        datamodule = DigitsDataModule(split_seed=seed)
        datamodule.setup("fit")
        return datamodule.split_indices["test"]

    torch.manual_seed(123)  # the global seed must not matter
    first = split(0)
    torch.manual_seed(456)
    assert torch.equal(first, split(0))
    assert not torch.equal(first, split(1))


def test_normalisation_uses_train_statistics_only(digits: DigitsDataModule) -> None:
    raw = torch.as_tensor(load_digits().data, dtype=torch.float32) / 16.0
    train_raw = raw[digits.split_indices["train"]]
    assert digits.mean == pytest.approx(train_raw.mean().item())
    assert digits.std == pytest.approx(train_raw.std().item())
    train_images = digits.train_set.tensors[0]
    assert train_images.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert train_images.std().item() == pytest.approx(1.0, abs=1e-4)


def test_batches_have_documented_shapes_and_types(digits: DigitsDataModule) -> None:
    for loader in (digits.train_dataloader(), digits.val_dataloader(), digits.test_dataloader()):
        images, labels = next(iter(loader))
        assert images.shape == (32, 1, 8, 8)
        assert images.dtype == torch.float32
        assert labels.shape == (32,)
        assert labels.dtype == torch.int64
        assert labels.min() >= 0 and labels.max() < digits.num_classes


def test_normalisation_statistics_travel_in_the_state_dict(digits: DigitsDataModule) -> None:
    restored = DigitsDataModule()
    restored.load_state_dict(digits.state_dict())
    images = torch.rand(2, 1, 8, 8)
    assert torch.equal(restored.normalize(images), digits.normalize(images))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"test_fraction": 1.5}, "test_fraction"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, r"val_fraction \+ data.test_fraction"),
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"data.{field}"):
        DigitsDataModule(**kwargs)
