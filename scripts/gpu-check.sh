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
# Steps: unpack deps, show the GPU, configure, build what the GPU needs
# (the smelt binary, the GPU tests and the CUDA code-generation unit test;
# the CPU-only unit tests are skipped: this machine has no LLVM and the
# whole call must fit in 10 minutes), run the tests labelled "gpu" and the
# CUDA code-generation unit test, print a summary table, then run the GPU
# benchmark (bench/gpu/bench.py: smelt against PyTorch eager and
# torch.compile) in the time that is left and print its table.  Exit status
# 0 when every test passed and smelt ran every benchmark workload.
#
# Environment: SMELT_GPU_BUILD_DIR (default build-gpu), SMELT_GPU_TIMEOUT
# (seconds per test, default 300), SMELT_GPU_BUDGET (seconds for the whole
# script, default 560: the benchmark gets what the tests left),
# SMELT_GPU_BENCH=0 skips the benchmark, SMELT_GPU_BENCH_ONLY picks its
# workloads (default w1,w2_m1,w2_m2048,mlp,cnn,gpt2_block,tiny_llama).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR="$(pwd)"
BUILD="${SMELT_GPU_BUILD_DIR:-build-gpu}"
TIMEOUT="${SMELT_GPU_TIMEOUT:-300}"
BUDGET="${SMELT_GPU_BUDGET:-560}"
DEPS="$ROOT_DIR/.deps"
SYSROOT="$DEPS/root"
START=$(date +%s)

step() { echo; echo "== $*"; }

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
  rm -rf "$SYSROOT"
  mkdir -p "$SYSROOT"
  for d in "${debs[@]}"; do
    echo "   dpkg -x $(basename "$d")"
    dpkg -x "$d" "$SYSROOT"
  done
  # the .pc files say prefix=/usr: point them at the unpacked tree
  for pc in "$SYSROOT"/usr/lib/*/pkgconfig/*.pc "$SYSROOT"/usr/lib/pkgconfig/*.pc; do
    sed -i "s|^prefix=.*|prefix=$SYSROOT/usr|" "$pc"
  done
  LIBDIRS=$(find "$SYSROOT/usr/lib" -maxdepth 2 -name 'lib*.so*' -printf '%h\n' | sort -u | paste -sd:)
  PCDIRS=$(find "$SYSROOT/usr/lib" -maxdepth 3 -type d -name pkgconfig | paste -sd:)
  export PKG_CONFIG_PATH="$PCDIRS${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CMAKE_PREFIX_PATH="$SYSROOT/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
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

step "example weights (examples/gen_weights.py; the file is not in git)"
python3 examples/gen_weights.py || echo "   (could not generate: tiny_llama will be skipped)"

step "configure: cmake -S . -B $BUILD -DSMELT_LLVM=OFF"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DSMELT_LLVM=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log"
  echo "error: configure failed" >&2
  exit 1
}
tail -n 3 "$BUILD/configure.log"

step "build (the smelt binary, the GPU tests, test_cuda_codegen)"
JOBS=$(nproc)
[ "$JOBS" -gt 16 ] && JOBS=16
BUILD_NOTE="GPU targets built"
TARGETS=(smelt test_cuda_codegen)
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
  if [ $rc -eq 0 ] && grep -q '^SKIP: no CUDA' "$log"; then
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
for src in tests/gpu/test_*.c; do
  name=$(basename "$src" .c)
  run_test "gpu/$name" "$BUILD/gpu_$name"
done
run_test "unit/test_cuda_codegen" "$BUILD/test_cuda_codegen"

# the benchmark, in the time left: it prints a line per workload as it
# goes, so a timeout still leaves the finished ones in the log
BENCH_STATUS=""
if [ "${SMELT_GPU_BENCH:-1}" != 0 ] && [ -x "$BUILD/smelt" ]; then
  LEFT=$((BUDGET - ($(date +%s) - START) - 10))
  step "benchmark: bench/gpu/bench.py (${LEFT} s left)"
  if [ $EXPECT_GPU = 0 ]; then
    BENCH_STATUS="SKIPPED (no GPU)"
  elif [ "$LEFT" -lt 45 ]; then
    BENCH_STATUS="SKIPPED (no time left)"
  else
    set +e
    timeout "$LEFT" python3 bench/gpu/bench.py --smelt "$BUILD/smelt" \
      --only "${SMELT_GPU_BENCH_ONLY:-w1,w2_m1,w2_m2048,mlp,cnn,gpt2_block,tiny_llama}" 2>&1 | tee "$BUILD/logs/bench.log"
    BENCH_RC=${PIPESTATUS[0]}
    set -e
    case $BENCH_RC in
      0) BENCH_STATUS="ran" ;;
      124) BENCH_STATUS="TIMEOUT after ${LEFT} s (partial results above)" ;;
      *) BENCH_STATUS="FAILED($BENCH_RC)" ;;
    esac
  fi
fi

step "summary ($BUILD_NOTE; $(($(date +%s) - START)) s in all; logs in $BUILD/logs/)"
printf '%-28s %-11s %7s  %s\n' "test" "status" "seconds" "note"
printf '%-28s %-11s %7s  %s\n' "----------------------------" "-----------" "-------" "----"
fail=0
for i in "${!NAMES[@]}"; do
  printf '%-28s %-11s %7s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${NOTES[$i]}"
  case "${STATUS[$i]}" in passed|SKIPPED) ;; *) fail=1 ;; esac
done
if [ -n "$BENCH_STATUS" ]; then
  printf '%-28s %-11s %7s  %s\n' "bench/gpu/bench.py" "$(echo "$BENCH_STATUS" | cut -d' ' -f1)" "-" "$BENCH_STATUS"
  case "$BENCH_STATUS" in FAILED*) fail=1 ;; esac
fi
if [ $fail -ne 0 ]; then
  echo "gpu-check: FAILED"
  exit 1
fi
echo "gpu-check: all passed"
