#!/usr/bin/env bash
# Builds smelt on the lent GPU machine and runs the GPU tests.
#
# The machine (Ubuntu 24.04, gcc 13, CMake 4, CUDA 13, an H200) has no
# libyaml, no jansson, no LLVM headers and no network.  libyaml and jansson
# come from the Debian packages scripts/fetch-gpu-deps.sh downloaded into
# .deps/ (carry it along: the directory is git-ignored); they are unpacked
# with `dpkg -x` into .deps/root and CMake finds them through pkg-config.
# LLVM is off (-DSMELT_LLVM=OFF): the CUDA backend needs only NVRTC and the
# driver, both loaded at run time.
#
# Steps (each prints its wall time; the summary lists them again):
#   1. unpack deps, show the GPU, configure, build what the GPU needs (the
#      smelt binary, every tests/gpu/test_*.c and the CUDA code-generation
#      unit test; the CPU-only unit tests are skipped: this machine has no
#      LLVM and the whole call must fit in 10 minutes);
#   2. run every GPU test (each tests/gpu/test_*.c binary, which is what
#      `ctest -L gpu` selects: the list is printed) and the CUDA
#      code-generation unit test;
#   3. the benchmark models' weights (bench/gpu/bench.py --prepare: W2 and
#      W4 safetensors and copies of bench/models/*.yaml in $BUILD/bench);
#   4. `smelt tune` over the W2, W3 and W4 models into the tuning table
#      ($OUT/cuda.table when $OUT is set, else $BUILD/cuda.table), each
#      model a share of the tuning budget; skipped when this smelt has no
#      tune command;
#   5. the benchmark bundles compiled with --tune-table (when smelt compile
#      has the flag and the table exists): bench.py --compile-only, which
#      also times W4's cold and warm compile;
#   6. the SASS summary: `smelt inspect --dump-cubins` of each bundle, then
#      bench/gpu/sass.py (cuobjdump -sass / -res-usage: HGMMA, HMMA, LDL/STL
#      per matmul and attention kernel); skipped without cuobjdump;
#   7. the GPU benchmark (bench/gpu/bench.py on those bundles: smelt against
#      PyTorch eager, torch.compile, cuBLAS and SDPA) in the time left.
# Exit status 0 when every test passed and smelt ran every benchmark
# workload with matching results.
#
# Environment: SMELT_GPU_BUILD_DIR (default build-gpu), SMELT_GPU_TIMEOUT
# (seconds per test, default 300), SMELT_GPU_BUDGET (seconds for the whole
# script, default 540), SMELT_GPU_TUNE_BUDGET (seconds for all of step 4,
# default 150; 0 skips it; it also never eats into the last
# SMELT_GPU_BENCH_RESERVE seconds, default 300, kept for steps 5-7),
# SMELT_GPU_BENCH=0 skips steps 3-7, SMELT_GPU_TESTS=0 skips step 2
# (SMELT_GPU_TESTS_ONLY=test_a,test_b runs only those tests/gpu tests;
# SMELT_GPU_TUNE_ONLY=w4_prefill,... tunes only those of the benchmark's models)
# (SMELT_GPU_CODEGEN_TEST=0 only its unit/test_cuda_codegen), SMELT_GPU_BENCH_ONLY picks the
# benchmark's workloads (default w1,w2_m1,w2_m2048,w3_prefill,w3_decode,
# w4_decode,w4_prefill; the examples mlp,cnn,gpt2_block,tiny_llama also
# exist), SMELT_GPU_TUNE_TABLE the table's path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR="$(pwd)"
BUILD="${SMELT_GPU_BUILD_DIR:-build-gpu}"
TIMEOUT="${SMELT_GPU_TIMEOUT:-300}"
BUDGET="${SMELT_GPU_BUDGET:-540}"
DEPS="$ROOT_DIR/.deps"
SYSROOT="$DEPS/root"
START=$(date +%s)
PHASE_NAMES=() PHASE_SECS=()
PHASE_T0=$START

step() { echo; echo "== $*"; }
# phase NAME: closes the running phase (its wall time is recorded and
# printed) and starts NAME; phase "" only closes
PHASE_CUR=""
phase() {
  local now
  now=$(date +%s)
  if [ -n "$PHASE_CUR" ]; then
    PHASE_NAMES+=("$PHASE_CUR")
    PHASE_SECS+=($((now - PHASE_T0)))
    echo "   ($PHASE_CUR: $((now - PHASE_T0)) s; $((now - START)) s so far)"
  fi
  PHASE_CUR=$1
  PHASE_T0=$now
}
left() { echo $((BUDGET - ($(date +%s) - START))); }

phase "deps and GPU"

step "unpacking libyaml and jansson from .deps/*.deb into $SYSROOT"
shopt -s nullglob
debs=("$DEPS"/*.deb)
if [ ${#debs[@]} -eq 0 ]; then
  if pkg-config --exists yaml-0.1 jansson 2> /dev/null; then
    echo "   no .deps/*.deb, but the system has yaml-0.1 and jansson: using those"
  else
    echo "error: no .deps/*.deb and no system libyaml/jansson: run scripts/fetch-gpu-deps.sh on a machine" >&2
    echo "       with network access and carry .deps/ to this one" >&2
    exit 1
  fi
else
  for d in "${debs[@]}"; do echo "   dpkg -x $(basename "$d")"; done
  . "$ROOT_DIR/scripts/gpu-sysroot.sh"
  smelt_gpu_sysroot "$SYSROOT" "${debs[@]}"
  echo "   PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
  echo "   LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "   yaml-0.1: $(pkg-config --modversion yaml-0.1)  jansson: $(pkg-config --modversion jansson)"
fi

step "the GPU and CUDA"
EXPECT_GPU=0
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv || nvidia-smi -L || true
  if nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then EXPECT_GPU=1; fi
else
  echo "   nvidia-smi not found"
fi
# on a machine with a GPU, a GPU test that skips is a failure
echo "   GPU expected: $([ $EXPECT_GPU = 1 ] && echo yes || echo no)"
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
echo "   CUDA_HOME=${CUDA_HOME:-unset}"
ldconfig -p 2> /dev/null | grep -E 'libcuda\.so\.1|libnvrtc\.so' | sed 's/^/   /' || true
if [ -n "${CUDA_HOME:-}" ] && ! ldconfig -p 2> /dev/null | grep -q 'libnvrtc\.so'; then
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  echo "   NVRTC not on the loader path: added $CUDA_HOME/lib64 to LD_LIBRARY_PATH"
fi
# a cache of NVRTC results inside the build tree: no stale entries from elsewhere
export SMELT_CACHE_DIR="$ROOT_DIR/$BUILD/nvrtc-cache"

# torch.compile's caches, kept in the build tree: a second run on a warm
# machine skips inductor's and Triton's compiles
export TORCHINDUCTOR_CACHE_DIR="$ROOT_DIR/$BUILD/torchinductor-cache"
export TRITON_CACHE_DIR="$ROOT_DIR/$BUILD/triton-cache"

step "example weights (examples/gen_weights.py; the file is not in git)"
python3 examples/gen_weights.py || echo "   (could not generate: tiny_llama will be skipped)"

phase "configure and build"
step "configure: cmake -S . -B $BUILD -DSMELT_LLVM=OFF"
mkdir -p "$BUILD"
# the ONNX reader that fetch-gpu-deps.sh generated (no protoc-c here)
ONNX_PB=()
[ -f .deps/onnx_pb/onnx.pb-c.c ] && ONNX_PB=(-DSMELT_ONNX_PB_DIR="$(pwd)/.deps/onnx_pb")
cmake -S . -B "$BUILD" -DSMELT_LLVM=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "${ONNX_PB[@]}" > "$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log"
  echo "error: configure failed" >&2
  exit 1
}
tail -n 3 "$BUILD/configure.log"

step "build (the smelt binary, the GPU tests, test_cuda_codegen)"
JOBS=$(nproc)
[ "$JOBS" -gt 16 ] && JOBS=16
BUILD_NOTE="GPU targets built"
TARGETS=(smelt test_cuda_codegen run_bundle smelt_runtime_shared)
for src in tests/gpu/test_*.c; do TARGETS+=("gpu_$(basename "$src" .c)"); done
echo "   targets: ${TARGETS[*]}"
if ! cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]}" > "$BUILD/build.log" 2>&1; then
  echo "   building them together failed (last lines below); building each on its own"
  tail -n 25 "$BUILD/build.log"
  BUILD_NOTE="some GPU targets FAILED to build"
  for t in "${TARGETS[@]}"; do
    cmake --build "$BUILD" -j"$JOBS" --target "$t" >> "$BUILD/build-each.log" 2>&1 || echo "   $t: FAILED to build"
  done
fi
echo "   $BUILD_NOTE ($(($(date +%s) - START)) s so far)"

phase "GPU tests"
step "tests: ctest -L gpu, and the CUDA code generation unit test"
mkdir -p "$BUILD/logs"
NAMES=() STATUS=() SECS=() NOTES=()
run_test() { # name binary
  local name=$1 bin=$2 t0 t1 rc note log
  log="$BUILD/logs/$(echo "$name" | tr '/' '_').log"
  if [ ! -x "$bin" ]; then
    NAMES+=("$name"); STATUS+=("NOT BUILT"); SECS+=("-"); NOTES+=("")
    return
  fi
  echo "-- $name"
  t0=$(date +%s.%N)
  set +e
  timeout "$TIMEOUT" "$bin" > "$log" 2>&1
  rc=$?
  set -e
  t1=$(date +%s.%N)
  tail -n 15 "$log" | sed 's/^/   /'
  note=$(grep -E '^(SKIP|device|emulated|[0-9]+ (values|model|examples))' "$log" | tail -n 1 | cut -c1-90 || true)
  NAMES+=("$name")
  # a whole test that skipped exits 77 (ctest's SKIP_RETURN_CODE); rc 0 with
  # "SKIP: no CUDA" is how tests said it before
  if [ $rc -eq 77 ] || { [ $rc -eq 0 ] && grep -q '^SKIP: no CUDA' "$log"; }; then
    if [ $EXPECT_GPU = 1 ]; then STATUS+=("SKIPPED!"); else STATUS+=("SKIPPED"); fi
  elif [ $rc -eq 0 ]; then STATUS+=("passed")
  elif [ $rc -eq 124 ]; then STATUS+=("TIMEOUT")
  else STATUS+=("FAILED($rc)"); fi
  SECS+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')")
  NOTES+=("$note")
}
# the label is what CI and people use; list what it selects, then run each
# test binary itself so that its summary line lands in the table
ctest --test-dir "$BUILD" -L gpu -N | sed 's/^/   /'
if [ "${SMELT_GPU_TESTS:-1}" != 0 ]; then
  for src in tests/gpu/test_*.c; do
    name=$(basename "$src" .c)
    if [ -n "${SMELT_GPU_TESTS_ONLY:-}" ] && [[ ",$SMELT_GPU_TESTS_ONLY," != *",$name,"* ]]; then
      echo "   $name: not in SMELT_GPU_TESTS_ONLY"
      continue
    fi
    run_test "gpu/$name" "$BUILD/gpu_$name"
  done
  # the CPU emulation and NVRTC compiles it adds also run in CI
  if [ "${SMELT_GPU_CODEGEN_TEST:-1}" != 0 ]; then run_test "unit/test_cuda_codegen" "$BUILD/test_cuda_codegen"; fi
  # CUDA bundles through the runtime library alone: every example compiled
  # for --target cuda, run by tests/install/consumer/run_bundle.c (linked
  # against libsmelt_runtime.so only) and by `smelt run`, outputs compared
  printf '#!/bin/sh\nexec python3 "%s/tests/install/test_runtime_alone.py" --smelt "%s/%s/smelt" --device cuda\n' \
    "$ROOT_DIR" "$ROOT_DIR" "$BUILD" > "$BUILD/runtime_alone_cuda.sh"
  chmod +x "$BUILD/runtime_alone_cuda.sh"
  run_test "install/runtime_alone_cuda" "$BUILD/runtime_alone_cuda.sh"
  # ranged dims on the GPU: one bundle for every length, against exact compiles
  printf '#!/bin/sh\ncd "%s" && exec python3 tests/cpu/test_ranged.py --smelt "%s/%s/smelt" --device cuda\n' \
    "$ROOT_DIR" "$ROOT_DIR" "$BUILD" > "$BUILD/ranged_cuda.sh"
  chmod +x "$BUILD/ranged_cuda.sh"
  run_test "cpu/test_ranged --device cuda" "$BUILD/ranged_cuda.sh"
else
  echo "   SMELT_GPU_TESTS=0: tests skipped (benchmark only)"
fi

# ---- the benchmark: weights, tuning, bundles, SASS, then bench.py ----
ONLY="${SMELT_GPU_BENCH_ONLY:-w1,w2_m1,w2_m2048,w3_prefill,w3_decode,w4_decode,w4_prefill}"
TUNE_TABLE="${SMELT_GPU_TUNE_TABLE:-${OUT:-$ROOT_DIR/$BUILD}/cuda.table}"
PREP="$ROOT_DIR/$BUILD/bench"
RESERVE="${SMELT_GPU_BENCH_RESERVE:-300}"
BENCH_STATUS="" TUNE_STATUS="" COMPILE_STATUS="" SASS_STATUS=""
if [ "${SMELT_GPU_BENCH:-1}" != 0 ] && [ -x "$BUILD/smelt" ]; then
  phase "bench weights"
  step "benchmark weights and models: bench/gpu/bench.py --prepare $PREP"
  rm -rf "$PREP"
  if ! python3 bench/gpu/bench.py --prepare "$PREP" > "$BUILD/logs/prepare.log" 2>&1; then
    echo "   FAILED: the W2/W4 models will fail below"
  fi
  tail -n 3 "$BUILD/logs/prepare.log" | sed 's/^/   /'

  # the tuner: one model at a time, each a share of what is left of the
  # tuning budget (at most 90 s); timeout stops one that overruns (the
  # budget is checked before each shape only), and the table keeps what
  # was measured
  phase "smelt tune"
  TUNE_MODELS=()
  for m in w2_m1 w2_m2048 w3_prefill w3_decode w4_decode w4_prefill; do
    case ",${SMELT_GPU_TUNE_ONLY:-$ONLY}," in *",$m,"*) TUNE_MODELS+=("$m") ;; esac
  done
  TUNE_BUDGET="${SMELT_GPU_TUNE_BUDGET:-150}"
  if [ "$TUNE_BUDGET" -gt $(($(left) - RESERVE)) ]; then TUNE_BUDGET=$(($(left) - RESERVE)); fi
  step "smelt tune -> $TUNE_TABLE (budget ${TUNE_BUDGET} s over ${#TUNE_MODELS[@]} models)"
  if ! "$BUILD/smelt" tune --help > /dev/null 2>&1; then
    TUNE_STATUS="SKIPPED (this smelt has no tune command)"
  elif [ $EXPECT_GPU = 0 ]; then
    TUNE_STATUS="SKIPPED (no GPU)"
  elif [ "$TUNE_BUDGET" -lt 20 ] || [ ${#TUNE_MODELS[@]} = 0 ]; then
    TUNE_STATUS="SKIPPED (no time left: budget ${TUNE_BUDGET} s)"
  else
    mkdir -p "$(dirname "$TUNE_TABLE")"
    tune_t0=$(date +%s) tune_fail=0 n_left=${#TUNE_MODELS[@]}
    for m in "${TUNE_MODELS[@]}"; do
      spent=$(($(date +%s) - tune_t0))
      share=$(((TUNE_BUDGET - spent) / n_left))
      if [ $share -gt 90 ]; then share=90; fi
      n_left=$((n_left - 1))
      if [ $share -lt 5 ]; then
        echo "-- $m: no tuning time left"
        continue
      fi
      echo "-- smelt tune $m.yaml --budget $share"
      set +e
      timeout $((share + 60)) "$BUILD/smelt" tune "$PREP/$m.yaml" --target cuda -o "$TUNE_TABLE" --budget "$share" \
        > "$BUILD/logs/tune_$m.log" 2>&1
      rc=$?
      set -e
      { grep -E 'REJECTED|budget|shape|error' "$BUILD/logs/tune_$m.log" || true; } | tail -n 8 | sed 's/^/   /'
      if [ $rc = 124 ]; then
        echo "   $m: stopped by timeout after $((share + 60)) s (the table keeps what was measured)"
      elif [ $rc -ne 0 ]; then
        echo "   $m: exit $rc (log: $BUILD/logs/tune_$m.log)"
        tail -n 5 "$BUILD/logs/tune_$m.log" | sed 's/^/   /'
        tune_fail=1
      fi
    done
    if [ -f "$TUNE_TABLE" ]; then
      echo "   table: $(grep -cv '^\s*\(#\|$\)' "$TUNE_TABLE" || true) rows in $TUNE_TABLE"
      { grep -v '^\s*\(#\|$\)' "$TUNE_TABLE" || true; } | cut -c1-160 | sed 's/^/   /'
    fi
    TUNE_STATUS=$([ $tune_fail = 0 ] && echo "ran" || echo "FAILED (see logs/tune_*.log)")
  fi

  # the bundles the benchmark runs, with the table when there is one
  # (bench.py drops --tune-table when smelt compile lacks the flag)
  phase "compile benches"
  step "bench bundles: bench.py --compile-only --tune-table $TUNE_TABLE"
  set +e
  timeout 300 python3 bench/gpu/bench.py --smelt "$BUILD/smelt" --only "$ONLY" --compile-only --keep "$PREP" \
    --tune-table "$TUNE_TABLE" 2>&1 | tee "$BUILD/logs/compile.log"
  rc=${PIPESTATUS[0]}
  set -e
  COMPILE_STATUS=$([ "$rc" = 0 ] && echo "ran" || echo "FAILED($rc)")

  phase "SASS summary"
  step "SASS of the matmul and attention kernels (cuobjdump)"
  if [ -n "${CUDA_HOME:-}" ] && [ -d "$CUDA_HOME/bin" ]; then export PATH="$PATH:$CUDA_HOME/bin"; fi
  if ! command -v cuobjdump > /dev/null; then
    SASS_STATUS="SKIPPED (no cuobjdump)"
  else
    dirs=()
    mkdir -p "$PREP/cubins"
    for bundle in "$PREP"/*.smelt; do
      [ -f "$bundle" ] || continue
      d="$PREP/cubins/$(basename "$bundle" .smelt)"
      rm -rf "$d"
      if "$BUILD/smelt" inspect "$bundle" --dump-cubins "$d" > /dev/null 2>&1; then dirs+=("$d")
      else echo "   $(basename "$bundle"): smelt inspect --dump-cubins failed"; fi
    done
    if [ ${#dirs[@]} = 0 ]; then
      SASS_STATUS="SKIPPED (no bundles, or none could be dumped)"
    else
      set +e
      python3 bench/gpu/sass.py "${dirs[@]}" 2>&1 | tee "$BUILD/logs/sass.log"
      rc=${PIPESTATUS[0]}
      set -e
      SASS_STATUS=$([ "$rc" = 0 ] && echo "ran" || echo "FAILED($rc)")
    fi
  fi

  # the benchmark, in the time left: it prints a line per workload as it
  # goes, so a timeout still leaves the finished ones in the log
  phase "benchmark"
  LEFT=$(($(left) - 10))
  step "benchmark: bench/gpu/bench.py (${LEFT} s left)"
  if [ $EXPECT_GPU = 0 ]; then
    BENCH_STATUS="SKIPPED (no GPU)"
  elif [ "$LEFT" -lt 45 ]; then
    BENCH_STATUS="SKIPPED (no time left)"
  else
    set +e
    # --deadline: bench.py drops torch.compile, then whole workloads, when
    # time runs short, so that its summary table still prints
    timeout "$LEFT" python3 bench/gpu/bench.py --smelt "$BUILD/smelt" --only "$ONLY" --keep "$PREP" --reuse-bundles \
      --tune-table "$TUNE_TABLE" --deadline $((LEFT - 15)) 2>&1 | tee "$BUILD/logs/bench.log"
    BENCH_RC=${PIPESTATUS[0]}
    set -e
    case $BENCH_RC in
      0) BENCH_STATUS="ran" ;;
      124) BENCH_STATUS="TIMEOUT after ${LEFT} s (partial results above)" ;;
      *) BENCH_STATUS="FAILED($BENCH_RC)" ;;
    esac
  fi
  # what the lead reads back: the logs of the benchmark part
  if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
    cp "$BUILD"/logs/{compile,sass,bench}.log "$BUILD"/logs/tune_*.log "$OUT"/ 2> /dev/null || true
  fi
fi
phase ""

step "summary ($BUILD_NOTE; $(($(date +%s) - START)) s in all; logs in $BUILD/logs/)"
printf '%-28s %-11s %7s  %s\n' "test" "status" "seconds" "note"
printf '%-28s %-11s %7s  %s\n' "----------------------------" "-----------" "-------" "----"
fail=0
for i in "${!NAMES[@]}"; do
  printf '%-28s %-11s %7s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${NOTES[$i]}"
  case "${STATUS[$i]}" in passed|SKIPPED) ;; *) fail=1 ;; esac
done
# the benchmark's steps: a failed compile or benchmark fails the check; a
# failed tune or SASS summary is reported but does not (they measure)
bench_line() { # name status
  [ -n "$2" ] && printf '%-28s %-11s %7s  %s\n' "$1" "$(echo "$2" | cut -d' ' -f1)" "-" "$2"
  return 0
}
bench_line "smelt tune" "$TUNE_STATUS"
bench_line "bench bundles (compile)" "$COMPILE_STATUS"
bench_line "SASS summary" "$SASS_STATUS"
bench_line "bench/gpu/bench.py" "$BENCH_STATUS"
case "$COMPILE_STATUS" in FAILED*) fail=1 ;; esac
case "$BENCH_STATUS" in FAILED*) fail=1 ;; esac
echo
echo "phases (wall seconds):"
for i in "${!PHASE_NAMES[@]}"; do printf '   %-22s %5s\n' "${PHASE_NAMES[$i]}" "${PHASE_SECS[$i]}"; done
printf '   %-22s %5s\n' "total" "$(($(date +%s) - START))"
if [ $fail -ne 0 ]; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: all passed"
