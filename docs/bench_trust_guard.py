"""What the trust guard (engine.trust.loading) costs a load: load_trained with it and without, in one bake.

Run from a baked project's folder, in its environment (the figure in docs/trust.md: the language-model
bake, 2 cores): python ../path/to/docs/bench_trust_guard.py <package_name>
It fits one shrunk epoch (the tests' shrunk arguments), then times load_trained of its last.ckpt 15
times guarded, 15 times with loading replaced by a no-op, and 15 times guarded again; medians in ms.
"""

import contextlib
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

package = sys.argv[1]
sys.path.insert(0, "tests")
from conftest import shrunk_args  # noqa: E402 - the bake's own tests folder, put on the path above

main = importlib.import_module(f"{package}.cli").main
inference = importlib.import_module(f"{package}.engine.inference")


def median_ms(checkpoint: Path, repeats: int = 15) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        inference.load_trained(checkpoint)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


with tempfile.TemporaryDirectory() as folder:
    main(["fit", *shrunk_args(Path(folder)), "--test_after_fit=false"])
    (checkpoint,) = Path(folder).rglob("last.ckpt")
    guarded = median_ms(checkpoint)
    real = inference.loading
    inference.loading = lambda *args, **kwargs: contextlib.nullcontext()
    unguarded = median_ms(checkpoint)
    inference.loading = real
    again = median_ms(checkpoint)
print(f"load_trained median: guarded {guarded:.1f} ms, {again:.1f} ms again; unguarded {unguarded:.1f} ms")
