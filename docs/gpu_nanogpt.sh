#!/bin/bash
# The language-model bake against nanoGPT's train.py on one GPU (docs/benchmarks.md, 2026-11-27).
# Stage 1: tokens/s of both at GPT-2 small's shape; stage 2: the GPU tests and the presets;
# stage 3: where the Lightning path's extra time goes. Every figure is appended to $OUT/results.txt
# as soon as it exists, so a cut run still returns what it measured. DRY=1: a tiny CPU rehearsal.
#
# Prepared on a machine with network, then carried (.gpu and .whl) to the GPU machine:
#   .gpu/bake/byte-gpt   cookiecutter --no-input -o .gpu/bake . task=language-model logger=csv
#   .gpu/nanogpt         train.py, model.py, configurator.py of karpathy/nanoGPT (3adf61e), and
#                        data/moby/{train,val}.bin: the bundled Moby-Dick as uint16 bytes (90/10),
#                        meta.pkl {"vocab_size": 256}, so nanoGPT trains the same byte vocabulary
#   .gpu/nofinite.yaml   the default callbacks without StopOnNonFinite (stage 3)
#   .whl                 jsonargparse 4.53.0, docstring-parser, typeshed-client, importlib_resources
# Every command has its own limit, with -k: PreemptionCheckpoint treats timeout's SIGTERM as a
# request to save at the next step, so a run still compiling ignored a plain `timeout`.
set -u
STAGE=${1:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=$OUT/results.txt; LOG=$OUT/all.log
export PYTHONUNBUFFERED=1 WANDB_MODE=offline
PY=${PY:-python3}
if [ -z "${DRY:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$ROOT"/.whl/*.whl || exit 3
  { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    $PY -c "import torch, lightning, sys; print(sys.version.split()[0], torch.__version__, 'lightning', lightning.__version__, torch.version.cuda)"; } >> "$OUT/device.txt" 2>&1
  N=(12 12 768 1024 12); STEPS=80; NG=(--device=cuda --compile=True --dtype=bfloat16)
  PRESET=(--config=configs/presets/gpu.yaml); COMPILE=--model.init_args.compile=true
else
  N=(1 2 32 64 4); STEPS=6; NG=(--device=cpu --compile=False --dtype=float32)
  PRESET=(--trainer.accelerator=cpu); COMPILE=--model.init_args.compile=false
fi
export PYTHONPATH=$ROOT/.gpu/bake/byte-gpt/src:/tmp/site
note() { echo "$*" | tee -a "$R"; }

if [ "$STAGE" = 1 ]; then
  cd "$ROOT/.gpu/nanogpt"
  echo "=== nanogpt" >> "$LOG"
  timeout -k 5 170 $PY train.py --dataset=moby --batch_size=${N[4]} --block_size=${N[3]} --n_layer=${N[0]} --n_head=${N[1]} --n_embd=${N[2]} \
    --gradient_accumulation_steps=1 --bias=True --dropout=0.0 "${NG[@]}" --max_iters=$STEPS --eval_interval=100000 --eval_iters=1 \
    --log_interval=1 --always_save_checkpoint=False --out_dir=/tmp/ngout --warmup_iters=10 --lr_decay_iters=$STEPS >> "$LOG" 2>&1
  note "nanogpt rc=$? $(grep -E '^iter [0-9]+:' "$LOG" | awk -v s=10 '{split($0,a,"time "); split(a[2],b,"ms"); n=$2+0; if (n>=s) print b[1]}' | sort -n | awk '{v[NR]=$1} END {print "median_ms=" v[int((NR+1)/2)]}')"
fi

cd "$ROOT/.gpu/bake/byte-gpt"
GPT=(--config=configs/default.yaml --data.init_args.block_size=${N[3]} --data.init_args.batch_size=${N[4]}
     --model.init_args.net.init_args.n_layer=${N[0]} --model.init_args.net.init_args.n_head=${N[1]}
     --model.init_args.net.init_args.n_embd=${N[2]} --model.init_args.net.init_args.dropout=0.0)
ours() {  # name, limit (s), path (project/plain), arguments
  local name=$1 limit=$2 path=$3; shift 3
  echo "=== $name" >> "$LOG"
  timeout -k 5 "$limit" $PY -m byte_gpt.bench --steps=$STEPS --worker="$path" "${GPT[@]}" "$@" >> "$LOG" 2>&1
  note "$name rc=$? $(grep BENCH_RESULT= "$LOG" | tail -1)"
}
if [ "$STAGE" = 1 ]; then
  ours ours_compiled 140 project "${PRESET[@]}" $COMPILE
  ours plain_compiled 90 plain "${PRESET[@]}" $COMPILE
  ours ours_compiled_foreach 80 project "${PRESET[@]}" $COMPILE --model.init_args.optimizer.init_args.foreach=true
  ours ours_eager 50 project "${PRESET[@]}"
fi
gpu_tests() {  # limit (s): the bake's GPU tests (a CPU rehearsal runs two CPU ones)
  echo "=== tests" >> "$LOG"
  local k="gpu or synchronises or fused"
  [ -n "${DRY:-}" ] && k="fused or weigh"
  timeout -k 5 "$1" $PY -m pytest -q -p no:cacheprovider -rs tests/test_language_model.py tests/test_resume.py \
    tests/test_precision.py -k "$k" >> "$LOG" 2>&1
  note "tests rc=$? $(tail -1 "$LOG")"
}
if [ "$STAGE" = 2 ]; then
  gpu_tests 200
  ours ours_fp32_eager 50 project "${PRESET[@]}" --trainer.precision=32-true
  ours ours_actckpt_eager 50 project "${PRESET[@]}" --model.init_args.net.init_args.activation_checkpointing=true
  [ -z "${DRY:-}" ] && ours ours_fsdp_eager 60 project "${PRESET[@]}" --config=configs/presets/fsdp.yaml
  ours ours_fp16_compiled 90 project "${PRESET[@]}" $COMPILE --trainer.precision=16-mixed
fi
if [ "$STAGE" = 3 ]; then
  gpu_tests 110
  ours ours_compiled 150 project "${PRESET[@]}" $COMPILE
  ours ours_compiled_nofinite 90 project "${PRESET[@]}" $COMPILE --config=$ROOT/.gpu/nofinite.yaml
  ours ours_compiled_workers 90 project "${PRESET[@]}" $COMPILE --data.init_args.num_workers=2 --data.init_args.persistent_workers=true
  [ -z "${DRY:-}" ] && ours ours_fsdp_eager 50 project "${PRESET[@]}" --config=configs/presets/fsdp.yaml
fi
note "stage $STAGE done"
