"""A pretrained Hugging Face causal language model, fine-tuned whole or through LoRA: tokens (B, T) -> logits (B, T, V).

The model and its tokenizer come from a local folder or the local Hugging Face cache, never a
download; LoRA adapters and checkpoints that hold only them and a record of the base: :mod:`nets.hf`.

Shapes: B batch, T sequence length (<= block_size), V vocabulary (the model's embedding rows).
"""

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.nets.hf import HFNet, LoRA, from_files, libraries
from {{ cookiecutter.package_name }}.nets.hub import locate

__all__ = ["HFCache", "HFCausalLM", "LoRA"]


@dataclass
class HFCache:
    """A Hugging Face model's key/value cache (``past_key_values``) and the ``length`` of tokens it holds."""

    past: Any = None
    length: int = 0


class HFCausalLM(HFNet):
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
        transformers, _ = libraries(type(self).__name__)
        found = locate(model, revision)
        if lora is None and base_dtype != "float32":
            raise ConfigError(
                f"net.base_dtype={base_dtype} without LoRA would train {base_dtype} weights; keep float32 and set "
                "trainer.precision: bf16-mixed, or give net.lora"
            )
        base = from_files(
            transformers.AutoModelForCausalLM,
            found,
            "a complete causal language model",
            "give a folder that save_pretrained wrote, or fetch the model again",
            dtype=getattr(torch, base_dtype),
        )
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
        self.adopt(base, found, lora, task_type="CAUSAL_LM")

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

    def save_merged(self, folder: Path) -> Callable[[torch.Tensor], torch.Tensor]:
        """Write a Hugging Face folder of the model with the adapters merged into the weights (``save_pretrained``,
        safetensors) and the base's tokenizer; return the logits (B, T, V) of the folder reloaded by transformers.

        The folder needs neither this project nor peft: ``AutoModelForCausalLM.from_pretrained(folder)``.
        """
        transformers, _ = libraries(type(self).__name__)
        merged = copy.deepcopy(self.model).float()
        if self.lora is not None:
            merged = merged.merge_and_unload()
        merged.save_pretrained(folder, safe_serialization=True)
        options = {"local_files_only": True, "trust_remote_code": False}
        transformers.AutoTokenizer.from_pretrained(self.folder, **options).save_pretrained(folder)
        reloaded = transformers.AutoModelForCausalLM.from_pretrained(folder, use_safetensors=True, **options).eval()
        return lambda tokens: reloaded(input_ids=tokens, use_cache=False).logits.float()
