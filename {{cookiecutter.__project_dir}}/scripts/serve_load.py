"""Load test of `make serve` on loopback: p50 / p99 latency and requests per second at a few concurrencies.

Starts the server on a free 127.0.0.1 port in its own process group (the best checkpoint of the
latest run, or --ckpt), sends a bounded number of requests of one test example each from
--concurrency client threads, prints one line per level, then stops the server (SIGTERM to the
group). The baseline, measured in the same run: the same example through the Predictor in this
process, with no HTTP; the last column is the server's p50 over it.

Usage: python scripts/serve_load.py [--ckpt PATH] [--requests 400] [--concurrency 1 4 16]
"""

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from {{ cookiecutter.package_name }}.engine.errors import exit_on_user_error
from {{ cookiecutter.package_name }}.engine.inference import Trained, load_trained, trusted_modules
from {{ cookiecutter.package_name }}.engine.runs import best_checkpoint

PACKAGE = "{{ cookiecutter.package_name }}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(port: int, process: subprocess.Popen, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"serve_load: the server exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.25)
    sys.exit(f"serve_load: no healthy server after {seconds:.0f} s")


def timed_post(port: int, body: bytes) -> float:
    """Seconds for one POST /predict; raises on any status but 200."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict", data=body, headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
        if answer.status != 200:
            raise RuntimeError(f"status {answer.status}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--trust", default=None, help="modules besides the project's the checkpoint may name")
    parser.add_argument("--requests", type=int, default=400, help="requests per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args(argv)
    with exit_on_user_error("serve-bench"):  # no checkpoint, a broken one: one line, exit 2
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """Baseline, then each concurrency level against a server started for it (see the module docstring)."""
    checkpoint = Path(args.ckpt) if args.ckpt else best_checkpoint("logs")
    trained = load_trained(checkpoint, trust=trusted_modules(args.trust))
    trained.datamodule.setup("predict")
    example = example_input(trained)
    body = json.dumps({"inputs": [example]}).encode()

    raw = trained.datamodule.inputs_from_json([example])
    with torch.inference_mode():
        for _ in range(20):
            trained.model.infer(trained.predictor, raw)
        times: list[float] = []
        while len(times) < 200 and sum(times) < 5.0:  # 200 calls, or 5 s for a slow model (a generating LM)
            start = time.perf_counter()
            trained.model.infer(trained.predictor, raw)
            times.append(time.perf_counter() - start)
    baseline = statistics.median(times)
    threads = torch.get_num_threads()
    print(f"baseline: in-process Predictor, 1 example: p50 {baseline * 1e3:.2f} ms (torch threads {threads})")

    port = free_port()
    command = [sys.executable, "-m", f"{PACKAGE}.serve", "--ckpt", str(checkpoint), "--port", str(port)]
    command += ["--trust", args.trust] if args.trust else []
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_healthy(port, process)
        for _ in range(20):
            timed_post(port, body)  # warm-up
        for level in args.concurrency:
            start = time.perf_counter()
            with ThreadPoolExecutor(max_workers=level) as pool:
                latencies = sorted(pool.map(lambda _: timed_post(port, body), range(args.requests)))
            elapsed = time.perf_counter() - start
            p50 = latencies[len(latencies) // 2]
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            print(
                f"concurrency {level:3d}: {args.requests} requests, p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
                f"{args.requests / elapsed:.0f} requests/s, p50 / baseline {p50 / baseline:.1f}x"
            )
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)


def example_input(trained: Trained) -> object:
    """One raw test example as a JSON request carries it."""
    schema = trained.datamodule.request_schema()
    if schema["kind"] == "text":
        return "Call me Ishmael."[: schema["max_bytes"]]
    if schema["kind"] == "row":
        data = trained.datamodule
        return data.read().iloc[data.split_rows["test"][0]][schema["columns"]].to_dict()
    return trained.datamodule.raw_inputs("test")[0][0].tolist()


if __name__ == "__main__":
    main()
