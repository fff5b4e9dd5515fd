"""A trained model outside training: rebuilt from its checkpoint alone, as one module from raw input to outputs.

``load_trained(path)`` rebuilds the LightningModule and the LightningDataModule of a run from the
checkpoint (their saved hyperparameters, the DataModule's state: normalisation statistics, table
preprocessing), without the training config. :class:`Predictor` chains the three pieces every
task provides:

- ``datamodule.inference_transform()``: raw input as a user holds it -> the net's input (the
  normalisation the DataModule applies in training, as plain tensor operations);
- ``model.net``: the network;
- ``model.output_head()``: the net's output -> what a user reads (class probabilities, a value in
  the target's units, next-token probabilities).

Every command that answers with a trained model runs this one module, so they all compute the same thing
(the predictions file, and where the bake has them the exported graph and the server), and a user's own
DataModule and model keep them all (``engine/contract.py`` lists the hooks and their defaults).

**Which classes a checkpoint may name.** Loading builds the classes a checkpoint names (model,
DataModule, net, optimizer), so a checkpoint decides what code runs. ``engine/trust.py`` checks
every name in it first: this project's package, classes of ``torch.optim`` and ``torch.nn``, and
the modules the user allows (``trust=["my_lab.data"]`` here, ``--trust my_lab.data`` on
every command that loads a checkpoint: ``make predict TRUST=my_lab.data``). Anything else is refused before
anything is imported, with the key that names it and the line that allows it.
"""

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import instantiate_module
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn

from .checkpoints import CheckpointError, check_fits, read_checkpoint
from .errors import UserError, causes
from .import_guard import loading
from .trust import check_checkpoint, checkpoint_arguments, trusted_modules

__all__ = ["Predictor", "Trained", "load_trained", "trusted_modules"]


class Predictor(nn.Module):
    """``head(net(transform(raw)))``: raw inputs (B, ...) -> outputs (B, ...), in eval mode, plain PyTorch.

    Shapes and dtypes are the task's: for the digits, raw (B, 1, 8, 8) float32 pixel values 0-16 ->
    class probabilities (B, 10); see ``export.json`` of an export for any task.
    """

    def __init__(self, transform: nn.Module, net: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.transform, self.net, self.head = transform, net, head
        self.eval()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.net(self.transform(inputs)))


@dataclass
class Trained:
    """A run's model and DataModule rebuilt from ``checkpoint``, and their :class:`Predictor`."""

    checkpoint: Path
    model: L.LightningModule
    datamodule: L.LightningDataModule
    predictor: Predictor = field(init=False)

    def __post_init__(self) -> None:
        self.predictor = Predictor(self.datamodule.inference_transform(), self.model.net, self.model.output_head())

    @property
    def class_names(self) -> list[str]:
        """Names of the classes in output order (empty for a task without classes)."""
        return [str(name) for name in getattr(self.datamodule, "class_names", None) or []]

    def describe(self, outputs: torch.Tensor) -> list[dict[str, Any]]:
        """One readable record per row of :class:`Predictor` outputs (the task module's ``describe``)."""
        return self.model.describe(outputs.detach().float().cpu(), self.class_names)


def nonfinite_rows(outputs: Any) -> list[int]:
    """Rows of ``outputs`` (B, ...) holding a NaN or an infinity (none for integer outputs or non-tensors)."""
    if not isinstance(outputs, torch.Tensor) or not outputs.is_floating_point() or outputs.ndim == 0:
        return []
    return (~torch.isfinite(outputs.reshape(len(outputs), -1)).all(dim=1)).nonzero().flatten().tolist()


def nonfinite_message(datamodule: Any, raw: Any, row: int) -> str:
    """Why row ``row`` of ``raw`` gets no answer: the model's output is not finite, and the DataModule's reason."""
    reason = ""
    if isinstance(raw, torch.Tensor) and hasattr(datamodule, "explain_input"):
        reason = datamodule.explain_input(raw[row])
    return "the model's output is not finite (NaN or infinity) for this input" + (f": {reason}" if reason else "")


def load_trained(path: str | Path, map_location: str | torch.device = "cpu", trust: Sequence[str] = ()) -> Trained:
    """Rebuild the model and DataModule of the run that wrote checkpoint ``path``, reading the file once.

    Only what inference needs is built: the task module with its net, and the DataModule; the
    checkpoint's optimizer and schedule are never parsed. The model is built on the ``meta``
    device first and every parameter's shape compared with the checkpoint's, so a small file
    cannot make it allocate a net of any size.

    Args:
        path: a checkpoint written by ``make train`` (``python -m <package> fit``).
        map_location: where the weights go ("cpu", "cuda", a device).
        trust: modules besides this project's package whose classes the checkpoint may name
            (a DataModule or net of yours elsewhere); see the module docstring.

    Raises:
        engine.checkpoints.CheckpointError: the file is missing or broken, it was not written by a
            LightningCLI run of this project (no saved model or DataModule class), its weights do not
            fit the net its arguments build, or it names anything but classes of the declared type
            from the trusted modules (``engine.trust.UntrustedCheckpointError``).
    """
    path = Path(path)
    checkpoint = read_checkpoint(path)  # a missing, truncated or foreign file is named before Lightning reads it
    for key in ("hyper_parameters", "datamodule_hyper_parameters"):
        if not isinstance(checkpoint.get(key), dict) or "_class_path" not in checkpoint[key]:
            raise CheckpointError(
                f"{path}: no {'model' if key == 'hyper_parameters' else 'datamodule'} class saved in it ({key}); "
                "use a checkpoint written by `make train` (python -m <package> fit)"
            )
    check_checkpoint(checkpoint, path, trust)  # the type at every position, before anything is imported
    arguments = checkpoint_arguments(checkpoint, path, trust)
    # Built under the rule too: a form the check does not know is refused where the import happens.
    with loading(arguments, path, trust):
        model = build_model(checkpoint, arguments["hyper_parameters"], path)
        datamodule = build(L.LightningDataModule, arguments["datamodule_hyper_parameters"])
    state = checkpoint.get(type(datamodule).__qualname__)  # where Lightning saves a DataModule's state_dict
    if state is not None:
        datamodule.load_state_dict(state)
    model.to(map_location).eval()
    if "current_model_state" in checkpoint:  # WeightAveraging's (the ema preset): the average is the state_dict
        print(f"{path}: the moving average of the weights (the ema preset's), as validated", file=sys.stderr)
    return Trained(path, model, datamodule)


def build(base: type, arguments: dict[str, Any]) -> Any:
    """An object of ``base`` built from checked saved arguments (``{"_class_path": ..., <argument>: ...}``), as
    Lightning's ``load_from_checkpoint`` builds it (``lightning.pytorch.cli.instantiate_module``).

    Raises:
        engine.errors.UserError: what a constructor raised as a user error (a refused model folder).
        engine.checkpoints.CheckpointError: a file the arguments need could not be read (a tokenizer
            missing from the cache), or a package a class needs is not installed, in one line.
    """
    try:
        return instantiate_module(base, {key: value for key, value in arguments.items() if key != "_instantiator"})
    except Exception as error:  # jsonargparse wraps what a constructor raises: say the cause in one line
        cause = next((e for e in causes(error) if isinstance(e, UserError | OSError | ImportError)), None)
        if isinstance(cause, UserError):
            raise cause from error
        if cause is None:
            raise  # a bug in a constructor keeps its traceback
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise CheckpointError(f"the checkpoint's {base.__name__} could not be rebuilt: {first}") from error


DISAGREE = "The file's weights and arguments disagree: use a checkpoint written by `make train`."


def build_model(checkpoint: dict[str, Any], arguments: dict[str, Any], path: Path) -> L.LightningModule:
    """The LightningModule of checked ``arguments`` holding ``checkpoint``'s weights; built on ``meta`` first.

    Raises:
        engine.checkpoints.CheckpointError: the weights' keys or shapes differ from the net the arguments
            build (checked on the ``meta`` device, before any memory is allocated).
    """
    try:
        with torch.device("meta"):
            shell = build(L.LightningModule, arguments)
    except UserError:
        raise
    except Exception:  # a net that cannot be built without memory (a pretrained one reads its files): checked after
        shell = None
    if shell is not None:
        check_fits(checkpoint, shell, path, DISAGREE)
    model = build(L.LightningModule, arguments)
    if is_overridden("configure_model", model):
        model.configure_model()
    model.on_load_checkpoint(checkpoint)
    if shell is None:  # checked after all, before the weights are copied in
        check_fits(checkpoint, model, path, DISAGREE)
    model.load_state_dict(checkpoint["state_dict"], strict=model.strict_loading)
    return model
