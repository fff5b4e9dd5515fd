"""A pretrained Hugging Face causal language model, fine-tuned whole or through LoRA: tokens (B, T) -> logits (B, T, V).

The model and its tokenizer come from a local folder or the local Hugging Face cache, never a
download; LoRA adapters and checkpoints that hold only them and a record of the base: :mod:`nets.hf`.

Shapes: B batch, T sequence length (<= block_size), V vocabulary (the model's embedding rows).
"""

{% if cookiecutter.use_serving == "yes" -%}
import copy
{% endif -%}
import functools
import inspect
{%- if cookiecutter.use_serving == "yes" %}
from collections.abc import Callable
from pathlib import Path
{%- endif %}
from typing import Any, Literal

import torch
import torch.nn.functional as F

from {{ cookiecutter.package_name }}.engine import ConfigError
from {{ cookiecutter.package_name }}.nets.hf import HFNet, LoRA, from_files, libraries
from {{ cookiecutter.package_name }}.nets.hub import locate

__all__ = [{{ '"HFBatchCache", ' if cookiecutter.use_serving == "yes" else "" }}"HFCache", "HFCausalLM", "LoRA"]


class HFCache:
    """A Hugging Face model's key/value cache (``past_key_values``) for B rows of ``length`` positions, row b holding
    ``lengths[b]`` tokens.

    Rows may hold sequences of different lengths (answers decoded together, one forward pass for all):
    ``mask`` (B, length) marks each row's padding, which the attention mask hides, and each row's tokens get
    their own position ids, as transformers' ``generate`` does for a padded batch. Keys and values already
    carry their positions (rotary or learnt), so padding a row does not change them.
    """

    def __init__(self, batch_size: int = 1) -> None:
        self.past: Any = None  # transformers' cache, (B, heads, length, head width) per layer; None while empty
        self.lengths = [0] * batch_size  # tokens each row holds: its next token's position
        self.length = 0  # positions of every row, its padding included
        self.mask: torch.Tensor | None = None  # (B, length) int64: 0 on a row's padding; None: no padding
{%- if cookiecutter.use_serving == "yes" %}


class HFBatchCache(HFCache):
    """An :class:`HFCache` whose rows :meth:`select` drops, :meth:`extend` adds and :meth:`forget` shortens between
    steps: transformers' plain ``DynamicLayer`` per layer, padded and indexed here (a model whose every layer sees
    the whole context)."""

    def select(self, rows: list[int]) -> None:
        """Keep the rows ``rows``, in that order (continuous batching: Yu et al., "Orca", OSDI 2022); padding
        that no row needs any more is dropped."""
        self.lengths = [self.lengths[row] for row in rows]
        if not rows or self.past is None:
            self.past, self.length, self.mask = None, 0, None
            return
        index = torch.tensor(rows, dtype=torch.long, device=self._layers()[0].keys.device)
        unused = 0  # padding columns left of every row
        if self.mask is not None:
            self.mask = self.mask.index_select(0, index)
            unused = int(self.mask.any(dim=0).nonzero()[0])
            self.mask = None if self.mask[:, unused:].all() else self.mask[:, unused:]
        for layer in self._layers():
            layer.keys = layer.keys.index_select(0, index)[..., unused:, :]
            layer.values = layer.values.index_select(0, index)[..., unused:, :]
        self.length -= unused

    def extend(self, other: HFCache) -> None:
        """Add ``other``'s rows after these (same model), each cache left-padded to the longer one's length."""
        if self.past is None or not self.lengths:
            other._layers()  # a cache whose rows cannot be padded is refused before it is shared
            self.past, self.lengths, self.length, self.mask = other.past, list(other.lengths), other.length, other.mask
            return
        length = max(self.length, other.length)
        for mine, theirs in zip(self._layers(), other._layers(), strict=True):
            mine.keys = torch.cat([_left_padded(mine.keys, length), _left_padded(theirs.keys, length)])
            mine.values = torch.cat([_left_padded(mine.values, length), _left_padded(theirs.values, length)])
        mask = torch.cat([_left_padded(cache.full_mask(), length) for cache in (self, other)])  # (B, length)
        self.mask = None if mask.all() else mask
        self.lengths, self.length = self.lengths + other.lengths, length

    def forget(self, counts: list[int]) -> None:
        """Forget the last ``counts[b]`` tokens of each row b: the padding fed after a shorter prompt when prompts
        of different lengths are prefilled together (masked from then on)."""
        if any(counts):
            mask = self.full_mask().clone()
            for row, count in enumerate(counts):
                mask[row, self.length - count :] = 0
            self.mask = mask
            self.lengths = [length - count for length, count in zip(self.lengths, counts, strict=True)]

    def full_mask(self) -> torch.Tensor:
        """``mask``, ones where it is None: (B, length) int64."""
        if self.mask is not None:
            return self.mask
        return torch.ones(len(self.lengths), self.length, dtype=torch.long, device=self._layers()[0].keys.device)

    def _layers(self) -> list[Any]:
        """Each layer's cache (transformers' ``DynamicLayer``): ``keys`` and ``values`` (B, heads, length, head width).

        Raises:
            TypeError: a cache of another kind (sliding window, quantized, recurrent), whose rows cannot be padded.
        """
        layers = getattr(self.past, "layers", None)
        if not layers or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers or [self.past]})
            raise TypeError(f"rows of a {', '.join(kinds)} cache cannot be padded: decode its answers one at a time")
        return layers


def _left_padded(states: torch.Tensor, length: int) -> torch.Tensor:
    """Keys or values (B, heads, T, head width), or a mask (B, T), with zeros before them to ``length`` positions."""
    padding = length - states.shape[-2 if states.dim() == 4 else -1]
    return F.pad(states, (0, 0, padding, 0) if states.dim() == 4 else (padding, 0))
{%- endif %}


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
        """An empty :class:`HFCache` of ``batch_size`` rows (transformers' cache, made by its first use).
{%- if cookiecutter.use_serving == "yes" %}

        Only a model whose every layer attends to the whole context keeps a plain cache whose rows can be
        padded: for a model with sliding-window or other layers the cache lacks ``extend`` and ``select``, and
        answers meant to be decoded together are each decoded alone.
        """
        return (HFBatchCache if self._full_attention else HFCache)(batch_size)
{%- else %}"""
        return HFCache(batch_size)
{%- endif %}

    def forward(
        self, tokens: torch.Tensor, cache: "HFCache | None" = None, logits_to_keep: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """Token ids (B, T) int64 -> next-token logits (B, T, V), float32.

        With a ``cache``, the tokens continue those it holds (``use_cache=True``, transformers'
        ``past_key_values``), which it then holds too; its rows may differ in length (:class:`HFCache`).
        ``logits_to_keep`` (transformers' argument): n > 0, the last n positions' logits only, (B, n, V); a
        tensor (K,) of positions, theirs, (B, K, V); sliced here for a model whose forward lacks it.
        """
        sliced = not isinstance(logits_to_keep, int) or logits_to_keep > 0
        if sliced and "logits_to_keep" not in self._forward_parameters:
            logits = self(tokens, cache)
            return logits[:, -logits_to_keep:] if isinstance(logits_to_keep, int) else logits[:, logits_to_keep]
        options: dict[str, Any] = {"logits_to_keep": logits_to_keep} if sliced else {}
        if cache is None:
            return self.model(input_ids=tokens, use_cache=False, **options).logits.float()
        fed = tokens.shape[1]
        if cache.mask is not None:  # rows with padding: hidden from the attention, each row at its own positions
            cache.mask = F.pad(cache.mask, (0, fed), value=1)  # (B, length + T)
            held = torch.tensor(cache.lengths, device=tokens.device)[:, None]  # (B, 1)
            options["attention_mask"] = cache.mask
            options["position_ids"] = held + torch.arange(fed, device=tokens.device)  # (B, T)
        # transformers 5.0 calls the cache past_key_values; later 5.x releases call it cache (and warn of the old name).
        name = "cache" if "cache" in self._forward_parameters else "past_key_values"
        output = self.model(input_ids=tokens, use_cache=True, **{name: cache.past}, **options)
        cache.past = getattr(output, name)
        cache.lengths, cache.length = [length + fed for length in cache.lengths], cache.length + fed
        return output.logits.float()
{%- if cookiecutter.use_serving == "yes" %}

    @functools.cached_property
    def _full_attention(self) -> bool:
        """Whether every layer attends to the whole context (no sliding window, no recurrent or other layers)."""
        config = self.model.config
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        windowed = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
        return kinds == {"full_attention"} and not windowed
{%- endif %}

    @functools.cached_property
    def _forward_parameters(self) -> frozenset[str]:
        base = self.model.get_base_model() if hasattr(self.model, "get_base_model") else self.model  # under peft
        return frozenset(inspect.signature(base.forward).parameters)
{%- if cookiecutter.use_serving == "yes" %}

    def write_hf_folder(self, folder: Path) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[str]]:
        """Write a Hugging Face folder of the model with the adapters merged into the weights (``save_pretrained``,
        safetensors) and the base's tokenizer (``make export``'s ``hf/``); return the logits (B, T, V) of the folder
        reloaded by transformers, and the model card's lines on loading it.

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
        usage = [
            "`hf/`: a Hugging Face model folder (adapters merged), loaded without this project:",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            "",
            'model, tokenizer = AutoModelForCausalLM.from_pretrained("hf"), AutoTokenizer.from_pretrained("hf")',
            'ids = model.generate(**tokenizer("Call me", return_tensors="pt"), max_new_tokens=40)',
            "```",
        ]
        return (lambda tokens: reloaded(input_ids=tokens, use_cache=False).logits.float()), usage
{%- endif %}
