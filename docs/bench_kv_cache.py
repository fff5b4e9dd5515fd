"""Greedy generation tokens/s with and without the key/value cache, through the language-model bake's decode loop.

Nets: the byte GPT of the default config's width (4 layers, 128 wide) with a 1,024-token context,
the same GPT with the default 128-token context (past it the cache is rebuilt every step), and a
random 2-layer GPT-2 folder made with transformers (``nets.HFCausalLM``, 2,048 positions, so that
transformers, which does not slide a window, fits every length), whose cached decoding is
also timed against transformers' own ``generate`` (greedy, ``use_cache=True``) on the same folder.
Batch 1, a 16-token prompt; each figure is the best of 3 runs (1 at 1,024 tokens), in one
process, so ratios between the columns are what to read across machines.

    PYTHONPATH=<bake>/src python docs/bench_kv_cache.py byte_gpt [NET ...]   # a language-model bake's package
"""

import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

NEW_TOKENS = (64, 256, 1024)
RUNS = 3


def tokens_per_s(generate, new_tokens: int) -> float:
    best = float("inf")
    for _ in range(RUNS if new_tokens < 1024 else 1):  # an uncached 1,024 tokens takes minutes on 2 CPU cores
        start = time.perf_counter()
        generate(new_tokens)
        best = min(best, time.perf_counter() - start)
    return new_tokens / best


def main(package: str, only: list[str]) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    nets = importlib.import_module(f"{package}.nets")
    decoding = importlib.import_module(f"{package}.models.language_model")
    import transformers

    prompt = torch.randint(0, 200, (1, 16))
    rows = []
    with tempfile.TemporaryDirectory() as folder, torch.no_grad():
        config = transformers.GPT2Config(vocab_size=1000, n_positions=2048, n_embd=128, n_layer=2, n_head=4)
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
        subjects = {
            "gpt_context_1024": nets.GPT(block_size=1024, n_layer=4, n_head=4, n_embd=128, dropout=0.0).eval(),
            "gpt_context_128": nets.GPT(block_size=128, n_layer=4, n_head=4, n_embd=128, dropout=0.0).eval(),
            "gpt2_tiny_hf": nets.HFCausalLM(str(Path(folder)), lora=None).eval(),
        }
        for name, net in subjects.items():
            if only and name not in only:
                continue
            for new in NEW_TOKENS:
                row = {"net": name, "new_tokens": new}
                for cached in (True, False):
                    run = lambda n, c=cached, m=net: decoding.decode(m, prompt, n, decoding.greedy, use_cache=c)  # noqa: E731
                    row["cached" if cached else "uncached"] = round(tokens_per_s(run, new), 1)
                row["cache_speedup"] = round(row["cached"] / row["uncached"], 2)
                if name == "gpt2_tiny_hf":
                    ours = decoding.decode(net, prompt, 32, decoding.greedy)
                    theirs = hf.generate(prompt, max_new_tokens=32, do_sample=False, min_new_tokens=32)[:, 16:]
                    assert torch.equal(ours, theirs), "the project's greedy tokens differ from transformers'"

                    def generate(n):
                        return hf.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True)

                    row["transformers_generate"] = round(tokens_per_s(generate, new), 1)
                    row["cached_vs_transformers"] = round(row["cached"] / row["transformers_generate"], 2)
                rows.append(row)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
