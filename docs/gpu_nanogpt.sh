#!/bin/bash
# The language-model bake against nanoGPT's train.py on one GPU (docs/benchmarks.md), one sitting.
# Every figure is appended to $OUT/results.txt as soon as it exists, so a cut run still returns what
# it measured; a run that no longer fits the sitting's budget (BUDGET seconds) is skipped, in order
# of priority. DRY=1: a tiny CPU rehearsal of every command.
#
# Two ways of timing, each for both programs:
#   windowed (the headline): wait for the GPU every 10 steps only, as a run that logs every 10 steps
#     does: nanoGPT's train.py with its default --log_interval=10 (each log line stamped on arrival),
#     ours through `bench --sync_every=10`. The host may queue step n+1 while the GPU runs step n.
#   per step: wait after every step (nanoGPT --log_interval=1, its own per-step time; ours
#     --sync_every=1), the discipline of the 2026-11-27 H100 figures.
#
# Prepared on a machine with network, then carried (.gpu and .whl) to the GPU machine:
#   .gpu/bake/byte-gpt   cookiecutter --no-input -o .gpu/bake . task=language-model logger=csv
#   .gpu/nanogpt         train.py, model.py, configurator.py of karpathy/nanoGPT (3adf61e), and
#                        data/moby/{train,val}.bin: the bundled Moby-Dick as uint16 bytes (90/10),
#                        meta.pkl {"vocab_size": 256}, so nanoGPT trains the same byte vocabulary
#   .gpu/syncguard.yaml  the default callbacks with StopOnNonFinite(on_device=false): the guard of before
#   .gpu/noguard.yaml    the default callbacks without StopOnNonFinite
#   .whl                 jsonargparse 4.53.0, docstring-parser, typeshed-client, importlib_resources
# Every command has its own limit, with -k: PreemptionCheckpoint treats timeout's SIGTERM as a
# request to save at the next step, so a run still compiling ignored a plain `timeout`.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$OUT/results.txt; LOG=$OUT/all.log
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
PY=${PY:-python3}
END=$((SECONDS + ${BUDGET:-520}))
if [ -z "${DRY:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl || exit 3
  N=(12 12 768 1024 12); STEPS=80; NG=(--device=cuda --compile=True --dtype=bfloat16)
  PRESET=(--config=configs/presets/gpu.yaml); COMPILE=--model.init_args.compile=true
else
  N=(1 2 32 64 4); STEPS=20; NG=(--device=cpu --compile=False --dtype=float32)
  PRESET=(--trainer.accelerator=cpu); COMPILE=--model.init_args.compile=false
fi
export PYTHONPATH=$ROOT/.gpu/bake/byte-gpt/src:/tmp/site
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, lightning, sys; from lightning.fabric.utilities.throughput import get_available_flops as f
print(sys.version.split()[0], torch.__version__, 'lightning', lightning.__version__, 'cuda', torch.version.cuda)
print('bf16 peak', f(torch.device('cuda'), torch.bfloat16) if torch.cuda.is_available() else None)"; } >> "$OUT/device.txt" 2>&1
note() { echo "$*" | tee -a "$R"; }
fits() {  # name, limit: true when the limit still fits the budget (and the name is in ONLY, when set)
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $1 "* ]]; then return 1; fi
  if [ $((END - SECONDS)) -lt "$2" ]; then note "$1 skipped: $((END - SECONDS)) s left"; return 1; fi
}
STAMP='import sys, time
for line in sys.stdin: print(f"{time.perf_counter():.6f} {line}", end="", flush=True)'

nanogpt() {  # name, limit, log interval: the median ms of a step (per step) or of 10-step windows / 10
  local name=$1 limit=$2 every=$3
  fits "$name" "$limit" || return
  echo "=== $name" >> "$LOG"
  (cd "$ROOT/.gpu/nanogpt" && timeout -k 5 "$limit" $PY train.py --dataset=moby --batch_size=${N[4]} --block_size=${N[3]} \
    --n_layer=${N[0]} --n_head=${N[1]} --n_embd=${N[2]} --gradient_accumulation_steps=1 --bias=True --dropout=0.0 "${NG[@]}" \
    --max_iters=$STEPS --eval_interval=100000 --eval_iters=1 --log_interval="$every" --always_save_checkpoint=False \
    --out_dir=/tmp/ngout --warmup_iters=10 --lr_decay_iters=$STEPS 2>&1 | $PY -u -c "$STAMP" > "$OUT/$name.log")
  local rc=$?
  cat "$OUT/$name.log" >> "$LOG"
  if [ "$every" = 1 ]; then  # its own per-step time, steps 10 on
    note "$name rc=$rc median_ms=$(grep -E ' iter [0-9]+:' "$OUT/$name.log" | awk '{split($0,a,"time "); split(a[2],b,"ms"); if ($3+0 >= 10) print b[1]}' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
  else  # windows between stamped log lines from iter 10 on
    note "$name rc=$rc window_median_ms=$(grep -E ' iter [0-9]+:' "$OUT/$name.log" | awk -v e="$every" '{it=$3+0; if (it >= 10) {if (n) print ($1-t)*1000/(it-i); t=$1; i=it; n=1}}' | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
  fi
}

cd "$ROOT/.gpu/bake/byte-gpt"
GPT=(--config=configs/default.yaml --data.init_args.block_size=${N[3]} --data.init_args.batch_size=${N[4]}
     --model.init_args.net.init_args.n_layer=${N[0]} --model.init_args.net.init_args.n_head=${N[1]}
     --model.init_args.net.init_args.n_embd=${N[2]} --model.init_args.net.init_args.dropout=0.0)
ours() {  # name, limit (s), path (project/plain), sync every, arguments
  local name=$1 limit=$2 path=$3 every=$4; shift 4
  fits "$name" "$limit" || return
  echo "=== $name" >> "$LOG"
  timeout -k 5 "$limit" $PY -m byte_gpt.commands.bench --steps=$STEPS --sync_every="$every" --worker="$path" "${GPT[@]}" "$@" >> "$LOG" 2>&1
  note "$name rc=$? $(grep BENCH_RESULT= "$LOG" | tail -1)"
}
gpu_tests() {  # limit (s): the bake's GPU tests (a CPU rehearsal runs CPU ones)
  fits tests "$1" || return
  echo "=== tests" >> "$LOG"
  local k="gpu or synchronises or never_wait"
  [ -n "${DRY:-}" ] && k="weigh or windows_tile"
  timeout -k 5 "$1" $PY -m pytest -q -p no:cacheprovider -rs tests/test_language_model.py tests/test_resume.py \
    tests/test_precision.py -k "$k" >> "$LOG" 2>&1
  note "tests rc=$? $(tail -1 "$LOG")"
}

nanogpt nanogpt_windowed 150 10
ours ours_compiled_windowed 130 project 10 "${PRESET[@]}" $COMPILE
ours ours_compiled_syncguard_windowed 75 project 10 "${PRESET[@]}" $COMPILE --config="$ROOT/.gpu/syncguard.yaml"
ours plain_compiled_windowed 75 plain 10 "${PRESET[@]}" $COMPILE
gpu_tests 130
nanogpt nanogpt_per_step 80 1
ours ours_compiled_per_step 70 project 1 "${PRESET[@]}" $COMPILE
ours ours_compiled_noguard_windowed 70 project 10 "${PRESET[@]}" $COMPILE --config="$ROOT/.gpu/noguard.yaml"
# Without the progress bar's and the logger's periodic reads of the loss (each one a host-device sync).
ours ours_compiled_quiet_windowed 70 project 10 "${PRESET[@]}" $COMPILE --trainer.enable_progress_bar=false --trainer.log_every_n_steps=1000
note "done, $((END - SECONDS)) s of the budget left"
