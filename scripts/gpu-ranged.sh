#!/usr/bin/env bash
# Ranged dims on the lent GPU (issue 12, "lengths at run time"): what a
# prefill costs in one program compiled for a range of lengths, against
# exact compiles of the same lengths, on W5 (TinyLlama-1.1B's shapes, f16,
# random weights; bench/gpu/w5.py writes the same checkpoint).
#
#   1. build: scripts/gpu-check.sh without benchmarks into build-gpu, with
#      the GPU tests of SMELT_RANGED_TESTS (default test_cuda_examples;
#      "" for none) and cpu/test_ranged --device cuda (ranged bundles
#      against exact ones);
#   2. the W5 checkpoint in /tmp/w5 (kept while the machine stays warm),
#      imported with a cache of 4096;
#   3. two bundles: ranged, --dim seq=1,2..2048 (an exact decode program and
#      one for every prefill length: what docs/serving.md recommends), and
#      exact, --dim seq=1,17,2048;
#   4. smelt bench of each at seq=17 and seq=2048 (the ranged bundle through
#      bench --dim seq=V, which binds the inputs at that length), 50 runs:
#      the CUDA graph replay's median, and the sum of the kernels.
# What to expect: ranged seq=17 close to exact seq=17 (its kernels keep the
# max's tiles, e.g. 128-row GEMM tiles where seq=17 alone would take 32;
# the blocks past the length leave at once), far under seq=2048's time;
# before the change (a tree in .base, see scripts/gpu-decode.sh) ranged
# seq=17 cost what seq=2048 costs.
#
#   run: scripts/gpu-ranged.sh   (carry [".deps"], or [".deps", ".base"])
# Environment: SMELT_RANGED_STEPS (build,w5; default both), SMELT_RANGED_LENS
# (default 17,2048), SMELT_RANGED_MAX (default 2048).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LOGS="${OUT:-build-gpu/logs}"
mkdir -p "$LOGS"
STEPS="${SMELT_RANGED_STEPS-build,w5}"
LENS="${SMELT_RANGED_LENS-17,2048}"
MAX="${SMELT_RANGED_MAX-2048}"
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }
W5DIR=/tmp/w5
SHAPES=(--hidden 2048 --heads 32 --kv-heads 4 --ffn 5632 --layers 22 --vocab 32000 --max-pos 4096 --theta 10000
        --eps 1e-5 --dtype f16)
shopt -s nullglob
debs=(.deps/*.deb)
if [ ${#debs[@]} -gt 0 ]; then
  . scripts/gpu-sysroot.sh
  smelt_gpu_sysroot "$(pwd)/.deps/root" "${debs[@]}"
fi

if has_step build; then
  t0=$(date +%s)
  SMELT_GPU_BENCH=0 SMELT_GPU_CODEGEN_TEST=0 SMELT_GPU_TESTS_ONLY="${SMELT_RANGED_TESTS-test_cuda_examples}" \
    scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
  echo "build: rc $? in $(($(date +%s) - t0)) s (log: $LOGS/gpu-check.log)"
  grep -E "^(PASS|FAIL|ok|SKIP)|passed|failed|error:|test_ranged" "$LOGS/gpu-check.log" | tail -12
fi

SMELT=build-gpu/smelt
if has_step w5 && [ -x "$SMELT" ]; then
  set -e
  [ -f "$W5DIR/config.json" ] || python3 tests/hf/make_checkpoint.py "$W5DIR" "${SHAPES[@]}" > "$LOGS/ckpt.log" 2>&1
  "$SMELT" import hf "$W5DIR" -o "$W5DIR/w5.yaml" --ctx 4096 > "$LOGS/import.log" 2>&1
  t0=$(date +%s)
  "$SMELT" compile "$W5DIR/w5.yaml" --target cuda --dim "seq=1,2..$MAX" -o "$W5DIR/w5-ranged.smelt" > "$LOGS/compile-ranged.log" 2>&1
  t1=$(date +%s)
  "$SMELT" compile "$W5DIR/w5.yaml" --target cuda --dim "seq=1,$LENS" -o "$W5DIR/w5-exact.smelt" > "$LOGS/compile-exact.log" 2>&1
  echo "compiled: ranged in $((t1 - t0)) s, exact in $(($(date +%s) - t1)) s"
  set +e
  printf '%-8s %6s %16s %18s\n' bundle seq "graph replay ms" "sum of kernels ms"
  for len in ${LENS//,/ }; do
    for kind in exact ranged; do
      j="$LOGS/bench-$kind-$len.json"
      timeout 300 "$SMELT" bench "$W5DIR/w5-$kind.smelt" --device cuda --dim "seq=$len" --iters 50 --json > "$j" 2> "$j.err"
      python3 - "$j" "$kind" "$len" <<'EOF'
import json, sys
path, kind, n = sys.argv[1:4]
try:
    r = json.load(open(path))
except Exception as e:
    print(f"{kind:<8} {n:>6}  FAILED: {e} (see {path}.err)")
    raise SystemExit(0)
t = {row["name"]: row["median_us"] for row in r["totals"]}
g = t.get("total (CUDA graph replay)", float("nan")) / 1e3
s = t.get("total (sum of kernels)", float("nan")) / 1e3
print(f"{kind:<8} {n:>6} {g:16.3f} {s:18.3f}   {r.get('ranged_dims', '')}")
EOF
    done
  done
fi
echo "== $(($(date +%s) - START)) s"
