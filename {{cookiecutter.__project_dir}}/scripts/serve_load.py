"""Load test of `make serve` on loopback: p50 / p99 latency and requests per second at a few concurrencies.

Starts the server on a free 127.0.0.1 port in its own process group (the best checkpoint of the
latest run, or --ckpt), sends a bounded number of requests of one test example each from
--concurrency client threads, prints one line per level and round, then stops the server (SIGTERM
to the group). The baseline, measured in the same run: the same example through the Predictor in
this process, with no HTTP; a line's last column but one is the server's p50 over it.

--bad-every K makes every K-th request one the server must refuse (a NaN pixel, text in a numeric
column, a number for a prompt): each line counts the good requests answered 200 and the bad ones
refused 422; anything else is a failure. Each line ends with the resident memory (RSS) of the
server's largest process (the inference worker) after it; run several --rounds to see whether it
is bounded.

Usage: python scripts/serve_load.py [--ckpt PATH] [--requests 400] [--concurrency 1 4 16]
                                    [--rounds 1] [--bad-every 0]
"""

import argparse
import contextlib
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
from typing import Any

import psutil
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


def timed_post(port: int, body: bytes) -> tuple[int, float]:
    """HTTP status and seconds of one POST /predict."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/predict", data=body, headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
            status = answer.status
    except urllib.error.HTTPError as error:
        error.read()
        status = error.code
    return status, time.perf_counter() - start


def largest_rss_mb(process: subprocess.Popen) -> tuple[float, int]:
    """Resident memory in MB of the largest process of the server (its inference worker), and how many it has."""
    root = psutil.Process(process.pid)
    sizes = []
    for member in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            sizes.append(member.memory_info().rss)
    return max(sizes) / 2**20, len(sizes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--trust", default=None, help="modules besides the project's the checkpoint may name")
    parser.add_argument("--requests", type=int, default=400, help="requests per concurrency level and round")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=1, help="times to run every level against the same server")
    parser.add_argument("--bad-every", type=int, default=0, help="every K-th request is one to refuse (0: none)")
    args = parser.parse_args(argv)
    with exit_on_user_error("serve-bench"):  # no checkpoint, a broken one: one line, exit 2
        measure(args)


def measure(args: argparse.Namespace) -> None:
    """Baseline, then each round of concurrency levels against one server (see the module docstring)."""
    checkpoint = Path(args.ckpt) if args.ckpt else best_checkpoint("logs")
    trained = load_trained(checkpoint, trust=trusted_modules(args.trust))
    trained.datamodule.setup("predict")
    example = example_input(trained)
    body = json.dumps({"inputs": [example]}).encode()
    bad_body = json.dumps({"inputs": [refused_input(example, trained.datamodule.request_schema())]}).encode()
    every = args.bad_every
    bodies = [bad_body if every and i % every == every - 1 else body for i in range(args.requests)]

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
        rss, processes = largest_rss_mb(process)
        print(f"server: {processes} processes, largest RSS {rss:.0f} MB after warm-up")
        failures = 0
        for round_ in range(1, args.rounds + 1):
            for level in args.concurrency:
                failures += run_level(port, bodies, bad_body, level, baseline, round_, process)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    if failures:
        sys.exit(f"serve_load: {failures} requests got an answer other than 200 (good) or 422 (bad)")


def run_level(
    port: int, bodies: list[bytes], bad_body: bytes, level: int, baseline: float, round_: int, process: subprocess.Popen
) -> int:
    """Send ``bodies`` from ``level`` threads, print the level's line, and return how many got a wrong status."""
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level) as pool:
        results = list(pool.map(lambda body: timed_post(port, body), bodies))
    elapsed = time.perf_counter() - start
    good = [(status, seconds) for body, (status, seconds) in zip(bodies, results, strict=True) if body is not bad_body]
    bad = [status for body, (status, _) in zip(bodies, results, strict=True) if body is bad_body]
    answered, refused = sum(status == 200 for status, _ in good), sum(status == 422 for status in bad)
    latencies = sorted(seconds for _, seconds in good)
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    rss, _ = largest_rss_mb(process)
    print(
        f"round {round_} concurrency {level:3d}: {len(bodies)} requests, good {answered}/{len(good)} answered, "
        f"bad {refused}/{len(bad)} refused, p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
        f"{len(bodies) / elapsed:.0f} requests/s, p50 / baseline {p50 / baseline:.1f}x, largest RSS {rss:.0f} MB"
    )
    return len(good) - answered + len(bad) - refused


def refused_input(example: Any, schema: dict[str, Any]) -> Any:
    """``example`` made into one the server must refuse with 422 (see engine.serving.check_inputs)."""
    if schema["kind"] == "text":
        return 123
    if schema["kind"] == "row":
        return {**example, schema["numeric"][0]: "tall"} if schema["numeric"] else {**example, "no such column": 1}
    if not isinstance(example, list):
        return float("nan")  # a NaN pixel: JSON clients send it, and it must not reach the model
    return [refused_input(example[0], schema), *example[1:]]


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
