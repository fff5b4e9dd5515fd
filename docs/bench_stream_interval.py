"""The OpenAI API of a language-model bake at 16 concurrent streams with a piece per token
(``--stream_interval 0``) and with pieces of up to 10 ms of tokens (the default), servers of the two
alternated: aggregate tokens/s (best of two rounds per server) and a short request's time to its first
token while the streams run. Alternating, on one machine in one run, is what makes the two comparable
on a machine whose speed moves between runs.

    python docs/bench_stream_interval.py <bake> <checkpoint> [--rounds 3] [--streams 16]
"""

import argparse
import statistics
import threading
from pathlib import Path

import bench_openai_load as load
import bench_openai_streams as streams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("bake", type=Path)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=90)
    args = parser.parse_args()
    rates: dict[float, list[float]] = {0.0: [], 0.01: []}
    firsts: dict[float, list[float]] = {0.0: [], 0.01: []}
    for round_ in range(args.rounds):
        for interval in rates:
            options = ["--max_tokens", str(args.new_tokens), "--max_batch_size", str(args.streams + 1)]
            options += ["--timeout", "600", "--stream_interval", str(interval)]
            with load.openai_server(args.bake, args.checkpoint, "bench_stream_interval.log", *options) as (_, client):
                streams.timed_stream(client, load.NAME, args.new_tokens)  # warm-up
                best = max(streams.streams_at_once(client, load.NAME, args.streams, args.new_tokens) for _ in range(2))
                running, shorts = threading.Event(), []
                running.set()
                sender = threading.Thread(target=lambda: shorts.extend(streams.shorts_while(client, load.NAME, 8, running)))
                sender.start()
                streams.streams_at_once(client, load.NAME, args.streams, args.new_tokens)
                running.clear()
                sender.join()
            rates[interval].append(best)
            firsts[interval] += shorts
            print(f"round {round_}: --stream_interval {interval}: {best:.0f} tokens/s, short TTFT p50 "
                  f"{statistics.median(shorts) * 1000:.0f} ms", flush=True)  # fmt: skip
    for interval in rates:
        print(f"--stream_interval {interval}: median {statistics.median(rates[interval]):.0f} tokens/s, "
              f"short TTFT p50 {statistics.median(firsts[interval]) * 1000:.0f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
