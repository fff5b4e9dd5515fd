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

--expensive-every K makes every K-th request (a bad one wins where both fall) the costliest one the
server accepts to read:
{%- if cookiecutter.task == "image-classification" %}
256 PNGs of 16000x1000 pixels, each 2 KB and under --max_image_pixels, 4.1 billion pixels to
decode in all, which the server must refuse with 422 from their headers (--max_request_pixels);
for a model that takes no image files, 256 examples, which it must answer.
{%- elif cookiecutter.task == "language-model" %}
the most prompts --max_request_tokens lets one request hold (16 of 64 new tokens), which it must answer.
{%- else %}
256 examples (the most one request may hold), which it must answer.
{%- endif %}
The good requests' p99 beside them is the figure to read: a good request is answered within its
timeout while the expensive ones arrive.

Usage: python scripts/serve_load.py [--ckpt PATH] [--requests 400] [--concurrency 1 4 16]
                                    [--rounds 1] [--bad-every 0] [--expensive-every 0]
"""

import argparse
{%- if cookiecutter.task == "image-classification" %}
import base64
{%- endif %}
import contextlib
{%- if cookiecutter.task == "image-classification" %}
import io
{%- endif %}
import json
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

from {{ cookiecutter.package_name }}.commands.serve import {{ "MAX_REQUEST_TOKENS, " if cookiecutter.task == "language-model" else "" }}local_server
from {{ cookiecutter.package_name }}.engine import Trained, best_checkpoint, exit_on_user_error, load_trained, trusted_modules

PACKAGE = "{{ cookiecutter.package_name }}"


def timed_post(base: str, body: bytes) -> tuple[int, float]:
    """HTTP status and seconds of one POST /predict."""
    request = urllib.request.Request(f"{base}/predict", data=body, headers={"Content-Type": "application/json"})
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
    parser.add_argument("--expensive-every", type=int, default=0, help="every K-th request is the costliest (0: none)")
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
    schema = trained.datamodule.request_schema()
    bad_body = json.dumps({"inputs": [refused_input(example, schema)]}).encode()
    new_tokens = getattr(trained.model, "served_new_tokens", None)
    expensive, refuse_expensive = expensive_body(example, schema, new_tokens=new_tokens)
    bad, costly = args.bad_every, args.expensive_every
    bodies = [
        bad_body if bad and i % bad == bad - 1 else expensive if costly and i % costly == costly - 1 else body
        for i in range(args.requests)
    ]
    kinds = {id(bad_body): "bad", id(expensive): "expensive-refused" if refuse_expensive else "expensive-answered"}

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

    options = ["--api=predict"]  # what this load test sends (a language model's default is the OpenAI API)
    options += ["--trust", args.trust] if args.trust else []
    with local_server(checkpoint, options, start_seconds=120) as (base, process):
        for _ in range(20):
            timed_post(base, body)  # warm-up
        rss, processes = largest_rss_mb(process)
        print(f"server: {processes} processes, largest RSS {rss:.0f} MB after warm-up")
        failures = 0
        for round_ in range(1, args.rounds + 1):
            for level in args.concurrency:
                failures += run_level(base, bodies, kinds, level, baseline, round_, process)
    if failures:
        sys.exit(f"serve_load: {failures} requests got an answer other than 200 (good) or 422 (bad)")


def run_level(
    base: str,
    bodies: list[bytes],
    kinds: dict[int, str],
    level: int,
    baseline: float,
    round_: int,
    process: subprocess.Popen,
) -> int:
    """Send ``bodies`` from ``level`` threads, print the level's line, and return how many got a wrong status.

    ``kinds`` maps ``id(body)`` of the bad and the expensive body to their kind; any other body is good.
    """
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level) as pool:
        results = list(pool.map(lambda body: timed_post(base, body), bodies))
    elapsed = time.perf_counter() - start
    by_kind: dict[str, list[tuple[int, float]]] = {}
    for body, result in zip(bodies, results, strict=True):
        by_kind.setdefault(kinds.get(id(body), "good"), []).append(result)
    expected = {"good": 200, "bad": 422, "expensive-refused": 422, "expensive-answered": 200}
    right = {kind: sum(status == expected[kind] for status, _ in found) for kind, found in by_kind.items()}
    latencies = sorted(seconds for _, seconds in by_kind.get("good", []))
    p50 = latencies[len(latencies) // 2]
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    rss, _ = largest_rss_mb(process)
    counts = f"good {right.get('good', 0)}/{len(by_kind.get('good', []))} answered"
    counts += f", bad {right.get('bad', 0)}/{len(by_kind.get('bad', []))} refused"
    for kind in ("expensive-refused", "expensive-answered"):
        if kind in by_kind:
            counts += f", expensive {right[kind]}/{len(by_kind[kind])} {kind.split('-')[1]}"
    print(
        f"round {round_} concurrency {level:3d}: {len(bodies)} requests, {counts}, "
        f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, "
        f"{len(bodies) / elapsed:.0f} requests/s, p50 / baseline {p50 / baseline:.1f}x, largest RSS {rss:.0f} MB"
    )
    return sum(len(found) - right[kind] for kind, found in by_kind.items())


def expensive_body(
    example: Any, schema: dict[str, Any], max_inputs: int = 256, new_tokens: int | None = None
) -> tuple[bytes, bool]:
    """The costliest request the server reads (see the module docstring), and whether it must be refused.
    {%- if cookiecutter.task == "language-model" %}

    ``new_tokens``: the model's per prompt; --max_request_tokens then bounds the prompts.
    {% endif %}"""
{%- if cookiecutter.task == "language-model" %}
    if new_tokens:
        prompts = min(max_inputs, MAX_REQUEST_TOKENS // new_tokens)
        return json.dumps({"inputs": [example] * prompts}).encode(), False
{%- endif %}
{%- if cookiecutter.task == "image-classification" %}
    if schema.get("image_files"):
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("1", (16000, 1000)).save(buffer, format="PNG", optimize=True)  # 16 M pixels in about 2 KB
        picture = base64.b64encode(buffer.getvalue()).decode()
        return json.dumps({"inputs": [picture] * max_inputs}).encode(), True
{%- endif %}
    return json.dumps({"inputs": [example] * max_inputs}).encode(), False


def refused_input(example: Any, schema: dict[str, Any]) -> Any:
    """``example`` made into one the server must refuse with 422 (see serving.api.check_inputs)."""
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
