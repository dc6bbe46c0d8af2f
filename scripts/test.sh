#!/usr/bin/env bash
# Sets up (scripts/setup.sh), then runs every test: the normal build, then the
# whole suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
#   SMELT_SKIP_SANITIZE=1  only the normal build
set -euo pipefail
cd "$(dirname "$0")/.."

SMELT_CMAKE_ARGS="-DSMELT_WERROR=ON" scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"

if [ "${SMELT_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== the same tests under ASan + UBSan =="
  SMELT_BUILD_DIR=build-asan SMELT_CMAKE_ARGS="-DSMELT_SANITIZE=ON -DSMELT_WERROR=ON -DCMAKE_BUILD_TYPE=Debug" \
    scripts/setup.sh
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)"
fi
echo "all tests passed"
