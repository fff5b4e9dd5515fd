"""The OpenAI API of a language-model bake's ``make serve`` under mixed load: short requests while long ones stream.

Starts ``python -m <package>.serve --api openai`` on a free loopback port over a checkpoint, then for
each round: the baseline (short requests one after another, nothing else running), and the same
short requests while ``--long-clients`` clients each stream ``--long-tokens``-token answers back to
back. A short request asks for ``--short-tokens`` tokens, streamed, so its time to the first token
(TTFT) and to its end are both measured; the long streams' tokens/s is what they got meanwhile.
Each round ends with the resident memory of the server's largest process (its inference worker).
The ratios within one run (under load / alone) are what to read across machines. ``--max-batch-size``
takes several values, one server each, in one run: ``1`` is a worker that generates one answer at a
time, the baseline for the server's default (64 answers at once, a step of each in turn).

    python docs/bench_openai_load.py <bake> <checkpoint> [--workers 1] [--rounds 3] [--long-clients 2] \
        [--max-batch-size 1 64]
"""

import argparse
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
from openai import OpenAI

CHAT = [{"role": "user", "content": "Call me Ishmael. Some years ago, never mind how long precisely"}]
NAME = "bench"  # the served model's name


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def timed_stream(client: OpenAI, name: str, tokens: int, messages: list[dict] = CHAT) -> tuple[float, float, int]:
    """Seconds to the first content and to the end of one streamed greedy answer, and its completion tokens."""
    start, first, used = time.perf_counter(), None, 0
    for chunk in client.chat.completions.create(
        model=name, messages=messages, max_tokens=tokens, temperature=0, stream=True
    ):
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
        if chunk.usage:
            used = chunk.usage.completion_tokens
    return first if first is not None else float("nan"), time.perf_counter() - start, used


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {statistics.median(ordered) * 1e3:7.0f} ms, p99 {p99 * 1e3:7.0f} ms"


@contextlib.contextmanager
def openai_server(
    bake: Path, checkpoint: Path, log_name: str, *options: str
) -> Iterator[tuple[subprocess.Popen, OpenAI]]:
    """``serve --api openai`` of ``bake`` over ``checkpoint`` on a free loopback port with ``options``, once
    healthy: its process and a client of it (the model is ``NAME``); its process group stopped after.
    Its output goes to ``bake / log_name``, to read after a failure."""
    package = next((bake / "src").iterdir()).name
    port = free_port()
    command = [sys.executable, "-m", f"{package}.commands.serve", "--ckpt", str(checkpoint), "--port", str(port)]
    command += ["--api=openai", "--model_name", NAME, *options]
    with (bake / log_name).open("w") as log:
        server = subprocess.Popen(command, cwd=bake, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(OSError), urllib.request.urlopen(f"http://127.0.0.1:{port}/health") as answer:
                    if answer.status == 200:
                        break
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"the server did not become healthy: see {bake / log_name}")
                time.sleep(0.5)
            yield server, OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=600)
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)


def shorts(client: OpenAI, name: str, count: int, tokens: int) -> tuple[list[float], list[float]]:
    firsts, ends = [], []
    for _ in range(count):
        first, end, _ = timed_stream(client, name, tokens)
        firsts.append(first)
        ends.append(end)
    return firsts, ends


def stream_long(client: OpenAI, name: str, tokens: int, stop: threading.Event, streamed: list) -> None:
    """Stream ``tokens``-token answers back to back until ``stop``; append (tokens, seconds) of each to ``streamed``."""
    while not stop.is_set():
        start = time.perf_counter()
        _, _, used = timed_stream(client, name, tokens)
        streamed.append((used, time.perf_counter() - start))  # list.append is atomic under the GIL


def largest_rss_mb(process: subprocess.Popen) -> float:
    root = psutil.Process(process.pid)
    sizes = []
    for member in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            sizes.append(member.memory_info().rss)
    return max(sizes) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bake", type=Path)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--workers", type=int, default=1, help="--workers_per_device of the server")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--long-clients", type=int, default=2)
    parser.add_argument("--long-tokens", type=int, default=512)
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--shorts", type=int, default=20, help="short requests per measurement")
    parser.add_argument("--max-batch-size", type=int, nargs="+", default=[64], help="one server for each value")
    args = parser.parse_args()

    for max_batch_size in args.max_batch_size:
        measure(args, max_batch_size)


def measure(args: argparse.Namespace, max_batch_size: int) -> None:
    options = ["--max_tokens", str(args.long_tokens), "--workers_per_device", str(args.workers)]
    options += ["--max_batch_size", str(max_batch_size)]
    options += ["--timeout", "600"]  # queued requests wait: the figure is their wait, not LitServe's 504 after 30 s
    with openai_server(args.bake, args.checkpoint, "bench_openai_load.log", *options) as (server, client):
        name = NAME
        print(f"server: {args.workers} worker(s), --max_batch_size {max_batch_size}; long answers {args.long_tokens} "
              f"tokens, short {args.short_tokens}")  # fmt: skip
        timed_stream(client, name, args.short_tokens)  # warm-up
        for round_number in range(1, args.rounds + 1):
            alone_first, alone_end = shorts(client, name, args.shorts, args.short_tokens)
            stop, streamed = threading.Event(), []
            threads = [
                threading.Thread(target=stream_long, args=(client, name, args.long_tokens, stop, streamed))
                for _ in range(args.long_clients)
            ]
            for thread in threads:
                thread.start()
            time.sleep(1.0)  # the long streams are under way
            loaded_first, loaded_end = shorts(client, name, args.shorts, args.short_tokens)
            stop.set()
            for thread in threads:
                thread.join()
            long_rate = sum(used for used, _ in streamed) / max(1e-9, sum(seconds for _, seconds in streamed))
            print(f"round {round_number}: short ({args.short_tokens} tokens) alone: TTFT {percentiles(alone_first)}; "
                  f"end {percentiles(alone_end)}")  # fmt: skip
            print(f"round {round_number}: short beside {args.long_clients} long streams ({args.long_tokens} tokens): "
                  f"TTFT {percentiles(loaded_first)}; end {percentiles(loaded_end)}; TTFT p50 ratio "
                  f"{statistics.median(loaded_first) / statistics.median(alone_first):.1f}x")  # fmt: skip
            print(f"round {round_number}: long streams: {len(streamed)} answers, {long_rate:.0f} tokens/s per stream; "
                  f"worker RSS {largest_rss_mb(server):.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
