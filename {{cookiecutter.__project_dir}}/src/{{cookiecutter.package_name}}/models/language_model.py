"""Language modelling: next-token cross-entropy, bits per byte and perplexity, and sampling.

Bits per byte (total nats / total UTF-8 bytes of the predicted text / ln 2) compares models whose
tokenizers differ (bytes, a BPE trained on the text, a pretrained model's); the loss stays in nats
per token.
"""

import functools
import inspect
import math
from collections.abc import Callable, Iterator{{ ', Sequence' if cookiecutter.use_serving == "yes" else '' }}
{%- if cookiecutter.use_serving == "yes" %}
from dataclasses import dataclass
{%- endif %}
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection

from {{ cookiecutter.package_name }}.data.tokenizer import BPE, BYTES, {{ "ChatTemplate, " if cookiecutter.use_serving == "yes" else "" }}Tokenizer, load_tokenizer, saved_bpe
from {{ cookiecutter.package_name }}.engine import CheckpointError, ConfigError, TrainingModule, WeightedMean

IGNORE = -100  # a target the loss skips (a prompt position in supervised fine-tuning, padding)


class BitsPerByte(WeightedMean):
    """Total next-token cross-entropy over total text bytes, in bits: ``update(nats / bytes, weight=bytes)``.

    The mean of nats per byte weighted by bytes is total nats / total bytes; divided by ln 2 it is
    bits per byte (bpb), comparable across tokenizers and with compressors.
    """

    def compute(self) -> torch.Tensor:
        return super().compute() / math.log(2)


class Perplexity(WeightedMean):
    """exp(mean next-token cross-entropy in nats): ``update(nats, weight=tokens)``.

    (torchmetrics' ``Perplexity`` takes the logits and recomputes their softmax; the loss is
    already at hand here.)
    """

    def compute(self) -> torch.Tensor:
        return super().compute().exp()


class LanguageModel(TrainingModule):
    """Trains a ``net`` mapping token ids (B, T) to next-token logits (B, T, V) with cross-entropy.

    Logs ``{train,val,test}/loss`` (nats per token), ``/bpb`` (bits per byte of text) and ``/ppl``
    (perplexity per token). A batch is (inputs (B, T), targets (B, T)) token ids, targets shifted by
    one, and optionally the targets' UTF-8 byte counts (B, T) (without: one byte per token); a target
    of -100 is not scored (prompt tokens in supervised fine-tuning, padding).

    Args:
        net: the network (``nets.GPT``{{ ', ``nets.HFCausalLM``' if cookiecutter.use_pretrained == "yes" else '' }}); its ``block_size`` bounds the context in
            :meth:`generate`.
        tokenizer: the tokenizer's source (linked from the data by the CLI): None or ``bytes``, ``bpe``
            for a BPE the DataModule trained (taken from the trainer's DataModule in ``setup`` and
            saved in every checkpoint){{ ', else the pretrained model whose tokenizer it is' if cookiecutter.use_pretrained == "yes" else '' }}. Generation{% if cookiecutter.use_serving == 'yes' %}
            and serving decode{% else %} decodes{% endif %} with it.
        **kwargs: the settings every task shares (optimizer, lr_scheduler, compile, compile_mode,
            channels_last, init_from), declared once by :class:`engine.TrainingModule`.
{%- if cookiecutter.use_pretrained == "yes" %}

    Raises:
        ValueError: the tokenizer's vocabulary is not the pretrained net's own.
{%- endif %}
    """

    def __init__(
        self,
        net: nn.Module,
        tokenizer: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(net, **kwargs)
        self._tokenizer: Tokenizer | None = None if tokenizer == BPE else load_tokenizer(tokenizer)
{%- if cookiecutter.use_pretrained == "yes" %}
        if self._tokenizer is not None:
            check_tokenizer_fits(net, self._tokenizer)
{%- endif %}
        # Updated one by one (their inputs differ): no compute groups, which would share one state.
        self.set_metrics(MetricCollection({"bpb": BitsPerByte(), "ppl": Perplexity()}, compute_groups=False))

    @property
    def tokenizer(self) -> Tokenizer:
        """The tokenizer generation{{ ' and serving decode' if cookiecutter.use_serving == 'yes' else ' decodes' }} with; a trained BPE comes from the checkpoint.

        Raises:
            engine.checkpoints.CheckpointError: a ``bpe`` model neither trained nor loaded from a checkpoint.
        """
        if self._tokenizer is None:
            raise CheckpointError(
                "the model's tokenizer is a trained BPE, which comes with its checkpoint or its DataModule: "
                "load the model from a checkpoint (LanguageModel.load_from_checkpoint)"
            )
        return self._tokenizer

    # A trained BPE is the DataModule's; the model keeps a copy in each checkpoint to decode with.
    def setup(self, stage: str) -> None:
        super().setup(stage)
        # No Trainer when a loop of its own{{ " (make bench's plain loop)" if cookiecutter.use_benchmark == 'yes' else '' }} calls setup: no DataModule to ask.
        datamodule = getattr(self._trainer, "datamodule", None)
        if self.hparams.tokenizer == BPE and datamodule is not None:
            self._tokenizer = datamodule.tokenizer

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.hparams.tokenizer == BPE:
            checkpoint["tokenizer"] = self.tokenizer.to_json()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if self.hparams.tokenizer == BPE:
            if "tokenizer" not in checkpoint:
                raise CheckpointError("the model's tokenizer is a trained BPE, but the checkpoint holds none")
            self._tokenizer = saved_bpe(checkpoint["tokenizer"], self._tokenizer)

    def check_initial_checkpoint(self, checkpoint: dict[str, Any], where: str) -> None:
        """Refuse ``init_from`` weights learnt with another tokenizer: the same ids would mean other text."""
        saved = (checkpoint.get("hyper_parameters") or {}).get("tokenizer")
        now = self.hparams.tokenizer
        same_source = (saved or BYTES) == (now or BYTES)
        datamodule = getattr(self._trainer, "datamodule", None)
        if same_source and now == BPE and datamodule is not None:
            same_source = checkpoint.get("tokenizer") == datamodule.tokenizer.to_json()
        if not same_source:
            raise CheckpointError(
                f"{where} was trained with the tokenizer {saved or BYTES!r} and this run's data uses "
                f"{now or BYTES!r}{' (another BPE)' if saved == now else ''}: set data.init_args.tokenizer "
                "to the checkpoint's (a BPE trained on other text gives other ids: use the checkpoint's run's data)"
            )

    def shared_step(self, batch: tuple[torch.Tensor, ...], metrics: MetricCollection) -> torch.Tensor:
        inputs, targets = batch[0], batch[1]  # (B, T), (B, T) token ids, targets shifted by one
        logits = self(inputs)  # (B, T, V)
        nats = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum")
        tokens = (targets != IGNORE).sum()
        text_bytes = batch[2].sum() if len(batch) > 2 else tokens  # (B, T) byte counts, 0 where ignored
        loss = nats / tokens  # mean nats per scored token
        metrics["bpb"].update(nats.detach() / text_bytes, weight=text_bytes)
        metrics["ppl"].update(loss.detach(), weight=tokens)
        return loss

    # ---- inference: next-byte probabilities exported; greedy continuations served --------------------
    prediction_format = "jsonl"
    served_new_tokens = 64  # bytes each served or predicted prompt is continued by

    def output_head(self) -> nn.Module:
        """Logits (B, T, V) -> probabilities of the next token after the last position (B, V)."""
        return NextTokenProbabilities()
{%- if cookiecutter.use_serving == "yes" %}

    def output_description(self) -> str:
        if self.tokenizer.source is None:
            return "probabilities of the next byte (softmax over 256 values) after the last input token"
        return f"probabilities of the next token ({self.tokenizer.vocab_size} values) after the last input token"
{%- endif %}

    def predict_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        """A prompt ``(tokens (1, T0),)`` -> its greedy continuation (1, N) token ids, N <= served_new_tokens;
        test windows ``(inputs, targets[, bytes])`` (B, T) -> bits per byte of each window (B,)."""
        if len(batch) == 1:
            return decode(self.net, batch[0][:1], self.served_new_tokens, greedy, stop_id=self.tokenizer.eos_id)
        inputs, targets = batch[0], batch[1]
        nats = F.cross_entropy(self(inputs).transpose(1, 2), targets, ignore_index=IGNORE, reduction="none")  # (B, T)
        text_bytes = batch[2] if len(batch) > 2 else (targets != IGNORE)  # (B, T)
        return nats.sum(dim=1) / text_bytes.sum(dim=1).clamp_min(1) / math.log(2)
{%- if cookiecutter.use_serving == "yes" %}

    @torch.no_grad()
    def continue_greedily(self, next_token_probabilities: Any, tokens: torch.Tensor) -> torch.Tensor:
        """Up to ``served_new_tokens`` likeliest next tokens (N,) after ``tokens`` (T0,), one at a time,
        ending early at the tokenizer's end-of-text token (kept out of the result).

        ``next_token_probabilities`` maps (1, T) token ids to (1, V) probabilities: an export of the
        Predictor, which has no cache, so each step feeds the whole context (the last ``block_size``
        tokens). The Predictor itself decodes with its cache (:meth:`infer`).
        """
        block_size = self.net.block_size
        sequence = tokens
        for _ in range(self.served_new_tokens):
            probabilities = next_token_probabilities(sequence[-block_size:].unsqueeze(0))  # (1, V)
            next_token = probabilities.argmax(dim=-1)  # (1,)
            if next_token.item() == self.tokenizer.eos_id:
                break
            sequence = torch.cat([sequence, next_token])
        return sequence[len(tokens) :]

    def infer(self, predictor: nn.Module, inputs: list[torch.Tensor]) -> list[str]:
        """Greedy continuations (text) of prompts given as token ids, one (T0,) tensor each.

        The Predictor decodes with its net's key/value cache; an export (no cache) through
        :meth:`continue_greedily`.
        """
        net = getattr(predictor, "net", None)
        if net is None:
            return [self.tokenizer.decode(self.continue_greedily(predictor, ids).tolist()) for ids in inputs]
        device = next(predictor.parameters()).device
        eos = self.tokenizer.eos_id
        completions = [
            decode(net, predictor.transform(ids.to(device).unsqueeze(0)), self.served_new_tokens, greedy, eos)
            for ids in inputs
        ]
        return [self.tokenizer.decode(completion[0].tolist()) for completion in completions]
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}

    # ---- chat: what the OpenAI API serves (serving/openai_api.py) --------------------------------------
    def chat_template(self) -> ChatTemplate:
        """How a conversation becomes this model's prompt: its tokenizer's chat template, or the plain one."""
        return ChatTemplate(self.tokenizer)

    @property
    def context_size(self) -> int:
        """The most prompt tokens the model reads (its net's ``block_size``)."""
        return self.net.block_size

    def chat_answer(
        self,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
        device: torch.device | str = "cpu",
        chat: bool = True,
    ) -> "ChatAnswer":
        """An answer to write: how its tokens are chosen (:func:`sampler`, ``temperature`` 0: greedy; ``seed``
        makes the draws repeatable whatever else runs) and how they become text (:class:`ChatAnswer`): the
        assistant's turn of :meth:`chat_template` (its stops too), or with ``chat=False`` plain text going on
        from a prompt (``/v1/completions``), ending at ``stop``, the end-of-text token or the token count."""
        generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        template = self.chat_template()
        stops = tuple(s for s in (*stop, *(template.stops if chat else ())) if s)
        choose = sampler(temperature, top_p=top_p, generator=generator)
        return ChatAnswer(self.tokenizer, template.ends_turns or not chat, stops, max_new_tokens, choose)

    @torch.no_grad()
    def stream_chat(
        self,
        predictor: nn.Module,
        ids: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] = (),
        seed: int | None = None,
    ) -> Iterator["Piece"]:
        """The assistant's answer to prompt ``ids`` (from :meth:`chat_template`), a piece of text per step,
        decoded alone with the net's key/value cache (:func:`decode_steps`); see :meth:`chat_answer`.

        The server decodes many answers together instead (``serving.batching``): the same tokens.
        """
        device = next(predictor.parameters()).device
        answer = self.chat_answer(max_new_tokens, temperature, top_p, stop, seed, device)
        tokens = predictor.transform(torch.tensor([ids], dtype=torch.long, device=device))  # (1, T0)
        for token in decode_steps(predictor.net, tokens, answer.choose):
            piece = answer.add(int(token.item()))
            if piece is not None:
                yield piece
                if piece.finish_reason is not None:
                    return
{%- endif %}

    def describe(self, outputs: torch.Tensor, class_names: list[str]) -> list[dict[str, Any]]:
        if outputs.dtype == torch.long:  # continuations of prompts
            return [{"completion": self.tokenizer.decode(row.tolist())} for row in outputs]
        return [{"bits_per_byte": round(value, 4)} for value in outputs.tolist()]
{%- if cookiecutter.use_serving == "yes" %}

    def response(self, outputs: list[str], class_names: list[str]) -> dict[str, Any]:
        return {"completions": outputs}

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        """Accuracy and bits per token of next-token probabilities (N, V) for the tokens (N,) that follow
        (``last_byte_acc`` and ``last_bits_per_byte`` for byte tokens).

        ``make export`` scores the exported graph with it, whose output is the distribution after the last
        position of each test window only: a prediction with a full window of context. Training's
        ``test/bpb`` averages every position, the first ones with little context, so it is higher for
        the same checkpoint: hence ``last_``."""
        chosen = outputs.gather(-1, targets.unsqueeze(-1)).squeeze(-1).clamp_min(1e-12)  # (N,)
        accuracy = (outputs.argmax(dim=-1) == targets).float().mean().item()
        unit = "byte" if self.tokenizer.source is None else "token"
        return {f"last_{unit}_acc": accuracy, f"last_bits_per_{unit}": (-chosen.log2()).mean().item()}
{%- endif %}

    @torch.no_grad()
    def generate(
        self,
        tokens: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        use_cache: bool = True,
    ) -> torch.Tensor:
        """Continue ``tokens`` (B, T0) by sampling ``max_new_tokens`` tokens: (B, T0 + max_new_tokens).

        Each step (:meth:`decode`: with the key/value cache unless ``use_cache`` is false) divides the
        logits by ``temperature`` and, with ``top_k``, samples among the k likeliest tokens only (Fan
        et al., "Hierarchical Neural Story Generation", ACL 2018). Sampling draws from torch's global
        generator: seed it for a repeatable text.

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
            unit = "UTF-8 bytes" if self.tokenizer.source is None else "tokens"
            raise ConfigError(
                f"the prompt has {tokens.shape[1]} {unit}; it must have 1 to {block_size} "
                "(the model's block_size): shorten it"
            )

        was_training = self.training
        self.eval()
        choose = sampler(temperature, top_k=top_k)
        new = decode(self.net, tokens, max_new_tokens, choose, use_cache=use_cache)  # (B, max_new_tokens)
        self.train(was_training)
        return torch.cat([tokens, new], dim=1)


@torch.no_grad()
def decode(
    net: nn.Module,
    tokens: torch.Tensor,
    max_new_tokens: int,
    choose: Callable[[torch.Tensor], torch.Tensor],
    stop_id: int | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """The ``max_new_tokens`` tokens (B, N) that ``choose`` picks after ``tokens`` (B, T0), one at a time
    (:func:`decode_steps`). Decoding stops early when every sequence's newest token is ``stop_id``
    (then left out, B = 1 only)."""
    steps, new = decode_steps(net, tokens, choose, use_cache), []
    for _ in range(max_new_tokens):
        next_tokens = next(steps)  # (B, 1)
        if stop_id is not None and tokens.shape[0] == 1 and next_tokens.item() == stop_id:
            break
        new.append(next_tokens)
    return torch.cat(new, dim=1) if new else tokens.new_empty((tokens.shape[0], 0))


@torch.no_grad()
def decode_steps(
    net: nn.Module, tokens: torch.Tensor, choose: Callable[[torch.Tensor], torch.Tensor], use_cache: bool = True
) -> Iterator[torch.Tensor]:
    """Yield the tokens (B, 1) that ``choose`` picks after ``tokens`` (B, T0), one step at a time, without end.

    ``choose`` maps the last position's logits (B, V) to the next tokens (B, 1). With ``use_cache``
    (the net's ``new_cache``), each step feeds only the new token; once the sequence is longer than
    ``block_size``, the context window slides by a token each step and shifts every position in it,
    so the cache is rebuilt from the last ``block_size`` tokens, the work of an uncached step.
    Cached and uncached decoding choose the same tokens.
    """
    block_size, batch = net.block_size, tokens.shape[0]
    use_cache = use_cache and hasattr(net, "new_cache")
    cache, sequence = None, tokens
    while True:
        if not use_cache:
            logits = next_token_logits(net, sequence[:, -block_size:])
        elif cache is None or sequence.shape[1] > block_size:
            cache = net.new_cache(batch)
            logits = next_token_logits(net, sequence[:, -block_size:], cache)
        else:
            logits = next_token_logits(net, sequence[:, cache.length :], cache)
        next_tokens = choose(logits[:, -1, :])  # (B, 1)
        yield next_tokens
        sequence = torch.cat([sequence, next_tokens], dim=1)


def next_token_logits(
    net: nn.Module, tokens: torch.Tensor, cache: Any = None, logits_to_keep: int | torch.Tensor = 1
) -> torch.Tensor:
    """The logits (B, K, V), float32, of token ids (B, T) at the positions ``logits_to_keep`` names (n: the last
    n, default the last one; a tensor (K,) of positions; 0: all): computed there alone by a net whose forward
    takes ``logits_to_keep`` (``nets.GPT``{{ ', ``nets.HFCausalLM``' if cookiecutter.use_pretrained == "yes" else '' }}), which spares a prompt's (T, V) logits (a
    vocabulary of 128k tokens makes 512 of them 256 MB), else sliced from all of them (a user's own net)."""
    args = (tokens,) if cache is None else (tokens, cache)
    if takes_logits_to_keep(type(net)):
        return net(*args, logits_to_keep=logits_to_keep).float()
    logits = net(*args)
    if isinstance(logits_to_keep, int):
        return logits[:, -logits_to_keep:].float()  # -0: all
    return logits[:, logits_to_keep].float()


@functools.cache
def takes_logits_to_keep(kind: type) -> bool:
    """Whether the forward of nets of class ``kind`` takes ``logits_to_keep`` (read once per class)."""
    return "logits_to_keep" in inspect.signature(kind.forward).parameters


def sampler(
    temperature: float, top_k: int | None = None, top_p: float = 1.0, generator: torch.Generator | None = None
) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``choose`` for :func:`decode_steps`: logits (B, V) -> sampled next tokens (B, 1).

    Logits are divided by ``temperature`` (0: the likeliest token, greedy). ``top_k`` keeps the k
    likeliest tokens (Fan et al., "Hierarchical Neural Story Generation", ACL 2018); ``top_p`` the
    smallest set whose probability reaches p (nucleus sampling: Holtzman et al., "The Curious Case of
    Neural Text Degeneration", ICLR 2020). ``generator`` seeds the draws (None: torch's global one).
    """
    if temperature == 0:
        return greedy

    def sample(logits: torch.Tensor) -> torch.Tensor:  # (B, V) -> (B, 1)
        # From the largest logit, which becomes 0: a temperature of 1e-40 overflows the others to
        # -inf, never the likeliest to inf (inf / inf in softmax would be NaN).
        logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
        if top_k is not None:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]  # (B, 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if top_p < 1.0:
            ordered, order = logits.sort(dim=-1, descending=True)  # (B, V)
            probabilities = ordered.softmax(dim=-1)
            outside = probabilities.cumsum(dim=-1) - probabilities >= top_p  # the likelier ones reach p already
            outside[:, 0] = False  # the likeliest token stays whatever p is (1e-300 is 0 in float32)
            drop = torch.zeros_like(outside).scatter(-1, order, outside)  # back in vocabulary order
            logits = logits.masked_fill(drop, float("-inf"))
        return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)

    return sample


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """The likeliest next tokens (B, 1) for the last position's logits (B, V)."""
    return logits.argmax(dim=-1, keepdim=True)


class NextTokenProbabilities(nn.Module):
    """Next-token logits (B, T, V) -> softmax of the last position's (B, V)."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, :].softmax(dim=-1)
{%- if cookiecutter.use_pretrained == "yes" %}


def check_tokenizer_fits(net: nn.Module, tokenizer: Tokenizer) -> None:
    """Refuse a pretrained net (one with a ``folder``) paired with a tokenizer whose vocabulary is not its own.

    Raises:
        ValueError: names both and the fix.
    """
    folder = getattr(net, "folder", None)
    if folder is None or not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return
    if tokenizer.source is None:
        raise ConfigError(
            f"the net is the pretrained {folder} but the data's tokens are bytes: set data.init_args.tokenizer to the "
            "same model as net.model"
        )
    own = load_tokenizer(str(folder))
    if own.backend.get_vocab() != tokenizer.backend.get_vocab():
        raise ConfigError(
            f"data.tokenizer {tokenizer.source} has another vocabulary than the net's model {folder}: set "
            "data.init_args.tokenizer to the same model as net.model"
        )
{%- endif %}
{%- if cookiecutter.use_serving == "yes" %}


@dataclass
class Piece:
    """A step of :meth:`LanguageModel.stream_chat`: new ``text``, the ``tokens`` generated so far, and on the
    last piece its ``finish_reason`` (``"stop"`` or ``"length"``, as the OpenAI API says it)."""

    text: str
    tokens: int
    finish_reason: str | None = None


class ChatAnswer:
    """An answer being written, one token at a time: the text each token makes final.

    Text is given out only once it is whole: a character whose UTF-8 bytes are not all generated yet,
    or the start of a stop string, waits for the next tokens. The last piece says why the answer
    ended: ``"stop"`` (the end-of-text token, a ``stops`` string, left out of the text) or
    ``"length"`` (``max_new_tokens`` tokens).

    Args:
        ends_turns: whether the chat template ends each turn itself (else the plain template's "\\n" before
            the end-of-text token is the template's, not the answer's).
        choose: how the next token is picked from the last position's logits (B, V) -> (B, 1).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        ends_turns: bool,
        stops: Sequence[str],
        max_new_tokens: int,
        choose: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.tokenizer, self.ends_turns, self.stops = tokenizer, ends_turns, tuple(stops)
        self.max_new_tokens, self.choose = max_new_tokens, choose
        self.new: list[int] = []
        self.count = 0  # tokens taken
        self.sent = 0  # characters of the answer given out so far

    def add(self, token: int) -> Piece | None:
        """Take the next token: the text it makes final, or None when there is none yet; a piece with a
        ``finish_reason`` is the last."""
        self.count += 1
        if token == self.tokenizer.eos_id:
            text = self.tokenizer.decode(self.new)
            return Piece((text if self.ends_turns else text.removesuffix("\n"))[self.sent :], self.count, "stop")
        self.new.append(token)
        text = self.tokenizer.decode(self.new)
        cuts = [text.find(s, max(0, self.sent - len(s))) for s in self.stops]
        found = [cut for cut in cuts if cut >= 0]
        if found:
            return Piece(text[self.sent : min(found)], self.count, "stop")
        if self.count == self.max_new_tokens:
            return Piece(text[self.sent :], self.count, "length")
        whole = text.rstrip("\ufffd")  # a character still missing bytes decodes as U+FFFD
        held = max((n for s in self.stops for n in range(1, len(s)) if whole.endswith(s[:n])), default=0)
        if len(whole) - held <= self.sent:  # nothing that can no longer change nor start a stop string
            return None
        piece = Piece(whole[self.sent : len(whole) - held], self.count)
        self.sent = len(whole) - held
        return piece
{%- endif %}
