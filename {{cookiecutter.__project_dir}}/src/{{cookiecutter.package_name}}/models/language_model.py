"""Language modelling: next-token cross-entropy, bits per byte and perplexity, and sampling."""

import math
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn
from torchmetrics import MeanMetric, MetricCollection

from {{ cookiecutter.package_name }}.engine import TrainingModule, WarmupCosine
from {{ cookiecutter.package_name }}.engine.errors import ConfigError
from {{ cookiecutter.package_name }}.engine.module import CompileMode, adamw


class BitsPerToken(MeanMetric):
    """Mean next-token cross-entropy in bits: ``update(nats, weight=tokens)``, computed as nats / ln 2.

    With byte tokens this is bits per byte (bpb), comparable across tokenizers and with compressors.
    """

    def compute(self) -> torch.Tensor:
        return super().compute() / math.log(2)


class Perplexity(MeanMetric):
    """exp(mean next-token cross-entropy in nats): ``update(nats, weight=tokens)``.

    (torchmetrics' ``Perplexity`` takes the logits and recomputes their softmax; the loss is
    already at hand here.)
    """

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


class LanguageModel(TrainingModule):
    """Trains a ``net`` mapping token ids (B, T) to next-token logits (B, T, V) with cross-entropy.

    Logs ``{train,val,test}/loss`` (nats per token), ``/bpb`` (bits per token: bits per byte for
    byte tokens) and ``/ppl`` (perplexity).

    Args:
        net: the network (``nets.GPT``); its ``block_size`` bounds the context in :meth:`generate`.
        optimizer, lr_scheduler, compile, compile_mode, channels_last: see :class:`engine.TrainingModule`.
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerCallable = adamw,
        lr_scheduler: LRSchedulerCallable | None = WarmupCosine,
        compile: bool = False,
        compile_mode: CompileMode | None = None,
        channels_last: bool = False,
    ) -> None:
        super().__init__(net, optimizer, lr_scheduler, compile, compile_mode, channels_last)
        self.set_metrics(MetricCollection({"bpb": BitsPerToken(), "ppl": Perplexity()}))

    def shared_step(self, batch: tuple[torch.Tensor, torch.Tensor], metrics: MetricCollection) -> torch.Tensor:
        inputs, targets = batch  # (B, T), (B, T) token ids, targets shifted by one
        logits = self(inputs)  # (B, T, V)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean nats per token
        metrics.update(loss.detach(), weight=targets.numel())
        return loss

    # ---- inference: next-byte probabilities exported; greedy continuations served --------------------
    prediction_format = "jsonl"
    served_new_tokens = 64  # bytes each served or predicted prompt is continued by

    def output_head(self) -> nn.Module:
        """Logits (B, T, V) -> probabilities of the next token after the last position (B, V)."""
        return NextTokenProbabilities()

    def output_description(self) -> str:
        return "probabilities of the next byte (softmax over 256 values) after the last input token"

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """A prompt ``(tokens (1, T0),)`` -> its greedy continuation (1, served_new_tokens) token ids;
        test windows ``(inputs, targets)`` (B, T) -> bits per byte of each window (B,)."""
        if len(batch) == 1:
            completion = self.continue_greedily(lambda tokens: self.output_head()(self(tokens)), batch[0][0])
            return completion.unsqueeze(0)
        inputs, targets = batch[0], batch[1]
        nats = F.cross_entropy(self(inputs).transpose(1, 2), targets, reduction="none")  # (B, T)
        return nats.mean(dim=1) / math.log(2)

    @torch.no_grad()
    def continue_greedily(self, next_token_probabilities: Any, tokens: torch.Tensor) -> torch.Tensor:
        """The ``served_new_tokens`` likeliest next tokens (N,) after ``tokens`` (T0,), one at a time.

        ``next_token_probabilities`` maps (1, T) token ids to (1, V) probabilities (the Predictor,
        or an export of it); the context is the last ``block_size`` tokens.
        """
        block_size = self.net.block_size
        sequence = tokens
        for _ in range(self.served_new_tokens):
            probabilities = next_token_probabilities(sequence[-block_size:].unsqueeze(0))  # (1, V)
            sequence = torch.cat([sequence, probabilities.argmax(dim=-1)])
        return sequence[len(tokens) :]

    def infer(self, predictor: nn.Module, inputs: list[torch.Tensor]) -> list[str]:
        """Greedy continuations (text) of prompts given as token ids, one (T0,) tensor each."""
        device = next(predictor.parameters()).device
        return [_text(self.continue_greedily(predictor, prompt.to(device))) for prompt in inputs]

    def describe(self, outputs: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
        if outputs.dtype == torch.long:  # continuations of prompts
            return [{"completion": _text(row)} for row in outputs]
        return [{"bits_per_byte": round(value, 4)} for value in outputs.tolist()]

    def response(self, outputs: list[str], class_names: list[str]) -> dict[str, Any]:
        return {"completions": outputs}

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Next-byte accuracy and bits per byte of next-token probabilities (N, V) for the bytes (N,) that follow."""
        chosen = outputs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).clamp_min(1e-12)  # (N,)
        accuracy = (outputs.argmax(dim=-1) == targets).float().mean().item()
        return {"next_byte_acc": accuracy, "bits_per_byte": (-chosen.log2()).mean().item()}

    @torch.no_grad()
    def generate(
        self, tokens: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None
    ) -> torch.Tensor:
        """Continue ``tokens`` (B, T0) by sampling ``max_new_tokens`` tokens: (B, T0 + max_new_tokens).

        Each step feeds the last ``block_size`` tokens, divides the logits by ``temperature`` and,
        with ``top_k``, samples among the k likeliest tokens only (Fan et al., "Hierarchical Neural
        Story Generation", ACL 2018). Sampling draws from torch's global generator: seed it for a
        repeatable text.

        Raises:
            ValueError: ``temperature`` not above 0, ``top_k`` below 1, or a prompt longer than the
                context (``block_size``) or empty.
        """
        block_size = self.net.block_size
        if temperature <= 0:
            raise ConfigError(f"temperature must be above 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"top_k must be at least 1 (or None for all tokens), got {top_k}")
        if tokens.shape[1] == 0 or tokens.shape[1] > block_size:
            raise ConfigError(
                f"the prompt has {tokens.shape[1]} tokens (UTF-8 bytes); it must have 1 to {block_size} "
                "(the model's block_size): shorten it"
            )
        was_training = self.training
        self.eval()
        for _ in range(max_new_tokens):
            logits = self(tokens[:, -block_size:])[:, -1, :] / temperature  # (B, V), the last position's
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # (B, 1)
                logits = logits.masked_fill(logits < kth, float("-inf"))
            next_token = torch.multinomial(logits.softmax(dim=-1), num_samples=1)  # (B, 1)
            tokens = torch.cat([tokens, next_token], dim=1)
        self.train(was_training)
        return tokens


class NextTokenProbabilities(nn.Module):
    """Next-token logits (B, T, V) -> softmax of the last position's (B, V)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, :].softmax(dim=-1)


def _text(tokens: torch.Tensor) -> str:
    """Byte token ids (N,) as text; a multi-byte character cut in half shows as U+FFFD."""
    return bytes(tokens.tolist()).decode("utf-8", errors="replace")
