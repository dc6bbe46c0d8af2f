#!/usr/bin/env bash
# Tensor parallelism on the lent GPU machine (issue 17): one call that
#   1. builds (scripts/gpu-check.sh without benchmarks) with the GPU tests
#      of SMELT_TP_TESTS (default test_cuda_nccl,test_cuda_session);
#   2. runs tests/e2e/test_tp.py --cuda: every example compiled with --tp 2
#      and 4 --target cuda against the interpreter, and tiny_lm's greedy ids
#      on 1 and 2 ranks against the CPU's. One GPU a rank (NCCL) where the
#      machine has enough, else every rank on cuda:0 (host collectives);
#   3. W5 (TinyLlama-1.1B shapes, f16, random weights) compiled with --tp 1
#      and 2: with 2 or more GPUs, decode (seq=1, ctx 4096) and a 2048-token
#      prefill, `smelt bench` on one GPU and on --devices cuda:0,cuda:1, for
#      docs/perf.md; on any machine, the greedy ids of both (smelt generate;
#      one GPU: both ranks on cuda:0) and their logits' cosine.
#
#   run: scripts/gpu-tp.sh   (carry [".deps"]; NCCL_NVLS_ENABLE=0 is kept)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
START=$(date +%s)
LOGS="${OUT:-build-gpu/logs}"
mkdir -p "$LOGS"
SMELT_GPU_BENCH=0 SMELT_GPU_CODEGEN_TEST=0 SMELT_GPU_TESTS_ONLY="${SMELT_TP_TESTS-test_cuda_nccl,test_cuda_session}" \
  scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
echo "build+tests: rc $? in $(($(date +%s) - START)) s"
grep -E "^(PASS|FAIL|ok|SKIP)|passed|failed|error:|NCCL" "$LOGS/gpu-check.log" | tail -12
SMELT=build-gpu/smelt
[ -x "$SMELT" ] || exit 1
t0=$(date +%s)
timeout 300 python3 tests/e2e/test_tp.py --smelt "$SMELT" --cuda --keep /tmp/tp-cuda > "$LOGS/test_tp_cuda.log" 2>&1
echo "test_tp.py --cuda: rc $? in $(($(date +%s) - t0)) s"
cat "$LOGS/test_tp_cuda.log" | tail -30
GPUS=$(nvidia-smi -L | grep -c '^GPU ')
DEV2=cuda:0,cuda:1
[ "$GPUS" -ge 2 ] || DEV2=cuda:0,cuda:0 # one GPU: both ranks on it, host collectives (no timings)
W5=/tmp/w5
SHAPES=(--hidden 2048 --heads 32 --kv-heads 4 --ffn 5632 --layers 22 --vocab 32000 --max-pos 4096 --theta 10000
        --eps 1e-5 --dtype f16)
[ -f "$W5/config.json" ] || python3 tests/hf/make_checkpoint.py "$W5" "${SHAPES[@]}" > "$LOGS/ckpt.log" 2>&1
"$SMELT" import hf "$W5" -o "$W5/w5.yaml" --ctx 4096 > "$LOGS/import.log" 2>&1
for tp in 1 2; do
  "$SMELT" compile "$W5/w5.yaml" --target cuda --tp $tp --dim seq=1,2048 -o "$W5/w5-tp$tp.smelt" > "$LOGS/compile-tp$tp.log" 2>&1 \
    || { echo "compile --tp $tp failed"; tail -5 "$LOGS/compile-tp$tp.log"; }
done
if [ "$GPUS" -ge 2 ]; then
  printf '%-6s %6s %16s\n' ranks seq "graph replay ms"
  for len in 1 2048; do
    for tp in 1 2; do
      dev=(--device cuda:0); [ $tp = 2 ] && dev=(--devices $DEV2)
      j="$LOGS/bench-tp$tp-$len.json"
      timeout 200 "$SMELT" bench "$W5/w5-tp$tp.smelt" "${dev[@]}" --dim "seq=$len" --iters 30 --json > "$j" 2> "$j.err"
      python3 -c "
import json,sys
try: r=json.load(open('$j'))
except Exception as e: print('$tp', '$len', 'FAILED', e); sys.exit()
t={x['name']:x['median_us'] for x in r['totals']}
print(f\"{'$tp':<6} {'$len':>6} {t.get('total (CUDA graph replay)',float('nan'))/1e3:16.3f}\")"
    done
  done
fi
# the same greedy ids on one GPU and on two ranks, and the logits' cosine
N=$([ "$GPUS" -ge 2 ] && echo 64 || echo 12)
for tp in 1 2; do
  dev=(--device cuda:0); [ $tp = 2 ] && dev=(--devices $DEV2)
  timeout 150 "$SMELT" generate "$W5/w5-tp$tp.smelt" "${dev[@]}" --prompt-ids 1,15043,29892,590,1024 -n $N --greedy \
    --json --dump-logits "$LOGS/logits-tp$tp.npy" > "$LOGS/gen-tp$tp.json" 2> "$LOGS/gen-tp$tp.err" \
    || tail -3 "$LOGS/gen-tp$tp.err"
done
python3 -c "
import json, numpy as np
a=json.load(open('$LOGS/gen-tp1.json')); b=json.load(open('$LOGS/gen-tp2.json'))
x=np.load('$LOGS/logits-tp1.npy').astype(np.float64).ravel(); y=np.load('$LOGS/logits-tp2.npy').astype(np.float64).ravel()
cos=float(x@y/np.linalg.norm(x)/np.linalg.norm(y))
print('W5 greedy ids on', '$DEV2', 'equal one GPU:', a['ids']==b['ids'], '; logits cosine %.6f' % cos)
print('tp1', {k:v for k,v in a.items() if k!='ids'}); print('tp2', {k:v for k,v in b.items() if k!='ids'})"
echo "== $(($(date +%s) - START)) s"
