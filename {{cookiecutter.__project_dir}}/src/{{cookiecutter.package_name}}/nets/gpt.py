"""A decoder-only transformer (GPT) over byte tokens: token ids (B, T) -> next-token logits (B, T, V).

The architecture of GPT-2 (Radford et al., "Language Models are Unsupervised Multitask Learners",
2019) in its pre-norm form: each block is x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x)).
Attention is causal self-attention (Vaswani et al., "Attention Is All You Need", NeurIPS 2017)
through ``torch.nn.functional.scaled_dot_product_attention``, which picks a fused kernel
(FlashAttention on recent GPUs: Dao et al., 2022). Learned position embeddings; the output layer
shares its weight with the token embedding (Press & Wolf, "Using the Output Embedding to Improve
Language Models", EACL 2017). Activation checkpointing per block (Chen et al., "Training Deep Nets
with Sublinear Memory Cost", 2016) trades a second forward pass for activation memory. Generation
keeps each block's keys and values in a :class:`KVCache`, so a new token costs one position's
work instead of the whole context's (the key/value cache of Pope et al., "Efficiently Scaling
Transformer Inference", MLSys 2023).

Shapes: B batch, T sequence length (<= block_size), C width (n_embd), H heads, V vocabulary.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from {{ cookiecutter.package_name }}.engine import ConfigError


class KVCache:
    """Keys and values of the tokens decoded so far, for every block: row b holds ``lengths[b]`` positions.

    Preallocated to the context, (L, B, H, block_size, C / H) each (L blocks), in the weights'
    dtype and device: appending a token writes one position instead of copying the cache. Rows may
    hold sequences of different lengths, each at its own positions (padded slots: sequences decoded
    together, one forward pass for all){% if cookiecutter.use_serving == "yes" %}; :meth:`select` and :meth:`extend` drop rows and add another
    cache's, so sequences leave and join between steps (continuous batching: Yu et al., "Orca", OSDI 2022){% endif %}.
    """

    def __init__(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> None:
        self.keys = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, H, block_size, C / H)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.lengths = [0] * shape[1]  # positions filled in each row, its next token's position

    @property
    def length(self) -> int:
        """The positions filled in every row, for a cache whose rows are all as long (0 when it has none).

        Raises:
            ValueError: the rows hold sequences of different lengths.
        """
        if len(set(self.lengths)) > 1:
            raise ValueError(f"the cache's rows hold {sorted(set(self.lengths))} positions: no one length")
        return self.lengths[0] if self.lengths else 0
{%- if cookiecutter.use_serving == "yes" %}

    def select(self, rows: list[int]) -> None:
        """Keep the rows ``rows``, in that order (a copy of those rows)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.keys.device)
        self.keys, self.values = self.keys.index_select(1, index), self.values.index_select(1, index)
        self.lengths = [self.lengths[row] for row in rows]

    def extend(self, other: "KVCache") -> None:
        """Add ``other``'s rows after these (same net, same context)."""
        self.keys = torch.cat([self.keys, other.keys], dim=1)
        self.values = torch.cat([self.values, other.values], dim=1)
        self.lengths = self.lengths + other.lengths

    def forget(self, counts: list[int]) -> None:
        """Forget the last ``counts[b]`` tokens of each row b: the padding fed after a shorter prompt when prompts
        of different lengths are prefilled together (the row's next tokens overwrite their slots)."""
        self.lengths = [length - count for length, count in zip(self.lengths, counts, strict=True)]
{%- endif %}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which position t attends to positions <= t only."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)  # queries, keys and values in one matmul
        self.proj = nn.Linear(n_embd, n_embd)
        self.dropout = dropout
        self.proj_dropout = nn.Dropout(dropout)

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``positions`` (B, T): each new token's position, for a cache whose rows differ in length."""
        b, t, c = x.shape  # B, T, C
        q, k, v = self.qkv(x).split(c, dim=2)  # 3 x (B, T, C)
        # (B, T, C) -> (B, H, T, C / H): the heads attend independently
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if cache is None:
            y = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
            )  # (B, H, T, C / H)
        elif positions is None:
            # The T new positions follow the cache's `start`: they attend to every cached position
            # and causally among themselves.
            start, end = cache.length, cache.length + t
            cache.keys[layer, :, :, start:end], cache.values[layer, :, :, start:end] = k, v
            k, v = cache.keys[layer, :, :, :end], cache.values[layer, :, :, :end]  # (B, H, start + T, C / H)
            mask = None if t == 1 else torch.ones(t, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, C / H)
        else:
            # Each row at its own positions: written there, and each token attends to its row's
            # positions up to its own (what lies beyond a row's length is another answer's padding).
            rows = torch.arange(b, device=x.device)[:, None]  # (B, 1)
            keys, values = cache.keys[layer], cache.values[layer]  # (B, H, block_size, C / H), views
            keys[rows, :, positions], values[rows, :, positions] = k.transpose(1, 2), v.transpose(1, 2)
            end = max(cache.lengths) + t
            visible = torch.arange(end, device=x.device) <= positions[:, :, None]  # (B, T, end)
            y = F.scaled_dot_product_attention(
                q, keys[:, :, :end], values[:, :, :end], attn_mask=visible[:, None]
            )  # (B, H, T, C / H)
        y = y.transpose(1, 2).contiguous().view(b, t, c)  # heads side by side again
        return self.proj_dropout(self.proj(y))


class Block(nn.Module):
    """A pre-norm transformer block: attention, then a 4x-wide MLP, each added to the residual stream."""

    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(n_embd)
        self.attention = CausalSelfAttention(n_embd, n_head, dropout)
        self.norm2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd),
            nn.Dropout(dropout),
        )

    def forward(
        self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0, positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), cache, layer, positions)  # (B, T, C)
        return x + self.mlp(self.norm2(x))  # (B, T, C)


class GPT(nn.Module):
    """A GPT language model.

    Args:
        vocab_size: number of token ids V (256 for bytes; linked from the DataModule).
        block_size: the longest context T in tokens (the position-embedding table's size).
        n_layer: number of transformer blocks.
        n_head: attention heads per block; must divide ``n_embd``.
        n_embd: the width C of the residual stream.
        dropout: dropout probability on attention weights, projections and embeddings.
        activation_checkpointing: recompute each block's activations in the backward pass
            instead of storing them (less memory, about a third more compute).

    Raises:
        ValueError: ``n_head`` does not divide ``n_embd``, or a size is not positive.
    """

    _no_split_modules = ("Block",)  # the FSDP units of the fsdp2 preset (engine.sharding)

    def __init__(
        self,
        vocab_size: int = 256,
        block_size: int = 128,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.1,
        activation_checkpointing: bool = False,
    ) -> None:
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("block_size", block_size), ("n_layer", n_layer)):
            if value < 1:
                raise ConfigError(f"model.init_args.net.init_args.{name} must be positive, got {value}")
        if n_head < 1 or n_embd % n_head:
            raise ConfigError(
                f"model.init_args.net.init_args.n_head ({n_head}) must divide n_embd ({n_embd}): "
                "each head gets n_embd / n_head channels"
            )
        if not 0.0 <= dropout < 1.0:
            raise ConfigError(f"model.init_args.net.init_args.dropout must be in [0, 1), got {dropout}")
        self.block_size = block_size
        self.activation_checkpointing = activation_checkpointing
        self.token_embedding = nn.Embedding(vocab_size, n_embd)
        self.position_embedding = nn.Embedding(block_size, n_embd)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.norm = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # weight tying: one (V, C) matrix
        self.apply(self._init_weights)
        # GPT-2: residual projections scaled by 1/sqrt(2 * n_layer), so the residual stream's
        # variance does not grow with depth.
        for name, parameter in self.named_parameters():
            if name.endswith(("attention.proj.weight", "mlp.2.weight")):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def new_cache(self, batch_size: int) -> KVCache:
        """An empty :class:`KVCache` for ``batch_size`` sequences of up to ``block_size`` tokens."""
        attention = self.blocks[0].attention
        head_dim = self.norm.normalized_shape[0] // attention.n_head
        shape = (len(self.blocks), batch_size, attention.n_head, self.block_size, head_dim)
        weight = self.head.weight
        return KVCache(shape, weight.device, weight.dtype)

    def forward(
        self, tokens: torch.Tensor, cache: KVCache | None = None, logits_to_keep: int | torch.Tensor = 0
    ) -> torch.Tensor:
        """Next-token logits (B, T, V) for token ids (B, T), T <= block_size.

        With a ``cache``, the tokens of each row continue the tokens that row holds (their positions
        follow), and their keys and values are added to it: rows of different lengths each go on from
        their own (one forward pass for sequences at different points). ``logits_to_keep`` (named and meant as
        in Hugging Face's causal LMs): n > 0, the logits of the last n positions only, (B, n, V); a tensor (K,)
        of positions, theirs, (B, K, V): a prompt's (T, V) logits are never all needed to decode.

        Raises:
            ValueError: a sequence (with its cached tokens) is longer than ``block_size``.
        """
        starts = [0] if cache is None else cache.lengths or [0]
        length = tokens.shape[1]  # T
        if max(starts) + length > self.block_size:
            raise ValueError(
                f"a sequence of {max(starts) + length} tokens is longer than the model's block_size {self.block_size}"
            )
        ragged = None  # (B, T) positions when the cache's rows differ in length
        if len(set(starts)) > 1:
            ragged = torch.tensor(starts, device=tokens.device)[:, None] + torch.arange(length, device=tokens.device)
            positions = ragged  # (B, T)
        else:
            positions = torch.arange(starts[0], starts[0] + length, device=tokens.device)  # (T,)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))  # (B, T, C)
        for layer, block in enumerate(self.blocks):
            if self.activation_checkpointing and self.training and cache is None:
                x = checkpoint(block, x, use_reentrant=False)  # (B, T, C), activations recomputed
            else:
                x = block(x, cache, layer, ragged)  # (B, T, C)
        if cache is not None:
            cache.lengths = [start + length for start in cache.lengths]
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep  # 0: all
        return self.head(self.norm(x[:, kept]))  # (B, T, V), or (B, K, V) kept
