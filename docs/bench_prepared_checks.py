"""What the prepared-data checks cost: the check every run makes (``open_prepared``) against the full
check (``python -m <package>.prepare --verify``), and both against writing the set, at several sizes.

For a bake installed in this Python (any task: the core is the same), each size writes a prepared
set of random 1 MiB records plus int64 labels with the bake's ``PreparedWriter`` (its SHA-256 is
computed while writing), then times ``open_prepared`` (full hashes up to ``FULL_CHECK_BYTES``, else
small shards in full and large shards sampled) and ``verify`` on 1 and 2 threads. The file pages are
in the page cache after the write, so the figures are the hashing cost; a cold read adds the disk's.

    python docs/bench_prepared_checks.py digits_classifier --gib 0.5 4

Prints one line per size (Markdown table rows).
"""

import argparse
import importlib
import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package", help="the bake's package name, e.g. digits_classifier")
    parser.add_argument("--gib", type=float, nargs="+", default=[0.5, 4.0])
    args = parser.parse_args()
    core = importlib.import_module(f"{args.package}.engine.prepared")
    print("| set | prepare (writes + hashes) | check on every run | `--verify`, 1 thread | `--verify`, 2 threads |")
    print("|---|---|---|---|---|")
    block = np.random.default_rng(0).integers(0, 255, size=(256, 1 << 20), dtype=np.uint8)  # 256 MiB
    for gib in args.gib:
        blocks = max(1, round(gib * 4))
        with tempfile.TemporaryDirectory(dir="/tmp") as folder:
            out = Path(folder) / "prepared"
            start = time.perf_counter()
            with core.PreparedWriter(out, "Toy", {}, {}) as writer:
                for _ in range(blocks):
                    writer.append("train", x=block, y=np.zeros(len(block), dtype=np.int64))
            write = time.perf_counter() - start
            size = sum(file.stat().st_size for file in out.rglob("*.bin"))
            start = time.perf_counter()
            core.open_prepared(out, "Toy", {})
            every_run = time.perf_counter() - start
            mode = "full" if size <= core.FULL_CHECK_BYTES else "small shards full, large sampled"
            verify = {}
            for workers in (1, 2):
                start = time.perf_counter()
                core.verify(out, workers)
                verify[workers] = time.perf_counter() - start
            mib = size / 2**20
            print(
                f"| {mib / 1024:.2f} GiB | {write:.1f} s | {every_run:.3f} s ({mode}) | "
                f"{verify[1]:.2f} s ({mib / verify[1]:,.0f} MiB/s) | {verify[2]:.2f} s ({mib / verify[2]:,.0f} MiB/s) |"
            )


if __name__ == "__main__":
    main()
