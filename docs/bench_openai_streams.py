"""The OpenAI API of a language-model bake's ``make serve`` at 1 to 64 concurrent streams, against
transformers' ``generate`` at the same batch sizes on a GPT-2 of the same shape, in one run.

For each count N of ``--streams``: N clients each stream one greedy answer of ``--new-tokens`` tokens
at once (aggregate tokens/s: their completion tokens over the time from the first request to the
last answer's end), while one more client sends short requests (``--short-tokens``), one after
another, whose time to the first token (TTFT) is measured; before the first N, the same short
requests alone give the baseline. The clients are ``openai.AsyncOpenAI`` streams in one event loop of
this process (``--clients async``, the default), so they hold at most one core however many there are;
the report gives the share of a core the clients and the server used during the streams (CPU seconds
over wall seconds), so what the clients took from a machine the server shares is read, not guessed.
``--clients threads`` runs each stream in a thread with the synchronous client instead (the earlier runs).
The worker's resident memory is read after each count. Then
``GPT2LMHeadModel`` (random weights; the checkpoint's layers, heads, width, vocabulary and context)
generates greedily at batch N from a prompt as long as the server's, ``--new-tokens`` new tokens,
best of ``--rounds``: the reference for batched decoding on this machine; and again on the intra-op threads the
server's worker has (``serving.api.cpu_threads``: the cores less the HTTP process's), where fewer than every core:
the model's speed on the cores it is served from. Ratios within one run are what to compare across machines.

    python docs/bench_openai_streams.py <bake> <checkpoint> [--streams 1 4 16 64] [--new-tokens 90]
                                        [--stream-interval SECONDS] [--clients async|threads]
"""

import argparse
import asyncio
import importlib
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bench_openai_load as load
import psutil
import torch
from bench_openai_load import largest_rss_mb, percentiles
from openai import AsyncOpenAI, OpenAI

# A prompt of 34 tokens in the plain chat template: with 90 new tokens every answer stays inside the byte
# GPT's default context of 128, so no answer leaves the batch to slide its window.
CHAT = [{"role": "user", "content": "Call me Ishmael."}]


def timed_stream(client: OpenAI, name: str, tokens: int) -> tuple[float, float, int]:
    """:func:`bench_openai_load.timed_stream` of this benchmark's prompt."""
    return load.timed_stream(client, name, tokens, CHAT)


def generate_tokens_per_second(checkpoint: Path, batch: int, prompt: int, new: int, rounds: int) -> float:
    """transformers' greedy ``generate`` on a GPT-2 shaped as the checkpoint's net: tokens/s at ``batch``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    net = torch.load(checkpoint, map_location="cpu", weights_only=True)["hyper_parameters"]["net"]["init_args"]
    config = GPT2Config(
        vocab_size=net.get("vocab_size", 256),
        n_positions=net.get("block_size", 128),
        n_layer=net.get("n_layer", 4),
        n_head=net.get("n_head", 4),
        n_embd=net.get("n_embd", 128),
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(1, config.vocab_size, (batch, prompt))
    best = float("inf")
    with torch.no_grad():
        for _ in range(rounds):
            start = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                           do_sample=False)  # fmt: skip
            best = min(best, time.perf_counter() - start)
    return batch * new / best


def decoded_in_process(package: str, checkpoint: Path, count: int, new: int, rounds: int) -> float:
    """tokens/s of ``count`` greedy answers decoded together in this process (``serving.batching.DecodeBatch``,
    each token made text as the server does): the model's side of the server, without HTTP."""
    trained = importlib.import_module(f"{package}.engine.inference").load_trained(checkpoint)
    batching = importlib.import_module(f"{package}.serving.batching")
    ids = trained.model.chat_template().ids(CHAT)
    best = 0.0
    for _ in range(rounds):
        batch, answers = batching.DecodeBatch(trained.predictor.net), {}
        for key in range(count):
            answers[key] = trained.model.chat_answer(new, temperature=0)
            batch.add(key, ids, answers[key].choose)
        start, total = time.perf_counter(), 0
        while len(batch):
            for key, token in batch.step().items():
                total += 1
                piece = answers[key].add(token)
                if piece is not None and piece.finish_reason is not None:  # "length" at the latest
                    batch.remove(key)
        best = max(best, total / (time.perf_counter() - start))
    return best


def streams_at_once(client: OpenAI, name: str, count: int, tokens: int) -> float:
    """Aggregate completion tokens/s of ``count`` greedy answers streamed at once."""
    used: list[int] = []
    barrier = threading.Barrier(count + 1)

    def one() -> None:
        barrier.wait()
        used.append(timed_stream(client, name, tokens)[2])

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return sum(used) / (time.perf_counter() - start)


def cpu_seconds(process: subprocess.Popen) -> float:
    """User and system CPU seconds of ``process`` and its children so far."""
    root = psutil.Process(process.pid)
    total = 0.0
    for member in [root, *root.children(recursive=True)]:
        try:
            times = member.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


async def streams_in_one_loop(
    base_url: str, name: str, count: int, tokens: int, short_tokens: int, server: subprocess.Popen
) -> tuple[float, list[float], float, float]:
    """``count`` greedy answers streamed at once by ``openai.AsyncOpenAI`` in this event loop, while short
    requests go one after another: (aggregate tokens/s, the shorts' TTFTs, the share of a core this process
    used, the share of the cores the server used), both shares over the streams' wall time."""
    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)

    async def one(new: int) -> tuple[float, int]:
        start, first, used = time.perf_counter(), None, 0
        stream = await client.chat.completions.create(
            model=name, messages=CHAT, max_tokens=new, temperature=0, stream=True
        )
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage:
                used = chunk.usage.completion_tokens
        return (first if first is not None else float("nan")), used

    running = True

    async def shorts() -> list[float]:
        firsts = [(await one(short_tokens))[0]]
        while running:
            firsts.append((await one(short_tokens))[0])
        return firsts

    short = asyncio.create_task(shorts())
    own, served, start = time.process_time(), cpu_seconds(server), time.perf_counter()
    answers = await asyncio.gather(*(one(tokens) for _ in range(count)))
    wall = time.perf_counter() - start
    own, served = (time.process_time() - own) / wall, (cpu_seconds(server) - served) / wall
    running = False
    firsts = await short
    await client.close()
    return sum(used for _, used in answers) / wall, firsts, own, served


def shorts_while(client: OpenAI, name: str, tokens: int, running: threading.Event) -> list[float]:
    """TTFTs of short requests sent one after another while ``running`` is set (at least one)."""
    firsts = [timed_stream(client, name, tokens)[0]]
    while running.is_set():
        firsts.append(timed_stream(client, name, tokens)[0])
    return firsts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bake", type=Path)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=90)
    parser.add_argument("--short-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stream-interval", type=float, default=None, help="the server's --stream_interval")
    parser.add_argument("--clients", choices=["async", "threads"], default="async")
    args = parser.parse_args()

    package = next((args.bake / "src").iterdir()).name
    name = load.NAME
    options = ["--max_tokens", str(args.new_tokens), "--max_batch_size", str(max(args.streams) + 1), "--timeout", "600"]
    # Every stream and the short requests' client come from this one address: the server's per-client bound.
    options += ["--max_client_connections", str(max(args.streams) + 8)]
    options += [] if args.stream_interval is None else ["--stream_interval", str(args.stream_interval)]
    served: dict[int, tuple[float, list[float], float]] = {}
    with load.openai_server(args.bake, args.checkpoint, "bench_openai_streams.log", *options) as (server, client):
        prompt = client.chat.completions.create(model=name, messages=CHAT, max_tokens=1).usage.prompt_tokens
        timed_stream(client, name, args.new_tokens)  # warm-up
        alone = [timed_stream(client, name, args.short_tokens)[0] for _ in range(10)]
        print(f"server, one worker: prompt {prompt} tokens, answers {args.new_tokens} tokens; short request "
              f"({args.short_tokens} tokens) alone: TTFT {percentiles(alone)}")  # fmt: skip
        for count in args.streams:
            best, firsts, shares = 0.0, [], ""
            for _ in range(args.rounds):
                if args.clients == "async":
                    url, lengths = str(client.base_url), (args.new_tokens, args.short_tokens)
                    found = asyncio.run(streams_in_one_loop(url, name, count, *lengths, server))
                    if found[0] > best:
                        best, shares = found[0], f"; CPU: clients {found[2]:.2f} of a core, server {found[3]:.2f} cores"
                    firsts += found[1]
                    continue
                running = threading.Event()
                running.set()
                with ThreadPoolExecutor(max_workers=1) as pool:
                    short = pool.submit(shorts_while, client, name, args.short_tokens, running)
                    best = max(best, streams_at_once(client, name, count, args.new_tokens))
                    running.clear()
                    firsts += short.result()
            served[count] = (best, firsts, largest_rss_mb(server))
            print(f"{count:3d} streams: {best:7.0f} tokens/s in all; short TTFT {percentiles(firsts)} "
                  f"({statistics.median(firsts) / statistics.median(alone):.1f}x alone); "
                  f"worker RSS {served[count][2]:.0f} MB{shares}", flush=True)  # fmt: skip
    torch.set_num_threads(os.cpu_count() or 1)
    print("the same answers decoded together in this process (no HTTP):")
    for count in args.streams:
        rate = decoded_in_process(package, args.checkpoint, count, args.new_tokens, args.rounds)
        ratio = served[count][0] / rate
        print(f"  {count:3d} answers: {rate:7.0f} tokens/s; the server at {count} streams: {ratio:.2f}x")
    print(f"transformers generate (GPT-2 of the checkpoint's shape, greedy, {prompt} + {args.new_tokens} tokens):")
    for count in args.streams:
        reference = generate_tokens_per_second(args.checkpoint, count, prompt, args.new_tokens, args.rounds)
        print(f"  batch {count:3d}: {reference:7.0f} tokens/s; the server at {count} streams: "
              f"{served[count][0] / reference:.2f}x")  # fmt: skip
    # The model's speed on the cores the server's worker has: its intra-op threads leave a core to the HTTP
    # process (serving.api.cpu_threads), which on a small machine is most of the gap to `generate` on every core.
    threads = importlib.import_module(f"{package}.serving.api").cpu_threads(workers=1)
    if threads is not None and threads < torch.get_num_threads():
        torch.set_num_threads(threads)
        print(f"transformers generate on the worker's {threads} intra-op thread(s) of {os.cpu_count()} cores:")
        for count in args.streams:
            reference = generate_tokens_per_second(args.checkpoint, count, prompt, args.new_tokens, args.rounds)
            print(f"  batch {count:3d}: {reference:7.0f} tokens/s; the server at {count} streams: "
                  f"{served[count][0] / reference:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
