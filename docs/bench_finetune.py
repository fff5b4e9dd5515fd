"""LoRA against full fine-tuning of a Hugging Face causal LM through the language-model bake's nets.HFCausalLM.

For each model (the tests' 2-layer Llama, and a random model of GPT-2 small's size: 12 layers,
768 wide, 50,257 tokens, 124 M parameters) and each way of training (LoRA r=8 on peft's default
targets, every weight; with and without gradient checkpointing for GPT-2 small), one process
builds the net from a saved folder and runs AdamW steps on random tokens, then prints one JSON
line: trainable parameters, optimizer-state bytes, peak resident memory (ru_maxrss) and training
tokens per second (median step after two warm-up steps). Each measurement runs in a fresh process
so that its peak memory is its own; LoRA and full run alternately in the same session, so their
ratio is what to read across machines.

    python docs/bench_finetune.py /tmp/bk/language-model/byte_gpt   # a language-model bake, installed in this Python
"""

import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BATCH, BLOCK, STEPS = 8, 256, 6


def save_model(kind: str, folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "tiny-llama":
        config = transformers.LlamaConfig(
            vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=BLOCK,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    else:  # GPT-2 small's shape
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
    model.save_pretrained(folder)


def measure(package: str, folder: str, lora: bool, checkpointing: bool) -> dict:
    import torch

    nets = __import__(f"{package}.nets", fromlist=["HFCausalLM", "LoRA"])
    net = nets.HFCausalLM(folder, lora=nets.LoRA(r=8, alpha=16, dropout=0.0) if lora else None,
                          gradient_checkpointing=checkpointing, block_size=BLOCK)  # fmt: skip
    trainable = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    vocab = net.model.get_input_embeddings().num_embeddings
    tokens = torch.randint(0, vocab, (BATCH, BLOCK + 1), generator=torch.Generator().manual_seed(0))
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        logits = net(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t))
    return {
        "trainable": sum(p.numel() for p in trainable),
        "parameters": sum(p.numel() for p in net.parameters()),
        "optimizer_state_mb": round(state / 2**20, 2),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "tokens_per_s": round(BATCH * BLOCK / statistics.median(times[2:])),
    }


def main(bake: str) -> None:
    package = next(p.parent.name for p in Path(bake, "src").glob("*/cli.py"))
    with tempfile.TemporaryDirectory() as workdir:
        for kind, checkpointing_options in (("tiny-llama", (False,)), ("gpt2-small", (False, True))):
            folder = Path(workdir) / kind
            save_model(kind, folder)
            for checkpointing in checkpointing_options:
                for lora in (True, False):
                    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import bench_finetune as b; " \
                           f"import json; print(json.dumps(b.measure({package!r}, {str(folder)!r}, {lora}, {checkpointing})))"  # fmt: skip
                    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                    result = json.loads(done.stdout.strip().splitlines()[-1])
                    mode = "lora" if lora else "full"
                    print(json.dumps({"model": kind, "mode": mode, "gradient_checkpointing": checkpointing, **result}))


if __name__ == "__main__":
    main(sys.argv[1])
