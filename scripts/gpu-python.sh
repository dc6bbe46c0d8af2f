#!/usr/bin/env bash
# Installs the Python package on the lent GPU machine, offline, and runs
# tests/python/test_python_cuda.py (torch CUDA tensors, zero-copy, streams).
#
# Run after scripts/gpu-check.sh has built the smelt binary (it also
# unpacks libyaml and jansson into .deps/root and writes the example
# weights); .deps/ must hold the wheels scripts/fetch-gpu-deps.sh
# downloaded (.deps/wheels: scikit-build-core, nanobind, packaging,
# pathspec, ninja).  The machine has no network: pip builds from those
# wheels alone (--no-index), with LLVM off as gpu-check.sh builds.
#
# Usage: scripts/gpu-python.sh [SMELT_BINARY]     (default build-gpu/smelt)
# Environment: PYTHON (default python3: the one with torch), SMELT_GPU_PY_BUILD
# (the package's CMake build directory, default BUILD/python-pkg next to the
# binary), SMELT_GPU_PY_SITE (where it is installed, default a fresh
# temporary directory).
# Exit status: the test's; a skip (77) on a machine with a GPU is a failure (1).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT_DIR="$(pwd)"
SMELT_BIN="${1:-build-gpu/smelt}"
PY="${PYTHON:-python3}"
START=$(date +%s)
DEPS="$ROOT_DIR/.deps"
SYSROOT="$DEPS/root"
BUILD_ROOT="$(cd "$(dirname "$SMELT_BIN")" && pwd)"
PKG_BUILD="${SMELT_GPU_PY_BUILD:-$BUILD_ROOT/python-pkg}"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/smelt-gpu-python.XXXXXX")"
SITE="${SMELT_GPU_PY_SITE:-$TMP/site}"
summary=()
elapsed() { echo "$(($(date +%s) - START)) s"; }

if [ ! -x "$SMELT_BIN" ]; then
  echo "error: no smelt binary at $SMELT_BIN (run scripts/gpu-check.sh first)" >&2
  exit 1
fi
if ! ls "$DEPS"/wheels/nanobind-*.whl "$DEPS"/wheels/scikit_build_core-*.whl > /dev/null 2>&1; then
  echo "error: no wheels in .deps/wheels: run scripts/fetch-gpu-deps.sh on a machine with network access" >&2
  exit 1
fi

echo "== libyaml and jansson (.deps/root, as gpu-check.sh unpacks them)"
. "$ROOT_DIR/scripts/gpu-sysroot.sh"
if [ -d "$SYSROOT/usr/lib" ]; then smelt_gpu_sysroot "$SYSROOT"; else smelt_gpu_sysroot "$SYSROOT" "$DEPS"/*.deb; fi
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda ]; then export CUDA_HOME=/usr/local/cuda; fi
if [ -n "${CUDA_HOME:-}" ] && ! ldconfig -p 2> /dev/null | grep -q 'libnvrtc\.so'; then
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"
  done
fi
export SMELT_CACHE_DIR="$BUILD_ROOT/nvrtc-cache"
[ -f examples/tiny_llama.safetensors ] || "$PY" examples/gen_weights.py || true

echo "== $("$PY" --version 2>&1); $("$PY" -m pip --version 2>&1 | cut -d' ' -f1-2); cmake $(cmake --version | head -n 1 | cut -d' ' -f3)"
"$PY" -c "import torch; print('   torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())" || true
# scikit-build-core asks pip for the PyPI ninja when none is on PATH and no
# generator is chosen: choose Make then (the wheel is in .deps/wheels too)
if ! command -v ninja > /dev/null && [ -z "${CMAKE_GENERATOR:-}" ]; then
  export CMAKE_GENERATOR="Unix Makefiles"
  echo "   no ninja on PATH: CMAKE_GENERATOR=\"Unix Makefiles\""
fi
JOBS=$(nproc)
[ "$JOBS" -gt 16 ] && JOBS=16
export CMAKE_BUILD_PARALLEL_LEVEL="$JOBS"
export PIP_DISABLE_PIP_VERSION_CHECK=1

echo "== pip install (offline) into $SITE, build dir $PKG_BUILD"
# The build requirements go from .deps/wheels into a directory of their own
# and the package builds without pip's isolated environment: that machine's
# cmake is PyPI's (a script importing the cmake module), which an isolated
# build environment cannot run, so scikit-build-core would ask pip for a
# cmake wheel that is not there.  --no-deps: numpy is the machine's.
set +e
BDEPS="$TMP/build-deps"
"$PY" -m pip install --no-index --find-links "$DEPS/wheels" --target "$BDEPS" scikit-build-core nanobind \
  > "$TMP/pip.log" 2>&1 &&
PYTHONPATH="$BDEPS${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pip install --no-index --no-build-isolation --no-deps \
  --target "$SITE" -Cbuild-dir="$PKG_BUILD" -Ccmake.define.SMELT_LLVM=OFF . >> "$TMP/pip.log" 2>&1
rc=$?
set -e
if [ $rc -ne 0 ]; then
  tail -n 60 "$TMP/pip.log"
  echo "gpu-python: pip install FAILED (exit $rc; log $TMP/pip.log) after $(elapsed)"
  exit 1
fi
tail -n 2 "$TMP/pip.log" | sed 's/^/   /'
summary+=("pip install: ok ($(elapsed))")

echo "== tests/python/test_python_cuda.py --site $SITE --smelt $SMELT_BIN"
set +e
"$PY" tests/python/test_python_cuda.py --site "$SITE" --smelt "$SMELT_BIN" 2>&1 | tee "$TMP/test.log"
rc=${PIPESTATUS[0]}
set -e
oks=$(grep -c '^ok ' "$TMP/test.log" || true)
fails=$(grep -c '^FAIL ' "$TMP/test.log" || true)
if [ $rc -eq 77 ] && nvidia-smi -L 2> /dev/null | grep -q '^GPU'; then
  summary+=("test_python_cuda: SKIPPED on a machine with a GPU ($(grep '^SKIP' "$TMP/test.log" | head -n 1))")
  rc=1
elif [ $rc -eq 77 ]; then
  summary+=("test_python_cuda: skipped ($(grep '^SKIP' "$TMP/test.log" | head -n 1))")
else
  summary+=("test_python_cuda: exit $rc, $oks ok, $fails FAIL ($(elapsed))")
fi
echo
echo "== gpu-python summary"
for l in "${summary[@]}"; do echo "   $l"; done
grep '^FAIL ' "$TMP/test.log" | sed 's/^/   /' || true
exit $rc
