#!/usr/bin/env bash
# One call on the lent GPU machine that checks the open issues' GPU parts
# and prints a short table: build (scripts/gpu-check.sh without the
# benchmark), a chosen subset of the GPU tests, the Python package's CUDA
# test (scripts/gpu-python.sh), W4's compile time with `smelt compile
# --time` (issue 10: bench/compile_time.sh) and the quantised kernels
# against their peers (issue 14: bench/gpu/quant.py).
#
# Usage: scripts/gpu-verify.sh            (from the repository root, .deps carried)
# Environment: SMELT_VERIFY_TESTS (GPU tests to run, default
# test_cuda_session,test_cuda_examples,test_cuda_state_ops; "all" = every
# one; "" = none), SMELT_VERIFY_STEPS (default python,compile_time,quant),
# SMELT_VERIFY_QUANT (quant.py's --only, default gemv,w2_m1); the steps
# onnx_tune (after onnx_bench: smelt tune of ResNet-50, then it again) and
# onnx_bench (bench/cpu/onnx_models.py --device cuda for each dtype of
# SMELT_VERIFY_ONNX_DTYPES, default f16, then `smelt bench` of each bundle:
# $LOGS/kernels-NAME.log), onnx_test (test_onnx_models.py, CUDA runs
# only), quant_pf (quant.py with SMELT_CUDA_PREFETCH=all, workloads
# SMELT_VERIFY_QUANT_PF, default w2_m1) and ncu (Nsight Compute, after quant, on its bundles named in
# SMELT_VERIFY_NCU, default gemv_int4,gemv_int8,gemv_f16) and quant_tune
# (after quant: smelt tune --quantize of its models, then quant.py again with
# the tuned table) are not in the default list.
# Logs go to $OUT (the device tool's folder) when set, else build-gpu/logs.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
LOGS="${OUT:-build-gpu/logs}"
mkdir -p "$LOGS"
TESTS="${SMELT_VERIFY_TESTS-test_cuda_session,test_cuda_examples,test_cuda_state_ops}"
STEPS="${SMELT_VERIFY_STEPS-python,compile_time,quant}"
rows=()
row() { rows+=("$(printf '%-14s %-5s %5ss  %s' "$1" "$2" "$3" "$4")"); }
has_step() { [[ ",$STEPS," == *",$1,"* ]]; }

t0=$(date +%s)
if [ "$TESTS" = all ]; then
  SMELT_GPU_BENCH=0 SMELT_GPU_CODEGEN_TEST=0 scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
elif [ -n "$TESTS" ]; then
  SMELT_GPU_BENCH=0 SMELT_GPU_CODEGEN_TEST=0 SMELT_GPU_TESTS_ONLY="$TESTS" scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
else
  SMELT_GPU_BENCH=0 SMELT_GPU_TESTS=0 scripts/gpu-check.sh > "$LOGS/gpu-check.log" 2>&1
fi
rc=$?
row build+tests "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "gpu-check.sh, tests: ${TESTS:-none}"
grep -E "^(PASS|FAIL|ok|SKIP)|passed|failed" "$LOGS/gpu-check.log" | tail -15
if [ ! -x build-gpu/smelt ]; then
  tail -40 "$LOGS/gpu-check.log"
  printf '%s\n' "${rows[@]}"
  exit 1
fi

if has_step python; then
  t0=$(date +%s)
  scripts/gpu-python.sh build-gpu/smelt > "$LOGS/python.log" 2>&1
  rc=$?
  row python "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$(grep -cE '^ok' "$LOGS/python.log") ok, $(grep -cE '^FAIL' "$LOGS/python.log") FAIL"
  grep -E "^FAIL|^note|error" "$LOGS/python.log" | head -20
fi

if has_step compile_time; then
  t0=$(date +%s)
  W4="${TMPDIR:-/tmp}/w4p"
  [ -f "$W4/w4_prefill.yaml" ] || python3 bench/gpu/bench.py --prepare "$W4" > "$LOGS/prepare.log" 2>&1
  for mode in embedded external; do
    flags=()
    [ $mode = external ] && flags=(--external-weights)
    export SMELT_CACHE_DIR="${TMPDIR:-/tmp}/verify-cache-$mode"
    rm -rf "$SMELT_CACHE_DIR"
    echo "== --time, $mode, cold"
    build-gpu/smelt compile "$W4/w4_prefill.yaml" --target cuda --arch sm_90a "${flags[@]}" -o "${TMPDIR:-/tmp}/w4t.smelt" --time
  done > "$LOGS/compile_time.log" 2>&1
  unset SMELT_CACHE_DIR
  for i in 1 2 3; do bench/compile_time.sh build-gpu/smelt build-gpu/run_bundle "$W4/w4_prefill.yaml"; done >> "$LOGS/compile_time.log" 2>&1
  rc=$?
  row compile_time "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "W4 cold/warm, 3 rounds"
  cat "$LOGS/compile_time.log"
fi

if has_step onnx_bench; then
  # issue 11: BERT-base and ResNet-50 from their .onnx against torch.compile
  t0=$(date +%s)
  for dt in ${SMELT_VERIFY_ONNX_DTYPES:-f16}; do
    timeout "${SMELT_VERIFY_ONNX_TIMEOUT:-240}" python3 bench/cpu/onnx_models.py --smelt build-gpu/smelt --device cuda \
      --dtype "$dt" --rounds 2 --min-seconds 1 --keep "${TMPDIR:-/tmp}/onnx-bench" \
      --compile-mode "${SMELT_VERIFY_COMPILE_MODE:-default}"
  done > "$LOGS/onnx_bench.log" 2>&1
  rc=$?
  row onnx_bench "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "bench/cpu/onnx_models.py --device cuda"
  grep -vE "Warning|warn\(|^\s*$" "$LOGS/onnx_bench.log" | tail -16
  # every kernel of the last dtype's bundles, timed one by one (smelt bench)
  for b in "${TMPDIR:-/tmp}"/onnx-bench/*.smelt; do
    [ -f "$b" ] && timeout 60 build-gpu/smelt bench "$b" --device cuda > "$LOGS/kernels-$(basename "$b" .smelt).log" 2>&1
  done
fi

if has_step onnx_tune; then
  # smelt tune on ResNet-50's convs (the .onnx onnx_bench exported), into
  # tuning/cuda.table (copied to $LOGS), then ResNet-50 benched again
  t0=$(date +%s)
  B="${TMPDIR:-/tmp}/onnx-bench"
  timeout "${SMELT_VERIFY_TUNE_TIMEOUT:-260}" build-gpu/smelt tune "$B/resnet.onnx" --dtype f16 \
    --budget "${SMELT_VERIFY_TUNE_BUDGET:-200}" -o tuning/cuda.table > "$LOGS/tune.log" 2>&1
  rc=$?
  cp tuning/cuda.table "$LOGS/cuda.table"
  timeout 200 python3 bench/cpu/onnx_models.py --smelt build-gpu/smelt --device cuda --dtype f16 --rounds 2 \
    --min-seconds 1 --keep "$B" --only resnet --compile-mode "${SMELT_VERIFY_COMPILE_MODE:-default}" \
    > "$LOGS/onnx_bench_tuned.log" 2>&1
  timeout 60 build-gpu/smelt bench "$B/resnet.smelt" --device cuda > "$LOGS/kernels-resnet-tuned.log" 2>&1
  row onnx_tune "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "smelt tune resnet.onnx, then bench"
  grep -E "^\[|REJECT|best|error" "$LOGS/tune.log" | tail -30
  grep -E "^\|" "$LOGS/onnx_bench_tuned.log"
fi

if has_step onnx_test; then
  # issue 11: every committed ONNX model on the GPU, f32 and f16, against ORT
  t0=$(date +%s)
  SMELT_ONNX_CUDA_ONLY=1 timeout 200 python3 tests/onnx/test_onnx_models.py --smelt build-gpu/smelt > "$LOGS/onnx_test.log" 2>&1
  rc=$?
  row onnx_test "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "$(grep -c ' cuda f' "$LOGS/onnx_test.log") cuda rows"
  grep -E "cuda|FAIL" "$LOGS/onnx_test.log" | tail -34
fi

if has_step quant; then
  t0=$(date +%s)
  timeout 200 python3 bench/gpu/quant.py --smelt build-gpu/smelt --keep "${TMPDIR:-/tmp}/smelt-quant" --only "${SMELT_VERIFY_QUANT:-gemv,w2_m1}" > "$LOGS/quant.log" 2>&1
  rc=$?
  row quant "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "bench/gpu/quant.py"
  tail -30 "$LOGS/quant.log"
fi

if has_step quant_pf; then
  # the quant step again with every quantised GEMV asking L2 for its whole
  # slice of the weight before it waits (SMELT_CUDA_PREFETCH=all)
  t0=$(date +%s)
  SMELT_CUDA_PREFETCH=all timeout 200 python3 bench/gpu/quant.py --smelt build-gpu/smelt --keep "${TMPDIR:-/tmp}/smelt-quant-pf" \
    --only "${SMELT_VERIFY_QUANT_PF:-w2_m1}" > "$LOGS/quant_pf.log" 2>&1
  rc=$?
  row quant_pf "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "quant.py, SMELT_CUDA_PREFETCH=all"
  tail -12 "$LOGS/quant_pf.log"
fi

if has_step quant_tune; then
  # smelt tune --quantize on the quant step's models (SMELT_VERIFY_QUANT_TUNE,
  # MODEL:MODE pairs, default gemv:int4 and W2 M=1 in int4, int8 and fp8),
  # into a copy of tuning/cuda.table ($LOGS/cuda.table.tuned), then the
  # quant step again with that table
  t0=$(date +%s)
  K="${TMPDIR:-/tmp}/smelt-quant"
  cp tuning/cuda.table "$LOGS/cuda.table.tuned"
  rc=0
  for spec in $(echo "${SMELT_VERIFY_QUANT_TUNE:-gemv:int4,w2_m1:int4,w2_m1:int8,w2_m1:fp8}" | tr , ' '); do
    echo "== smelt tune ${spec%%:*} --quantize ${spec##*:}"
    timeout 150 build-gpu/smelt tune "$K/${spec%%:*}.yaml" --target cuda --quantize "${spec##*:}" --budget 60 \
      -o "$LOGS/cuda.table.tuned" || rc=1
  done > "$LOGS/quant_tune.log" 2>&1
  SMELT_TUNE_TABLE="$LOGS/cuda.table.tuned" timeout 200 python3 bench/gpu/quant.py --smelt build-gpu/smelt \
    --keep "${TMPDIR:-/tmp}/smelt-quant-tuned" --only "${SMELT_VERIFY_QUANT:-gemv,w2_m1}" --no-nbits > "$LOGS/quant_tuned.log" 2>&1 || rc=1
  row quant_tune "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "smelt tune --quantize, then quant.py with the table"
  grep -E "^== |^\[|^  q|best|REJECT|error" "$LOGS/quant_tune.log" | head -70
  tail -24 "$LOGS/quant_tuned.log"
fi

if has_step ncu; then
  # Nsight Compute on the quant step's bundles (SMELT_VERIFY_NCU, default
  # gemv_int4,gemv_int8,gemv_f16): speed of light, warp stalls, occupancy
  t0=$(date +%s)
  for name in $(echo "${SMELT_VERIFY_NCU:-gemv_int4,gemv_int8,gemv_f16}" | tr , ' '); do
    b="${TMPDIR:-/tmp}/smelt-quant/$name.smelt"
    [ -f "$b" ] || { echo "ncu: no $b (run the quant step first)"; continue; }
    echo "== ncu $name"
    timeout 120 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
      -c "${SMELT_VERIFY_NCU_COUNT:-3}" build-gpu/smelt bench "$b" --device cuda --iters 2
  done > "$LOGS/ncu.log" 2>&1
  rc=$?
  row ncu "$([ $rc = 0 ] && echo ok || echo FAIL)" $(($(date +%s) - t0)) "ncu of the quant bundles: $LOGS/ncu.log"
  grep -E "^== ncu|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Stall|Issue Slots Busy|No Eligible|Warp Cycles Per Issued" "$LOGS/ncu.log" | head -80
fi

echo
echo "== summary ($(($(date +%s) - START)) s)"
printf '%s\n' "${rows[@]}"
