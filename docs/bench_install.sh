#!/usr/bin/env bash
# `make install` wall time for each task's default bake: uv from uv.lock (empty cache, then warm)
# against pip from the version ranges (warm cache; what `make install` did without uv before it
# required uv, written out here), in one run on one machine, so the ratio
# holds even where the seconds do not. torch comes from the same wheel in every install (TORCH=).
#   bash docs/bench_install.sh [TORCH]      (default: .ci/torch_spec, this environment's torch build)
# Prints one Markdown table row per task; docs/benchmarks.md keeps the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="$PWD/.venv/bin/python"
WORK=$(mktemp -d /tmp/bench-install.XXXX)
mkdir -p "$WORK/bin" && ln -s "$PWD/.venv/bin/uv" "$WORK/bin/uv"
TORCH=${1:-$(.ci/torch_spec)}

seconds() {  # seconds of `make install` in $1 with the environment given after it; a fresh .venv each time
    local project=$1; shift
    rm -rf "$project/.venv"
    local start
    start=$(date +%s.%N)
    env "$@" make -C "$project" --no-print-directory install TORCH="$TORCH" > "$WORK/last.log" 2>&1 \
        || { tail -20 "$WORK/last.log" >&2; exit 1; }
    "$PY" -c "print($(date +%s.%N) - $start)"
}

pip_seconds() {  # seconds of the same install by pip from pyproject.toml's ranges; a fresh .venv each time
    local project=$1 start
    rm -rf "$project/.venv"
    start=$(date +%s.%N)
    (cd "$project" && python3 -m venv .venv && .venv/bin/python -m pip install --upgrade pip \
        && .venv/bin/python -m pip install $TORCH && .venv/bin/python -m pip install -e ".[dev,sweep,export,serve,finetune]") \
        > "$WORK/last.log" 2>&1 || { tail -20 "$WORK/last.log" >&2; exit 1; }
    "$PY" -c "print($(date +%s.%N) - $start)"
}

echo "| task | uv, empty cache | uv, warm (2 runs) | pip, warm (2 runs) | pip / uv (warm) |"
echo "|---|---|---|---|---|"
for task in image-classification tabular language-model; do
    PATH="$WORK/bin:$PATH" "$PY" -m cookiecutter --no-input -o "$WORK/$task" . "task=$task" > /dev/null
    project=$(find "$WORK/$task" -mindepth 1 -maxdepth 1 -type d)
    test -s "$project/uv.lock"
    cold=$(seconds "$project" PATH="$WORK/bin:$PATH" UV_CACHE_DIR="$WORK/uv-cache-$task")
    seconds "$project" PATH="$WORK/bin:$PATH" UV_CACHE_DIR="$WORK/uv-cache-$task" > /dev/null  # warm-up
    warm1=$(seconds "$project" PATH="$WORK/bin:$PATH" UV_CACHE_DIR="$WORK/uv-cache-$task")
    warm2=$(seconds "$project" PATH="$WORK/bin:$PATH" UV_CACHE_DIR="$WORK/uv-cache-$task")
    pip_seconds "$project" > /dev/null  # pip's warm-up (its cache is the user's)
    pip1=$(pip_seconds "$project")
    pip2=$(pip_seconds "$project")
    printf "| %s | %.1f | %.1f, %.1f | %.1f, %.1f | %.1f |\n" "$task" "$cold" "$warm1" "$warm2" "$pip1" "$pip2" \
        "$("$PY" -c "print(($pip1 + $pip2) / ($warm1 + $warm2))")"
done
rm -rf "$WORK"
