"""What every pretrained Hugging Face net here shares: offline files, LoRA through peft, and checkpoints
that hold only what was trained.

The model comes from a local folder or the local Hugging Face cache, never a download
(:mod:`nets.hub`). LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models",
ICLR 2022) freezes the base weights W and trains a low-rank update (alpha / r) * B A beside chosen
linear layers, through ``peft`` (https://huggingface.co/docs/peft). A LoRA net's ``state_dict`` (so
its checkpoints) holds the adapters, any layer trained whole beside them (a new head), and a record
of the base (its name, hub revision and SHA-256 of its weights), not the base's weights: loading
rebuilds the base from its files and refuses a base whose weights differ.
"""

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine import ConfigError
from {{ cookiecutter.package_name }}.nets.hub import Pretrained, fingerprint


@dataclass
class LoRA:
    """LoRA settings (``peft.LoraConfig``).

    Args:
        r: rank of the update (8 to 64 is usual).
        alpha: scale numerator: the update is multiplied by alpha / r.
        dropout: dropout on the adapters' input.
        target_modules: names of the linear layers that get adapters (``[q_proj, v_proj]``, or
            ``all-linear``); null for peft's default for the architecture.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.05
    target_modules: list[str] | str | None = None


class HFNet(nn.Module):
    """A pretrained Hugging Face model (``self.model``), whole or under LoRA, whose checkpoints leave out a
    frozen base. Subclasses build the model and call :meth:`adopt`."""

    def adopt(
        self,
        model: nn.Module,
        found: Pretrained,
        lora: LoRA | None,
        task_type: str,
        trained_whole: tuple[str, ...] = (),
    ) -> None:
        """Make ``model`` (from ``found``) this net's, with LoRA adapters when ``lora`` is given.

        ``trained_whole``: modules trained whole beside the adapters (a new head), kept in checkpoints.
        """
        _, peft = libraries(type(self).__name__)
        if lora is not None:
            check_targets(model, lora.target_modules)
            config = peft.LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                # GPT-2's Conv1D stores its weight (in, out): peft needs to know, and otherwise says so
                # in a warning on every build and sets it itself.
                fan_in_fan_out=targets_conv1d(model, lora.target_modules),
                modules_to_save=list(trained_whole) or None,
                task_type=task_type,
            )
            with warnings.catch_warnings():
                # peft 0.21 asks transformers >= 5.20 for is_gradient_checkpointing, which warns that it is
                # deprecated: peft's note to itself, said on every build.
                warnings.filterwarnings(
                    "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
                )
                model = peft.get_peft_model(model, config)
        self.model = model
        self.folder = found.folder
        self.base = {"model": found.source, "revision": found.revision, "sha256": fingerprint(found.folder)}
        self.lora = asdict(lora) if lora is not None else None
        # The entries a checkpoint leaves out: with LoRA, every weight and buffer of the frozen base.
        trainable = {name for name, parameter in self.named_parameters() if parameter.requires_grad}
        kept = trainable | {"_extra_state"}
        self.base_keys = frozenset() if lora is None else frozenset(super().state_dict().keys() - kept)
        self.register_load_state_dict_post_hook(_base_keys_are_not_missing)
        self.train()  # from_pretrained returns the model in eval mode; a new nn.Module is in training mode

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The state without the frozen base (LoRA): what was trained, and ``_extra_state`` (the base's record)."""
        state = super().state_dict(*args, **kwargs)
        prefix = kwargs.get("prefix", args[1] if len(args) > 1 else "")
        for key in self.base_keys:
            state.pop(prefix + key, None)
        return state

    def get_extra_state(self) -> dict[str, Any]:
        return {"base": self.base, "lora": self.lora}

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint trained on another base: its adapters would be applied to weights they never saw.

        Raises:
            ValueError: the base's weights differ from the checkpoint's base (names both).
        """
        saved = state.get("base", {})
        if saved.get("sha256") not in (None, self.base["sha256"]):
            raise ConfigError(
                f"the checkpoint was trained on {saved.get('model')} (weights sha256 {saved['sha256'][:12]}...), but "
                f"net.model is {self.base['model']} with other weights (sha256 {self.base['sha256'][:12]}...): "
                "point net.model at the base it was trained on"
            )


def from_files(auto_class: Any, found: Pretrained, kind: str, fix: str, new: str = "", **options: Any) -> nn.Module:
    """``auto_class.from_pretrained`` of ``found``'s folder, offline and never running the folder's code, with
    every weight from the folder: one the folder lacks, or holds in another shape, is refused, not initialised
    (transformers would initialise it with a note), but under the module named ``new`` (a new head).

    A folder is data: whatever transformers raises on it (a field of the wrong type in ``config.json``
    fails as a TypeError, an AttributeError, a dataclass validation error, a negative size as a
    RuntimeError) is the folder's fault and one line, but running out of memory.

    Raises:
        ValueError: the folder does not hold a ``kind`` model (names it, the error, and ``fix``), or its
            weight files lack most of the model its ``config.json`` declares (:func:`check_weights_present`).
    """
    if torch.get_default_device().type == "meta":  # engine.inference's shell: a pretrained net is built from its files
        raise NotImplementedError("a pretrained net is built from its files, not on the meta device")
    check_weights_present(auto_class, found, fix, num_labels=options.get("num_labels"))
    try:
        model, loaded = auto_class.from_pretrained(
            found.folder,
            local_files_only=True,
            trust_remote_code=False,  # a folder's own Python never runs (nets.hub.check_data_only)
            use_safetensors=True,  # never a pickled pytorch_model.bin
            output_loading_info=True,
            **options,
        )
    except (MemoryError, torch.OutOfMemoryError):
        raise
    except Exception as error:  # data: every failure of the loader on it is the folder's
        said = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise ConfigError(f"net.model: {found.folder} is not {kind} ({said}); {fix}") from None
    keys = [*loaded["missing_keys"], *(key if isinstance(key, str) else key[0] for key in loaded["mismatched_keys"])]
    initialised = sorted(key for key in keys if not (new and key.split(".")[0] == new))
    if initialised:
        raise ConfigError(
            f"net.model: {found.folder}'s weights do not fit the model its config.json declares: {len(initialised)} "
            f"tensor(s) missing or of another shape ({initialised[0]} first), which would start from noise; {fix}"
        )
    return model


def check_weights_present(auto_class: Any, found: Pretrained, fix: str, num_labels: int | None = None) -> None:
    """Refuse a folder whose ``.safetensors`` hold less than half the parameters its ``config.json`` declares.

    transformers initialises every weight a folder lacks: a 200-byte ``config.json`` declaring a large model
    beside a tiny weight file made it allocate and initialise hundreds of millions of numbers, and a
    partial copy trains from noise without a word. The model is built on the ``meta`` device (no memory)
    and its parameters counted against the tensors the files' headers declare; a new head (another
    number of classes) is a small part of a model, so half is the bound. The build itself is bounded
    too: past twice the files' tensors (and 64 more) it stops, so a config declaring a million layers
    costs no more than the files it came with (``register_module_parameter_registration_hook``).

    Raises:
        ConfigError: the weights hold less than half the declared parameters, or far fewer tensors than
            the model registers (both counts, and ``fix``).
    """
    import transformers
    from safetensors import safe_open

    files = sorted(found.folder.glob("*.safetensors"))
    if not files:
        return  # no weights at all: from_pretrained names the file it looked for
    stored, tensors = 0, 0
    for file in files:
        try:
            with safe_open(file, framework="pt") as weights:
                shapes = [weights.get_slice(name).get_shape() for name in weights.keys()]  # noqa: SIM118
        except Exception as error:  # safetensors' errors share no base class
            raise ConfigError(f"net.model: {file} is not a readable safetensors file ({error}); {fix}") from None
        stored, tensors = stored + sum(map(math.prod, shapes)), tensors + len(shapes)
    limit, registered = 2 * tensors + 64, [0]

    def count(*_: Any) -> None:
        registered[0] += 1
        if registered[0] > limit:
            raise ConfigError(
                f"net.model: {found.folder}'s config.json declares a model of more than {limit:,} weight tensors, "
                f"but its files hold {tensors:,}: most weights are missing (a partial copy?); {fix}"
            )

    extra = {} if num_labels is None else {"num_labels": num_labels}
    hook = torch.nn.modules.module.register_module_parameter_registration_hook(count)
    try:
        config = transformers.AutoConfig.from_pretrained(
            found.folder, local_files_only=True, trust_remote_code=False, **extra
        )
        with torch.device("meta"):
            declared = sum(parameter.numel() for parameter in auto_class.from_config(config).parameters())
    except (ConfigError, MemoryError, torch.OutOfMemoryError):
        raise
    except Exception:  # not a model of this kind: from_pretrained names the problem
        return
    finally:
        hook.remove()
    if stored < declared / 2:
        raise ConfigError(
            f"net.model: {found.folder} holds weights for {stored:,} numbers, but its config.json declares a model "
            f"of {declared:,} parameters: most weights are missing (a partial copy?); {fix}"
        )


def _base_keys_are_not_missing(module: HFNet, incompatible: Any) -> None:
    """A LoRA checkpoint lacks the base's entries by design: drop them from the missing keys."""
    if not module.base_keys:
        return
    for key in list(incompatible.missing_keys):
        # The key as the loading module spells it: <prefix of this net>.<name in this net>.
        if key in module.base_keys or any(key[i + 1 :] in module.base_keys for i, c in enumerate(key) if c == "."):
            incompatible.missing_keys.remove(key)


def check_targets(model: nn.Module, targets: list[str] | str | None) -> None:
    """Raise ConfigError naming the layers ``model`` has when a LoRA target is not among them.

    Candidates are the layers with a weight matrix (``nn.Linear``, GPT-2's ``Conv1D``, embeddings).
    """
    if targets is None or isinstance(targets, str):  # peft's default for the architecture, or "all-linear"
        return
    names = sorted(
        {
            name.rpartition(".")[2]
            for name, module in model.named_modules()
            if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.ndim == 2
        }
    )
    missing = [target for target in targets if target not in names]
    if missing:
        raise ConfigError(
            f"net.lora.target_modules: {model.config.model_type} has no layer named {', '.join(missing)}; "
            f"its layers with a weight matrix are: {', '.join(names)}"
        )


def targets_conv1d(model: nn.Module, targets: list[str] | str | None) -> bool:
    """Whether the layers LoRA adapts are transformers' ``Conv1D`` (GPT-2's, weight stored (in, out)).

    With peft's default or "all-linear" targets (``targets`` None or a string), any Conv1D counts.
    """
    from transformers.pytorch_utils import Conv1D

    return any(
        isinstance(module, Conv1D)
        and (targets is None or isinstance(targets, str) or name.rpartition(".")[2] in targets)
        for name, module in model.named_modules()
    )


def libraries(user: str) -> tuple[Any, Any]:
    """(transformers, peft), or ImportError naming the extra that installs them for ``user`` (a net's name)."""
{%- if cookiecutter.use_serving == "yes" %}
    from {{ cookiecutter.package_name }}.engine.export import silence_export_noise

    silence_export_noise()  # peft imports torchao (through transformers), whose loggers list missing CUDA kernels
{%- endif %}
    try:
        import peft
        import transformers
    except ImportError as error:
        raise ImportError(
            f"{user} needs transformers and peft ({error}); install them: pip install -e '.[finetune]' "
            "(make install does)"
        ) from None
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars on every load
    return transformers, peft
