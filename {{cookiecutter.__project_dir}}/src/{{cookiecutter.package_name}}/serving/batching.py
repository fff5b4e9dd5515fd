"""Answers decoded together: one forward pass of the net per step for every answer in progress.

Continuous batching (iteration-level scheduling: Yu et al., "Orca", OSDI 2022): answers join and
leave between steps, and each step feeds the newest token of every answer in the batch through the
net at once, so a worker's tokens/s grow with its answers instead of being shared among them. The
net keeps one key/value cache whose rows are the answers, each at its own length (padded slots,
``nets.gpt.KVCache``{{ "; a Hugging Face model's rows padded and masked, ``nets.causal_lm.HFBatchCache``" if cookiecutter.use_pretrained == "yes" else "" }}): the
byte GPT's context is short (``block_size``), so a slot of the whole context per answer costs little
memory and keeps one contiguous tensor for the attention kernel, where pages (Kwon et al., "vLLM",
SOSP 2023) pay off for long contexts of very different lengths.

New answers' prompts are prefilled into a cache of their own, at most ``prefill_tokens`` prompt tokens
per step (chunked prefill: a long prompt never stalls the answers already decoding for longer than
that), then their rows join the batch. Whole prompts that fit the step's budget together are prefilled
in one forward pass, right-padded to the longest (the cache then forgets each row's padding); a prompt
longer than what is left is prefilled alone in chunks. Each answer picks its tokens with its own
``choose`` (temperature, top-p, seed), from its own row of the step's logits, and may ask for the
log-probability of each token it is given (its prompt's too: :class:`TokenScore`, what ``/v1/completions``
returns with ``logprobs`` and ``echo``). An answer longer than
the context is decoded alone from then on, as :func:`models.language_model.decode_steps` does: the
window slides, every position shifts, and its cache is rebuilt each step. A net whose cache cannot
hold rows of different lengths (no ``extend`` and ``select``{{ ": a Hugging Face model with sliding-window layers" if cookiecutter.use_pretrained == "yes" else "" }})
decodes each answer alone with its own cache, and a net without a cache (no ``new_cache``: a
user's own) each answer alone over its whole window.

Shapes: B answers in the batch, T tokens, V vocabulary.
"""

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from {{ cookiecutter.package_name }}.models.language_model import greedy, next_token_logits


@dataclass
class TokenScore:
    """A token and its log-probability (natural log) given the tokens before it (None: a prompt's first
    token, which nothing precedes), with the ``top`` likeliest tokens at its place, ``[(token, log-probability)]``
    likeliest first."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]]


@dataclass
class Decoding:
    """An answer's tokens: its prompt, then what was generated (the last not yet fed through the net)."""

    key: Hashable
    ids: list[int]
    choose: Callable[[torch.Tensor], torch.Tensor]
    prompt_length: int = 0
    prefilled: int = 0  # prompt tokens in ``cache`` so far
    cache: Any = None  # its own cache: while prefilled, and when decoded alone
    top_logprobs: int | None = None  # None: no scores; k: each token's score with the k likeliest
    score_prompt: bool = False


class DecodeBatch:
    """The answers in progress of one worker: :meth:`add`, :meth:`remove`, and :meth:`step` for the next
    token of each.

    Args:
        net: a language model net, token ids (B, T) -> logits (B, T, V), with ``block_size``, and
            optionally ``new_cache(batch_size)``; a cache with ``extend`` and ``select``
            (``nets.gpt.KVCache``) lets answers share one forward pass, and with ``forget`` prompts be
            prefilled together.
        prefill_tokens: the most prompt tokens prefilled in one step (at least 1; prompts prefilled
            together count their padding).

    Raises:
        ValueError: ``prefill_tokens`` below 1.
    """

    def __init__(self, net: nn.Module, prefill_tokens: int = 512) -> None:
        if prefill_tokens < 1:
            raise ValueError(f"prefill_tokens must be at least 1, got {prefill_tokens}")
        self.net, self.block_size, self.prefill_tokens = net, net.block_size, prefill_tokens
        self.device = next(net.parameters()).device
        self.cached = hasattr(net, "new_cache")
        empty = net.new_cache(0) if self.cached else None
        self.cache = empty if hasattr(empty, "extend") and hasattr(empty, "select") else None  # the shared rows
        self.rows: list[Decoding] = []  # in the order of the shared cache's rows
        self.waiting: list[Decoding] = []  # to prefill, first come first served
        self.alone: list[Decoding] = []  # decoded one at a time (past the context, or no shared cache)
        self.gone: set[Hashable] = set()  # shared rows removed since the last step, dropped from the cache together
        self.scores: dict[Hashable, list[TokenScore]] = {}  # scored tokens not yet taken (:meth:`take_scores`)

    def __len__(self) -> int:
        return len(self.rows) - len(self.gone) + len(self.waiting) + len(self.alone)

    def add(
        self,
        key: Hashable,
        prompt: list[int],
        choose: Callable[[torch.Tensor], torch.Tensor],
        top_logprobs: int | None = None,
        score_prompt: bool = False,
    ) -> None:
        """Queue an answer to ``prompt`` (token ids, at least one), its tokens picked by ``choose``
        (logits (1, V) -> (1, 1)); its first token comes from the step that finishes its prefill.

        ``top_logprobs`` k (0 or more) scores each generated token, with the k likeliest at its place, and
        ``score_prompt`` each prompt token too (the prompt must then fit the context): :meth:`take_scores`.

        Raises:
            ValueError: an empty prompt, a key already in the batch, a negative ``top_logprobs``, or a
                prompt to score that is longer than the context.
        """
        if not prompt:
            raise ValueError("an answer needs a prompt of at least one token")
        self._drop_gone()
        if any(sequence.key == key for sequence in (*self.rows, *self.waiting, *self.alone)):
            raise ValueError(f"answer {key!r} is already in the batch")
        if top_logprobs is not None and top_logprobs < 0:
            raise ValueError(f"top_logprobs must be at least 0, got {top_logprobs}")
        if score_prompt and len(prompt) > self.block_size:
            raise ValueError(f"a prompt to score is at most the context, {self.block_size} tokens; got {len(prompt)}")
        ids = list(prompt[-self.block_size :])  # the window the net reads, as decode_steps
        sequence = Decoding(key, ids, choose, prompt_length=len(ids), top_logprobs=top_logprobs)
        sequence.score_prompt = score_prompt and top_logprobs is not None
        if sequence.score_prompt:
            self.scores[key] = [TokenScore(ids[0], None, [])]
        if not self.cached:  # nothing to prefill: each step reads the whole window
            if sequence.score_prompt:
                window = torch.tensor([ids], device=self.device)  # (1, T)
                self._score(sequence, self.net(window)[0, :-1].float(), ids[1:])
            self.alone.append(sequence)
            return
        self.waiting.append(sequence)  # its cache is made when its prefill starts

    def take_scores(self, key: Hashable) -> list[TokenScore]:
        """The scores of answer ``key``'s tokens since the last call, in order (empty unless it asked)."""
        return self.scores.pop(key, [])

    def remove(self, key: Hashable) -> None:
        """Drop answer ``key`` (ended, or its client gone): its place is free at the next step. The shared cache
        is copied without the rows removed once, at the next step: answers that end together (a step's, or
        answers of the same length started together) cost one copy, not one each."""
        self.scores.pop(key, None)
        self.waiting = [sequence for sequence in self.waiting if sequence.key != key]
        self.alone = [sequence for sequence in self.alone if sequence.key != key]
        if any(sequence.key == key for sequence in self.rows):
            self.gone.add(key)

    def _drop_gone(self) -> None:
        """The shared rows :meth:`remove` was given leave the cache, in one copy of the rows kept."""
        if self.gone:
            kept = [row for row, sequence in enumerate(self.rows) if sequence.key not in self.gone]
            self.cache.select(kept)
            self.rows = [self.rows[row] for row in kept]
            self.gone.clear()

    def step(self) -> dict[Hashable, int]:
        """The next token of every answer that has one this step: :meth:`decode`, then :meth:`prefill`."""
        found = self.decode()
        return found | self.prefill()

    @torch.no_grad()
    def decode(self) -> dict[Hashable, int]:
        """The next token of every prefilled answer: one forward pass over the shared rows, one per answer
        decoded alone."""
        found: dict[Hashable, int] = {}
        self._drop_gone()
        self._leave_the_window()
        if self.rows:
            last = torch.tensor([[sequence.ids[-1]] for sequence in self.rows], device=self.device)  # (B, 1)
            logits = next_token_logits(self.net, last, self.cache)[:, -1, :]  # (B, V)
            found |= self._choose(self.rows, logits)
        for sequence in self.alone:
            found |= self._choose([sequence], self._alone_logits(sequence))
        return found

    @torch.no_grad()
    def prefill(self) -> dict[Hashable, int]:
        """Prefill the waiting prompts, first come first served, up to ``prefill_tokens`` prompt tokens: the first
        token of each whose whole prompt is now read (it then shares the decoding steps)."""
        found: dict[Hashable, int] = {}
        self._drop_gone()  # before the prefilled rows join the shared cache
        budget = self.prefill_tokens
        while self.waiting and budget > 0:
            together = self._whole_prompts(budget)
            if together:
                found |= self._prefill_together(together)
                budget -= len(together) * max(sequence.prompt_length for sequence in together)
                continue
            sequence = self.waiting[0]
            if sequence.cache is None:
                sequence.cache = self.net.new_cache(1)
            chunk = sequence.ids[sequence.prefilled : sequence.prefilled + budget]
            tokens = torch.tensor([chunk], device=self.device)  # (1, T)
            # (T, V) where the prompt is scored, else (1, V): the last position's
            all_logits = next_token_logits(self.net, tokens, sequence.cache, 0 if sequence.score_prompt else 1)[0]
            if sequence.score_prompt:  # each position's logits score the prompt's next token, if any
                following = sequence.ids[sequence.prefilled + 1 : sequence.prefilled + len(chunk) + 1]
                self._score(sequence, all_logits[: len(following)], following)
            logits = all_logits[-1:]  # (1, V)
            sequence.prefilled += len(chunk)
            budget -= len(chunk)
            if sequence.prefilled < sequence.prompt_length:
                continue  # the rest of this prompt at the next step
            self.waiting.pop(0)
            found |= self._choose([sequence], logits)
            self._join([sequence], sequence.cache, [0])
        return found

    def _whole_prompts(self, budget: int) -> list[Decoding]:
        """The waiting answers from the first on whose whole prompts, right-padded to the longest, fit ``budget``
        tokens (none when the net's cache cannot forget the padding or the first is a prompt in chunks)."""
        together: list[Decoding] = []
        if self.cache is None or not hasattr(self.cache, "forget"):
            return together
        longest = 0
        for sequence in self.waiting:
            longest = max(longest, sequence.prompt_length)
            if sequence.prefilled or (len(together) + 1) * longest > budget:
                break
            together.append(sequence)
        return together

    def _prefill_together(self, sequences: list[Decoding]) -> dict[Hashable, int]:
        """Prefill whole prompts in one forward pass, right-padded to the longest (the padding then forgotten by
        the cache), pick each one's first token and add them to the shared rows (or alone, past the context)."""
        longest = max(sequence.prompt_length for sequence in sequences)
        padded = [sequence.ids + [0] * (longest - sequence.prompt_length) for sequence in sequences]
        lasts = [sequence.prompt_length - 1 for sequence in sequences]
        scored = any(sequence.score_prompt for sequence in sequences)
        kept = list(range(longest)) if scored else sorted(set(lasts))  # the positions whose logits are needed
        cache = self.net.new_cache(len(sequences))
        tokens = torch.tensor(padded, device=self.device)  # (B, T)
        all_logits = next_token_logits(self.net, tokens, cache, 0 if scored else torch.tensor(kept, device=self.device))
        for row, sequence in enumerate(sequences):  # all_logits: (B, K, V)
            sequence.prefilled = sequence.prompt_length
            if sequence.score_prompt:  # each position's logits score the prompt's next token
                self._score(sequence, all_logits[row, : sequence.prompt_length - 1], sequence.ids[1:])
        self.waiting = self.waiting[len(sequences) :]
        rows = torch.arange(len(sequences), device=self.device)
        at = torch.tensor([kept.index(last) for last in lasts], device=self.device)
        found = self._choose(sequences, all_logits[rows, at])  # (B, V): each prompt's last position
        self._join(sequences, cache, [longest - sequence.prompt_length for sequence in sequences])
        return found

    def _join(self, sequences: list[Decoding], cache: Any, padding: list[int]) -> None:
        """Add the prefilled ``sequences``, the rows of ``cache`` (each followed by ``padding[b]`` tokens to forget),
        to the shared rows; those past the context are decoded alone, and without a shared cache each alone with
        its own. A cache whose rows turn out not to be paddable (``TypeError``: a model whose layers are not the
        kind its config names) switches sharing off: every answer is decoded alone from then on."""
        fits = [row for row, sequence in enumerate(sequences) if len(sequence.ids) <= self.block_size]
        if self.cache is None:
            self.alone += sequences
            return
        try:
            if any(padding):
                cache.forget(padding)
            if fits and len(fits) < len(sequences):
                cache.select(fits)
            if fits:
                self.cache.extend(cache)
        except TypeError:
            self.alone, self.rows, self.cache, fits = self.alone + self.rows, [], None, []
        for row, sequence in enumerate(sequences):
            sequence.cache = None  # shared, or rebuilt from its window when decoded alone
            (self.rows if row in fits else self.alone).append(sequence)

    def _choose(self, sequences: list[Decoding], logits: torch.Tensor) -> dict[Hashable, int]:
        """Each sequence's next token from its row of ``logits`` (B, V), read back in one transfer."""
        picked = logits.argmax(dim=-1, keepdim=True)  # (B, 1): every greedy answer at once
        sampled = [row for row, sequence in enumerate(sequences) if sequence.choose is not greedy]
        if sampled:
            picked = picked.clone()
            for row in sampled:
                picked[row] = sequences[row].choose(logits[row : row + 1])[0]
        tokens = picked[:, 0].tolist()
        for row, (sequence, token) in enumerate(zip(sequences, tokens, strict=True)):
            sequence.ids.append(token)
            if sequence.top_logprobs is not None:
                self._score(sequence, logits[row : row + 1], [token])
        return {sequence.key: token for sequence, token in zip(sequences, tokens, strict=True)}

    def _score(self, sequence: Decoding, logits: torch.Tensor, tokens: list[int]) -> None:
        """Note the score of each of ``tokens`` (N,) from the logits (N, V) of the positions before them."""
        if not tokens:
            return
        logprobs = torch.log_softmax(logits, dim=-1)  # (N, V)
        chosen = logprobs.gather(1, torch.tensor(tokens, device=logprobs.device)[:, None])[:, 0].tolist()  # (N,)
        top_values, top_ids = logprobs.topk(min(sequence.top_logprobs, logprobs.shape[-1]), dim=-1)  # (N, k)
        tops = [
            list(zip(ids, values, strict=True))
            for ids, values in zip(top_ids.tolist(), top_values.tolist(), strict=True)
        ]
        scores = self.scores.setdefault(sequence.key, [])
        scores += [TokenScore(*entry) for entry in zip(tokens, chosen, tops, strict=True)]

    def _leave_the_window(self) -> None:
        """Rows whose next token would pass the context leave the shared cache, to be decoded alone."""
        leaving = [row for row, sequence in enumerate(self.rows) if len(sequence.ids) > self.block_size]
        if leaving:
            kept = [row for row in range(len(self.rows)) if row not in leaving]
            self.alone += [self.rows[row] for row in leaving]
            self.cache.select(kept)
            self.rows = [self.rows[row] for row in kept]

    def _alone_logits(self, sequence: Decoding) -> torch.Tensor:
        """The next-token logits (1, V) of a sequence decoded alone, as ``decode_steps`` computes them."""
        if not self.cached:
            tokens = torch.tensor([sequence.ids[-self.block_size :]], device=self.device)  # (1, T)
            return next_token_logits(self.net, tokens)[:, -1, :]
        if sequence.cache is None or len(sequence.ids) > self.block_size:
            sequence.cache = self.net.new_cache(1)
            fed = sequence.ids[-self.block_size :]
        else:
            fed = sequence.ids[sequence.cache.length :]
        tokens = torch.tensor([fed], device=self.device)  # (1, T)
        return next_token_logits(self.net, tokens, sequence.cache)[:, -1, :]
