#!/usr/bin/env bash
# Installs what a fresh Debian/Ubuntu machine lacks, then configures and
# builds smelt into build/ and generates the example weights.
# Safe to run again: it installs and rebuilds only what is missing or stale.
#   SMELT_BUILD_DIR   build directory (default build)
#   SMELT_CMAKE_ARGS  extra arguments for cmake
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
have() { dpkg -s "$1" >/dev/null 2>&1; }
for p in build-essential cmake pkg-config libyaml-dev libjansson-dev protobuf-c-compiler libprotobuf-c-dev python3 graphviz; do
  have "$p" || need_pkgs+=("$p")
done
# LLVM development files (the CPU backend's code generator); any of 14..19 will do.
if ! ls /usr/lib/llvm-*/bin/llvm-config >/dev/null 2>&1; then need_pkgs+=(llvm-dev); fi
# clang builds the libFuzzer targets (tests/fuzz, -DSMELT_FUZZ=ON)
command -v clang >/dev/null 2>&1 || need_pkgs+=(clang)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "setup: installing ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
# libFuzzer's runtime comes with clang's compiler-rt, which Debian and Ubuntu
# package apart (libclang-rt-N-dev, only a recommendation of clang): install
# the one of this clang's version when a fuzzer cannot be linked.
fuzz_links() {
  local d; d=$(mktemp -d)
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$d/f.c"
  clang -fsanitize=fuzzer,address,undefined "$d/f.c" -o "$d/f" >/dev/null 2>&1; local rc=$?
  rm -rf "$d"
  return $rc
}
if command -v clang >/dev/null 2>&1 && ! fuzz_links; then
  clang_major=$(clang -dumpversion | cut -d. -f1)
  echo "setup: installing libclang-rt-$clang_major-dev (libFuzzer)"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "libclang-rt-$clang_major-dev" >/dev/null
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import numpy" >/dev/null 2>&1; then
  echo "setup: installing numpy"
  "$PY" -m pip install -q numpy 2>/dev/null || "$PY" -m pip install -q --break-system-packages numpy
fi

BUILD=${SMELT_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -DPython3_EXECUTABLE="$(command -v "$PY")" ${SMELT_CMAKE_ARGS:-} >/dev/null
# show warnings and errors, not the progress lines; a failed build stops here
if ! cmake --build "$BUILD" -j"$(nproc)" > "$BUILD/build.log" 2>&1; then
  grep -Ev '^\[ *[0-9]+%\]' "$BUILD/build.log" >&2
  echo "setup: build failed (log: $BUILD/build.log)" >&2
  exit 1
fi
grep -Ev '^\[ *[0-9]+%\]' "$BUILD/build.log" || true

"$PY" examples/gen_weights.py
