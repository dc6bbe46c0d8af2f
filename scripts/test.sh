#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs every test: the normal build, then the
# whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
#   SMELT_SKIP_SANITIZE=1  only the normal build
#   SMELT_SKIP_FUZZ=1      no fuzz smoke (below)
#   SMELT_FUZZ_SECONDS     seconds each fuzz target runs (default 20)
# Last, the fuzz smoke: clang builds the libFuzzer targets of tests/fuzz
# into build-fuzz (ASan + UBSan + coverage) and each runs for a short fixed
# time from its committed seeds (ctest label fuzz); scripts/fuzz-long.sh is
# the long run.
# A test that skipped as a whole exits 77 and ctest reports it as skipped.
# Here only the GPU tests (label gpu) may skip: LLVM and NVRTC compilation
# must run, so any other skip fails the run, and SMELT_TEST_REQUIRE=nvrtc,llvm
# makes a test that leaves out its NVRTC or LLVM part fail instead of
# printing SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
export SMELT_TEST_REQUIRE="${SMELT_TEST_REQUIRE-nvrtc,llvm}"

# Fails when ctest's log ($1) lists a skipped test (or one not run) outside
# the gpu label: ctest ends with "The following tests did not run:" and one
# line "  N - NAME (Skipped)" per test; the gpu-labelled names come from
# ctest -N -L gpu in build directory $2.
no_skips_outside_gpu() {
  local gpu bad="" line name
  gpu=$(ctest --test-dir "$2" -N -L gpu | sed -nE 's/^\s*Test\s+#[0-9]+: (\S+).*/\1/p')
  while IFS= read -r line; do
    name=$(sed -E 's/^\s+[0-9]+ - (\S+).*/\1/' <<<"$line")
    grep -qxF "$name" <<<"$gpu" || bad+="$line"$'\n'
  done < <(sed -n '/^The following tests did not run:/,$p' "$1" | grep -E '^\s+[0-9]+ - ' || true)
  if [ -n "$bad" ]; then
    echo "error: these tests skipped, and only GPU tests (label gpu) may skip here:"
    printf '%s' "$bad"
    return 1
  fi
}

SMELT_CMAKE_ARGS="-DSMELT_WERROR=ON" scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)" 2>&1 | tee build/ctest.log
no_skips_outside_gpu build/ctest.log build

if [ "${SMELT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== the same tests under ASan + UBSan =="
  SMELT_BUILD_DIR=build-asan SMELT_CMAKE_ARGS="-DSMELT_SANITIZE=ON -DSMELT_WERROR=ON -DCMAKE_BUILD_TYPE=Debug" \
    scripts/setup.sh
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" 2>&1 | tee build-asan/ctest.log
  no_skips_outside_gpu build-asan/ctest.log build-asan
fi
if [ "${SMELT_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== fuzz smoke: each libFuzzer target for ${SMELT_FUZZ_SECONDS:-20} s =="
  CC=clang cmake -S . -B build-fuzz -DSMELT_FUZZ=ON -DSMELT_LLVM=OFF -DSMELT_WERROR=ON \
    -DSMELT_FUZZ_SECONDS="${SMELT_FUZZ_SECONDS:-20}" -DPython3_EXECUTABLE="$(command -v python3)" >/dev/null
  if ! cmake --build build-fuzz -j"$(nproc)" --target smelt_fuzzers > build-fuzz/build.log 2>&1; then
    grep -Ev '^\[ *[0-9]+%\]' build-fuzz/build.log >&2
    echo "error: the fuzz targets did not build (log: build-fuzz/build.log)" >&2
    exit 1
  fi
  ctest --test-dir build-fuzz -L fuzz --output-on-failure -j"$(nproc)" 2>&1 | tee build-fuzz/ctest.log
  no_skips_outside_gpu build-fuzz/ctest.log build-fuzz
fi
echo "all tests passed"
