"""A pretrained Hugging Face causal language model, fine-tuned whole or through LoRA: tokens (B, T) -> logits (B, T, V).

The model and its tokenizer come from a local folder or the local Hugging Face cache, never a
download (:mod:`engine.pretrained`). LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language
Models", ICLR 2022) freezes the base weights W and trains a low-rank update (alpha / r) * B A beside
chosen linear layers, through ``peft`` (https://huggingface.co/docs/peft): a few MB to train and
store instead of the whole model. A LoRA net's ``state_dict`` (so its checkpoints) holds the
adapters and a record of the base (its name, hub revision and SHA-256 of its weights), not the
base's weights: loading rebuilds the base from its files and refuses a base whose weights differ.

Shapes: B batch, T sequence length (<= block_size), V vocabulary (the model's embedding rows).
"""

import copy
import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.pretrained import fingerprint, locate
from {{ cookiecutter.package_name }}.engine.quiet import silence_export_noise


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


@dataclass
class HFCache:
    """A Hugging Face model's key/value cache (``past_key_values``) and the ``length`` of tokens it holds."""

    past: Any = None
    length: int = 0


class HFCausalLM(nn.Module):
    """``transformers.AutoModelForCausalLM`` from local files, with optional LoRA adapters.

    Args:
        model: a folder written by ``save_pretrained`` (or a hub snapshot), or a Hugging Face hub id
            in the local cache (``HF_HOME``); ``hf download <id>`` fetches one where there is internet.
        revision: branch, tag or commit of a hub id (default: the cached main).
        lora: LoRA settings, or null to fine-tune every weight.
        gradient_checkpointing: recompute each layer's activations in the backward pass (Chen et
            al., 2016): less activation memory for about a third more compute.
        base_dtype: dtype of the base weights. With LoRA the frozen base may be bfloat16 or float16
            (half the memory; the adapters stay float32); full fine-tuning keeps float32 weights
            (use ``trainer.precision: bf16-mixed`` for speed).
        vocab_size: the tokenizer's vocabulary (linked from the data by the CLI); it must fit the
            model's embedding.
        block_size: the longest context trained on (linked from the data); at most the model's
            ``max_position_embeddings``.

    Raises:
        FileNotFoundError: the model is neither a folder nor in the local cache (names the fetch command).
        ValueError: an incomplete model folder, a tokenizer larger than the embedding, a block
            size beyond the model's context, LoRA target modules the model lacks (lists those it
            has), or a half-precision base without LoRA.
        ImportError: transformers or peft is not installed (names the extra).
    """

    def __init__(
        self,
        model: str,
        revision: str | None = None,
        lora: LoRA | None = None,
        gradient_checkpointing: bool = False,
        base_dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        vocab_size: int | None = None,
        block_size: int | None = None,
    ) -> None:
        super().__init__()
        transformers, peft = _libraries()
        found = locate(model, revision)
        if lora is None and base_dtype != "float32":
            raise ConfigError(
                f"net.base_dtype={base_dtype} without LoRA would train {base_dtype} weights; keep float32 and set "
                "trainer.precision: bf16-mixed, or give net.lora"
            )
        try:
            base = transformers.AutoModelForCausalLM.from_pretrained(
                found.folder,
                local_files_only=True,
                dtype=getattr(torch, base_dtype),
                trust_remote_code=False,  # a folder's own Python never runs (engine.pretrained.check_data_only)
                use_safetensors=True,  # never a pickled pytorch_model.bin
            )
        except (OSError, ValueError, KeyError) as error:
            raise ConfigError(
                f"net.model: {found.folder} is not a complete causal language model ({error}); "
                "give a folder that save_pretrained wrote, or fetch the model again"
            ) from None
        rows = base.get_input_embeddings().num_embeddings
        if vocab_size is not None and vocab_size > rows:
            raise ConfigError(
                f"the tokenizer (data.tokenizer) has {vocab_size} tokens, more than the {rows} rows of {model}'s "
                "embedding: use the model's own tokenizer (data.init_args.tokenizer: the same as net.model)"
            )
        context = getattr(base.config, "max_position_embeddings", None)
        if block_size is not None and context is not None and block_size > context:
            raise ConfigError(
                f"data.block_size={block_size} is longer than {model}'s context ({context} positions): lower it"
            )
        self.block_size = block_size or context
        if gradient_checkpointing:
            # Non-reentrant checkpointing: gradients reach the adapters although the frozen
            # embedding's output does not require them. (transformers 5.24 renamed the method; the
            # old name warns there.)
            options = {"use_reentrant": False}
            if hasattr(base, "activation_checkpointing_enable"):
                base.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
            else:
                base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)
        if lora is not None:
            _check_targets(base, lora.target_modules)
            config = peft.LoraConfig(
                r=lora.r,
                lora_alpha=lora.alpha,
                lora_dropout=lora.dropout,
                target_modules=lora.target_modules,
                # GPT-2's Conv1D stores its weight (in, out): peft needs to know, and otherwise says so
                # in a warning on every build and sets it itself.
                fan_in_fan_out=_targets_conv1d(base, lora.target_modules),
                task_type="CAUSAL_LM",
            )
            with warnings.catch_warnings():
                # peft 0.21 asks transformers >= 5.20 for is_gradient_checkpointing, which warns that it is
                # deprecated: peft's note to itself, said on every build.
                warnings.filterwarnings(
                    "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
                )
                base = peft.get_peft_model(base, config)
        self.model = base
        self.folder = found.folder
        self.base = {"model": model, "revision": found.revision, "sha256": fingerprint(found.folder)}
        self.lora = asdict(lora) if lora is not None else None
        # The entries a checkpoint leaves out: with LoRA, every weight and buffer of the frozen base.
        trainable = {name for name, parameter in self.named_parameters() if parameter.requires_grad}
        kept = trainable | {"_extra_state"}
        self.base_keys = frozenset() if lora is None else frozenset(super().state_dict().keys() - kept)
        self.register_load_state_dict_post_hook(_base_keys_are_not_missing)
        self.train()  # from_pretrained returns the model in eval mode; a new nn.Module is in training mode

    def new_cache(self, batch_size: int) -> "HFCache":
        """An empty :class:`HFCache`: transformers' own key/value cache, made by the first call that uses it."""
        return HFCache()

    def forward(self, tokens: torch.Tensor, cache: "HFCache | None" = None) -> torch.Tensor:
        """Token ids (B, T) int64 -> next-token logits (B, T, V), float32.

        With a ``cache``, the tokens continue those it holds (``use_cache=True``, transformers'
        ``past_key_values``), which it then holds too.
        """
        if cache is None:
            return self.model(input_ids=tokens, use_cache=False).logits.float()
        # transformers 5.0 calls the cache past_key_values; later 5.x releases call it cache (and warn of the old name).
        name = "cache" if "cache" in self._forward_parameters else "past_key_values"
        output = self.model(input_ids=tokens, use_cache=True, **{name: cache.past})
        cache.past, cache.length = getattr(output, name), cache.length + tokens.shape[1]
        return output.logits.float()

    @functools.cached_property
    def _forward_parameters(self) -> frozenset[str]:
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # under peft
        return frozenset(inspect.signature(base.forward).parameters)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The module's state without the frozen base (LoRA): the adapters and ``_extra_state`` (the base's record)."""
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

    def save_merged(self, folder: Path) -> Callable[[torch.Tensor], torch.Tensor]:
        """Write a Hugging Face folder of the model with the adapters merged into the weights (``save_pretrained``,
        safetensors) and the base's tokenizer; return the logits (B, T, V) of the folder reloaded by transformers.

        The folder needs neither this project nor peft: ``AutoModelForCausalLM.from_pretrained(folder)``.
        """
        transformers, _ = _libraries()
        merged = copy.deepcopy(self.model).float()
        if self.lora is not None:
            merged = merged.merge_and_unload()
        merged.save_pretrained(folder, safe_serialization=True)
        options = {"local_files_only": True, "trust_remote_code": False}
        transformers.AutoTokenizer.from_pretrained(self.folder, **options).save_pretrained(folder)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, **options).eval()
        return lambda tokens: reloaded(input_ids=tokens, use_cache=False).logits.float()


def _base_keys_are_not_missing(module: HFCausalLM, incompatible: Any) -> None:
    """A LoRA checkpoint lacks the base's entries by design: drop them from the missing keys."""
    if not module.base_keys:
        return
    for key in list(incompatible.missing_keys):
        # The key as the loading module spells it: <prefix of this net>.<name in this net>.
        if any(key[i + 1 :] in module.base_keys for i, char in enumerate(key) if char == "."):
            incompatible.missing_keys.remove(key)


def _check_targets(model: nn.Module, targets: list[str] | str | None) -> None:
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


def _targets_conv1d(model: nn.Module, targets: list[str] | str | None) -> bool:
    """Whether the layers LoRA adapts are transformers' ``Conv1D`` (GPT-2's, weight stored (in, out)).

    With peft's default or "all-linear" targets (``targets`` None or a string), any Conv1D counts.
    """
    from transformers.pytorch_utils import Conv1D

    return any(
        isinstance(module, Conv1D)
        and (targets is None or isinstance(targets, str) or name.rpartition(".")[2] in targets)
        for name, module in model.named_modules()
    )


def _libraries() -> tuple[Any, Any]:
    """(transformers, peft), or ImportError naming the extra that installs them."""
    silence_export_noise()  # peft imports torchao (through transformers), whose loggers list missing CUDA kernels
    try:
        import peft
        import transformers
    except ImportError as error:
        raise ImportError(
            f"HFCausalLM needs transformers and peft ({error}); install them: pip install -e '.[finetune]' "
            "(make install does)"
        ) from None
    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars on every load
    return transformers, peft
