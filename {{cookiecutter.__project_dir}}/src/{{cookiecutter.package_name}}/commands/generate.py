"""``make generate``: sample text from a trained language model.

    python -m {{ cookiecutter.package_name }}.commands.generate --prompt "Call me" --max_new_tokens 300 --temperature 0.8 --top_k 40
    python -m {{ cookiecutter.package_name }}.commands.generate --ckpt logs/.../checkpoints/epoch004-step001300-val_loss1.2345.ckpt

Without ``--ckpt`` it loads the best checkpoint of the latest run under ``logs/``
(:func:`engine.run_folders.best_checkpoint`). The checkpoint alone rebuilds the model: no training config
is needed. Options are read by jsonargparse from this function's signature (``--help``).
"""

import sys
from pathlib import Path

import torch
from jsonargparse import auto_cli

from {{ cookiecutter.package_name }}.engine import (
    CheckpointError,
    best_checkpoint,
    build_model,
    check_checkpoint,
    checkpoint_arguments,
    exit_on_user_error,
    loading,
    read_checkpoint,
    trusted_modules,
)
from {{ cookiecutter.package_name }}.models import LanguageModel


def generate(
    prompt: str = "\n",
    max_new_tokens: int = 400,
    temperature: float = 0.8,
    top_k: int | None = 40,
    ckpt: Path | None = None,
    seed: int | None = 0,
    device: str = "auto",
    trust: str | None = None,
) -> str:
    """Print and return ``prompt`` continued by up to ``max_new_tokens`` sampled tokens.

    Tokens are bytes{{ ", or the pretrained model's tokens" if cookiecutter.use_pretrained == "yes" else "" }}; a sampled end-of-text token ends the text.

    Args:
        prompt: the text to continue (at most the model's block_size tokens).
        max_new_tokens: tokens to sample.
        temperature: above 0; lower is more conservative, 1 samples the model's distribution.
        top_k: sample among the k likeliest tokens only (null: all).
        ckpt: the checkpoint; default the best of the latest run under logs/.
        seed: seed of the sampling (null: a different text each time).
        device: "auto" (CUDA when available), "cpu" or "cuda".
        trust: modules besides this package whose classes the checkpoint may name, comma-separated
            (``engine/trust.py``; TRUST= on make).

    Raises:
        FileNotFoundError: no checkpoint found or given.
        engine.trust.UntrustedCheckpointError: the checkpoint names code outside the trusted modules.
        ValueError: a bad prompt, temperature or top_k (from :meth:`LanguageModel.generate`).
    """
    path = Path(ckpt) if ckpt is not None else best_checkpoint("logs")
    # A missing, truncated or foreign file is named, and every name in it checked, before anything is imported.
    checkpoint = read_checkpoint(path)
    check_checkpoint(checkpoint, path, trusted_modules(trust))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    target = torch.device(device)
    # Only the model is built (never the checkpoint's optimizer or schedule), on the meta device first.
    arguments = checkpoint_arguments(checkpoint, path, trusted_modules(trust))
    with loading(arguments, path, trusted_modules(trust)):
        model = build_model(checkpoint, arguments["hyper_parameters"], path)
    if not isinstance(model, LanguageModel):
        raise CheckpointError(f"{path}: a checkpoint of {type(model).__name__}, not of a language model")
    model.to(target).eval()
    if seed is not None:
        torch.manual_seed(seed)
    tokenizer = model.tokenizer  # the training data's: bytes, or the pretrained model's own
    tokens = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=target)  # (1, T0)
    output = model.generate(tokens, max_new_tokens, temperature=temperature, top_k=top_k)  # (1, T0 + new)
    ids = output[0].tolist()
    new = ids[tokens.shape[1] :]
    if tokenizer.eos_id in new:  # a fine-tuned model ends its completion with the end-of-text token
        ids = ids[: tokens.shape[1] + new.index(tokenizer.eos_id)]
    text = tokenizer.decode(ids)
    print(f"[{path}]", file=sys.stderr)
    print(text)
    return text


def main(args: list[str] | None = None) -> None:
    with exit_on_user_error("generate"):  # a missing checkpoint, a bad prompt or setting: one line, exit 2
        auto_cli(generate, args=args)


if __name__ == "__main__":
    main()
