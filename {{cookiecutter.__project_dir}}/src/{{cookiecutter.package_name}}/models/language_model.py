"""Language modelling: next-token cross-entropy, bits per byte and perplexity, and sampling."""

import math

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

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """Log-probabilities (B, T) in nats of each target token given the tokens before it."""
        inputs, targets = batch[0], batch[1]
        log_probs = self(inputs).log_softmax(dim=-1)  # (B, T, V)
        return log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)

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
