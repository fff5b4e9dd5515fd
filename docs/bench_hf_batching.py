"""A Hugging Face causal LM's answers decoded together (one forward pass a step, left-padded rows) against
one at a time (each its own cache, what the server did before), and transformers' ``generate``, in one run.

The model is a ``GPT2LMHeadModel`` with random weights of the byte GPT's default shape (4 layers, 4 heads,
128 wide, vocabulary 256, context 128), saved as a model folder and loaded by the bake's ``nets.HFCausalLM``.
For each count N of answers, ``serving.batching.DecodeBatch`` decodes N greedy answers of ``--new-tokens``
tokens after a ``--prompt``-token prompt: with the shared cache (``HFBatchCache``), the prompts that fit a
step's prefill budget prefilled together in one forward pass; the same with each prompt prefilled by
itself (what the batch did before); with the shared cache switched off (each answer alone); then
``generate`` at batch N on the same model. Tokens/s, best of
``--rounds``; ratios within one run are what to compare across machines.

Then a prefill of 16 prompts of 128 tokens in one forward pass on the same shape with GPT-2's vocabulary
(``--prefill-vocab`` 50257): the logits of each prompt's last position only (``logits_to_keep``, what the
batch asks for) against those of every position, seconds (best of ``--rounds``) and the logits' size.

    python docs/bench_hf_batching.py <bake> [--counts 1 4 16 64] [--prompt 34] [--new-tokens 90] [--rounds 3]
                                            [--prefill-vocab 50257]
"""

import argparse
import importlib
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def decoded(batching, net, count: int, prompt: int, new: int, shared: bool, together: bool = True) -> float:
    """tokens/s of ``count`` greedy answers of ``new`` tokens decoded by ``DecodeBatch``: ``shared`` (one forward
    pass a step) or each alone; ``together``: prompts prefilled in one pass (else each by itself)."""
    ids = torch.randint(1, 256, (prompt,), generator=torch.Generator().manual_seed(0)).tolist()
    batch, taken = batching.DecodeBatch(net), dict.fromkeys(range(count), 0)
    if not shared:
        batch.cache = None  # every answer decoded alone with its own cache
    if not together:
        batch._whole_prompts = lambda budget: []  # every prompt prefilled by itself
    for key in range(count):
        batch.add(key, ids, batching.greedy)
    start = time.perf_counter()
    while len(batch):
        for key in batch.step():
            taken[key] += 1
            if taken[key] == new:
                batch.remove(key)
    return count * new / (time.perf_counter() - start)


def generated(model: GPT2LMHeadModel, count: int, prompt: int, new: int) -> float:
    """tokens/s of transformers' greedy ``generate`` at batch ``count``."""
    ids = torch.randint(1, 256, (count, prompt), generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False)
    return count * new / (time.perf_counter() - start)


def prefill_seconds(nets, vocab: int, keep: int, rounds: int) -> tuple[float, int]:
    """Best seconds of prefilling 16 prompts of 128 tokens through ``nets.HFCausalLM`` with ``logits_to_keep``
    ``keep`` (0: every position), and the bytes of the logits returned."""
    config = GPT2Config(vocab_size=vocab, n_positions=128, n_layer=4, n_head=4, n_embd=128)
    with tempfile.TemporaryDirectory() as folder:
        GPT2LMHeadModel(config).save_pretrained(folder)
        net = nets.HFCausalLM(folder, lora=None).eval()
    tokens = torch.randint(0, vocab, (16, 128), generator=torch.Generator().manual_seed(0))
    best, size = float("inf"), 0
    for _ in range(rounds):
        start = time.perf_counter()
        logits = net(tokens, net.new_cache(16), logits_to_keep=keep)
        best, size = min(best, time.perf_counter() - start), logits.numel() * logits.element_size()
    return best, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bake", type=Path)
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--prompt", type=int, default=34)
    parser.add_argument("--new-tokens", type=int, default=90)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefill-vocab", type=int, default=50257)
    args = parser.parse_args()
    sys.path.insert(0, str(args.bake / "src"))
    package = next(path.parent.name for path in (args.bake / "src").glob("*/__init__.py"))
    batching = importlib.import_module(f"{package}.serving.batching")
    nets = importlib.import_module(f"{package}.nets")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=128, n_layer=4, n_head=4, n_embd=128, pad_token_id=0,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        net = nets.HFCausalLM(folder, lora=None).eval()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.prompt} + {args.new_tokens} tokens")
    print("answers  together  prefilled by itself  alone  generate (tok/s)  together/itself  together/alone  "
          "together/generate")  # fmt: skip
    with torch.no_grad():
        for count in args.counts:
            rounds = range(args.rounds)
            shape = (batching, net, count, args.prompt, args.new_tokens)
            together = max(decoded(*shape, shared=True) for _ in rounds)
            itself = max(decoded(*shape, shared=True, together=False) for _ in rounds)
            alone = max(decoded(*shape, shared=False) for _ in rounds)
            reference = max(generated(model, count, args.prompt, args.new_tokens) for _ in rounds)
            print(f"{count:7d}  {together:8.0f}  {itself:19.0f}  {alone:5.0f}  {reference:16.0f}  "
                  f"{together / itself:15.2f}  {together / alone:14.2f}  {together / reference:17.2f}")  # fmt: skip

        last, last_bytes = prefill_seconds(nets, args.prefill_vocab, 1, args.rounds)
        every, every_bytes = prefill_seconds(nets, args.prefill_vocab, 0, args.rounds)
    print(f"prefill of 16 x 128 tokens, vocabulary {args.prefill_vocab}: last position's logits {last * 1e3:.0f} ms "
          f"({last_bytes / 2**20:.1f} MiB), every position's {every * 1e3:.0f} ms ({every_bytes / 2**20:.0f} MiB): "
          f"{every / last:.2f}x the time")  # fmt: skip


if __name__ == "__main__":
    main()
