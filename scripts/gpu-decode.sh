#!/usr/bin/env bash
# Decode work on the lent GPU (issues 12 and 15): this tree against an
# earlier one, side by side in one lease, and a short table at the end.
#
# .base/ (git-ignored through .git/info/exclude) may hold an earlier tree:
#   rm -rf .base && mkdir .base && git archive COMMIT | tar -x -C .base
# and travels with `carry: [".deps", ".base"]`.
#
# Steps (SMELT_DECODE_STEPS, comma-separated; default all of them):
#   build       scripts/gpu-check.sh without benchmarks: builds build-gpu and
#               runs the GPU tests of SMELT_DECODE_TESTS (default
#               test_cuda_examples,test_cuda_state_ops; "" for none)
#   base_build  the same build of .base (no tests) into .base/build-gpu
#   w5_base     bench/gpu/w5.py with .base's smelt (no peers), then
#               `smelt bench --dim seq=1` of its bundle: every kernel of
#               the decode step timed ($LOGS/kernels-base.log)
#   w5          bench/gpu/w5.py with this tree's smelt, the transformers
#               logits check (cosine of 16 steps) and the peers of
#               SMELT_DECODE_PEERS (w5.py --hf-modes; default none), then
#               the same per-kernel bench ($LOGS/kernels-new.log)
#   w5_pf       the same smelt compiling with SMELT_CUDA_PREFETCH=all (each
#               decode GEMV prefetches its whole weight slice into L2
#               before its programmatic-launch wait), no peers
#   w5_quant    bench/gpu/w5.py --quantize SMELT_DECODE_QUANT (default int4)
#               --contexts SMELT_DECODE_CONTEXTS (default 512), no peers: the
#               quantised bundle's decode against f16's, then its kernels
#   w5_qtune    after w5_quant: smelt tune of W5's decode with --quantize
#               (budget SMELT_DECODE_TUNE_BUDGET, default 50 s) into a copy
#               of the table ($LOGS/w5-quant.table), then w5.py with it
#   w5_sync     the same smelt with SMELT_GENERATE_SYNC=1 (one synchronous
#               run per decode step instead of the queued loop), no peers
# The W5 checkpoint is written once into /tmp/w5 (kept while the machine
# stays warm); each build has its own compile cache.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LOGS="${OUT:-build-gpu/logs}"
mkdir -p "$LOGS"
STEPS="${SMELT_DECODE_STEPS-build,base_build,w5_base,w5,w5_sync}"
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
rows=()
row() { rows+=("$(printf '%-11s %-5s %5ss  %s' "$1" "$2" "$3" "$4")"); }
W5DIR=/tmp/w5
# libyaml and jansson from .deps (a carried .deps replaces the unpacked one)
shopt -s nullglob
debs=(.deps/*.deb)
if [ ${#debs[@]} -gt 0 ]; then
  . scripts/gpu-sysroot.sh
  smelt_gpu_sysroot "$(pwd)/.deps/root" "${debs[@]}"
fi

# W5 with one smelt: $1 label, $2 smelt binary, then w5.py's extra flags
w5_run() {
  local label=$1 bin=$2 t0 rc
  shift 2
  t0=$(date +%s)
  SMELT_CACHE_DIR="/tmp/cache-$label" timeout 420 python3 bench/gpu/w5.py --smelt "$bin" --dir "$W5DIR" --steps 64 \
    --json "$LOGS/w5-$label.json" "$@" > "$LOGS/w5-$label.log" 2>&1
  rc=$?
  timeout 120 "$bin" bench "$W5DIR/w5.smelt" --device cuda --dim seq=1 --iters 200 > "$LOGS/kernels-$label.log" 2>&1
  row "w5 $label" "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "bench/gpu/w5.py $*"
  grep -E "^ *(context|512|2048)|error|FAILED" "$LOGS/w5-$label.log" | head -8
  grep -E "graph|replay|sum of|kernels" "$LOGS/kernels-$label.log" | head -6
}

if has_step build; then
  t0=$(date +%s)
  SMELT_GPU_BENCH=0 SMELT_GPU_CODEGEN_TEST=0 \
    SMELT_GPU_TESTS_ONLY="${SMELT_DECODE_TESTS-test_cuda_examples,test_cuda_state_ops}" \
    scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
  rc=$?
  row build "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "gpu-check.sh, tests: ${SMELT_DECODE_TESTS-test_cuda_examples,test_cuda_state_ops}"
  grep -E "^(PASS|FAIL|ok|SKIP)|passed|failed|error:" "$LOGS/gpu-check.log" | tail -12
fi
if has_step base_build && [ -d .base ]; then
  t0=$(date +%s)
  ln -sfn ../.deps .base/.deps
  (cd .base && SMELT_GPU_BENCH=0 SMELT_GPU_TESTS=0 scripts/gpu-check.sh) > "$LOGS/gpu-check-base.log" 2>&1
  rc=$?
  row base_build "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) ".base/build-gpu"
fi
if has_step w5_base && [ -x .base/build-gpu/smelt ]; then
  w5_run base .base/build-gpu/smelt --no-peer
fi
if has_step w5 && [ -x build-gpu/smelt ]; then
  peers="${SMELT_DECODE_PEERS-}"
  if [ -n "$peers" ]; then w5_run new build-gpu/smelt --hf-modes "$peers"
  else w5_run new build-gpu/smelt --hf-modes '' --no-static; fi
fi
if has_step w5_pf && [ -x build-gpu/smelt ]; then
  # every decode GEMV asks L2 for its whole slice of the weight before it
  # waits for the kernel before it (codegen: SMELT_CUDA_PREFETCH=all)
  SMELT_CUDA_PREFETCH=all w5_run pf_all build-gpu/smelt --no-peer
fi
if has_step w5_quant && [ -x build-gpu/smelt ]; then
  # the same W5 compiled with --quantize (SMELT_DECODE_QUANT, default int4)
  # beside the f16 bundle, prompts of SMELT_DECODE_CONTEXTS (default 512),
  # no peers; then every kernel of the first mode's decode step timed
  t0=$(date +%s)
  q="${SMELT_DECODE_QUANT:-int4}"
  SMELT_CACHE_DIR=/tmp/cache-quant timeout 400 python3 bench/gpu/w5.py --smelt build-gpu/smelt --dir "$W5DIR" --steps 64 \
    --no-peer --contexts "${SMELT_DECODE_CONTEXTS:-512}" --quantize "$q" --json "$LOGS/w5-quant.json" > "$LOGS/w5-quant.log" 2>&1
  rc=$?
  timeout 120 build-gpu/smelt bench "$W5DIR/w5_${q%%,*}.smelt" --device cuda --dim seq=1 --iters 200 > "$LOGS/kernels-quant.log" 2>&1
  row "w5 quant" "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "bench/gpu/w5.py --quantize $q"
  tail -12 "$LOGS/w5-quant.log"
  grep -E "graph|replay|sum of|kernels" "$LOGS/kernels-quant.log" | head -6
fi
if has_step w5_qtune && [ -x build-gpu/smelt ] && [ -f "$W5DIR/w5.yaml" ]; then
  # after w5_quant: smelt tune of W5's decode (seq 1) with --quantize, into
  # a copy of the table in use ($LOGS/w5-quant.table), then w5.py --quantize
  # again with that table (a compile cache of its own)
  t0=$(date +%s)
  q="${SMELT_DECODE_QUANT:-int4}"
  cp "${SMELT_TUNE_TABLE:-tuning/cuda.table}" "$LOGS/w5-quant.table"
  timeout "${SMELT_DECODE_TUNE_S:-90}" build-gpu/smelt tune "$W5DIR/w5.yaml" --target cuda --quantize "${q%%,*}" --dim seq=1 \
    --budget "${SMELT_DECODE_TUNE_BUDGET:-50}" -o "$LOGS/w5-quant.table" > "$LOGS/w5-qtune.log" 2>&1
  rc=$?
  grep -E "^\[|-> best" "$LOGS/w5-qtune.log" | head -40
  SMELT_TUNE_TABLE="$LOGS/w5-quant.table" SMELT_CACHE_DIR=/tmp/cache-qtune timeout 300 python3 bench/gpu/w5.py --smelt build-gpu/smelt \
    --dir "$W5DIR" --steps 64 --no-peer --contexts "${SMELT_DECODE_CONTEXTS:-512}" --quantize "$q" \
    --json "$LOGS/w5-qtuned.json" > "$LOGS/w5-qtuned.log" 2>&1 || rc=1
  row "w5 qtune" "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "smelt tune --quantize $q of W5, then w5.py with it"
  tail -6 "$LOGS/w5-qtuned.log"
fi
if has_step w5_sync && [ -x build-gpu/smelt ]; then
  SMELT_GENERATE_SYNC=1 w5_run sync build-gpu/smelt --no-peer
fi

echo
echo "== summary ($(($(date +%s) - START)) s)"
printf '%s\n' "${rows[@]}"
