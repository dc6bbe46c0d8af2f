#!/usr/bin/env bash
# Downloads the Debian packages of libyaml, jansson and protobuf-c (headers,
# pkg-config files and shared libraries) into .deps/, generates the ONNX
# reader with protoc-c into .deps/onnx_pb, on a machine that can reach a
# package mirror, so that scripts/gpu-check.sh can build smelt on the lent
# GPU machine, which has neither library and no network.  .deps/ is
# git-ignored: hand it to the GPU machine along with the tree (the device
# tool's `carry: [".deps"]`).
#
# Usage: scripts/fetch-gpu-deps.sh          (from anywhere in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(libyaml-dev libyaml-0-2 libjansson-dev libjansson4 libprotobuf-c-dev libprotobuf-c1)
mkdir -p .deps
cd .deps
rm -f ./*.deb
echo "== apt-get download ${PACKAGES[*]} -> $(pwd)"
# apt drops privileges to _apt for downloads; a directory _apt cannot write
# to only produces a warning, so the check below is what decides success
apt-get download "${PACKAGES[@]}"
missing=0
for p in "${PACKAGES[@]}"; do
  if ls "${p}"_*.deb > /dev/null 2>&1; then
    echo "   ok  $(ls "${p}"_*.deb)"
  else
    echo "   MISSING ${p}" >&2
    missing=1
  fi
done
if [ "$missing" != 0 ]; then
  echo "fetch-gpu-deps: some packages were not downloaded" >&2
  exit 1
fi

# The ONNX reader generated here by protoc-c (the GPU machine has the
# protobuf-c library from the debs above but no protoc-c, whose C++
# protobuf dependencies are large): cmake -DSMELT_ONNX_PB_DIR=.deps/onnx_pb
# uses it when the schema's SHA-256 matches (cmake/onnx.cmake).
rm -rf onnx_pb && mkdir onnx_pb
protoc-c --c_out=onnx_pb -I../third_party/onnx ../third_party/onnx/onnx.proto
sha256sum ../third_party/onnx/onnx.proto | cut -d' ' -f1 > onnx_pb/onnx.proto.sha256
echo "   ok  onnx_pb/onnx.pb-c.c (protoc-c $(protoc-c --version 2>&1 | head -n 1))"

# The Python package's build requirements (pyproject.toml [build-system]:
# scikit-build-core, nanobind) and theirs (packaging, pathspec), as wheels
# in .deps/wheels, for scripts/gpu-python.sh's offline `pip install
# --no-index --find-links .deps/wheels`.  All pure Python (py3-none-any),
# so one set serves the GPU machine's Python 3.12 and this one's.  CMake
# is not among them: scikit-build-core asks for the PyPI cmake only when
# the system has none >= 3.20 (the GPU machine has CMake 4).  Ninja it asks
# for when none is on PATH and no other generator is set: gpu-python.sh
# sets CMAKE_GENERATOR="Unix Makefiles" then, and the ninja wheel for
# manylinux x86_64 (~0.2 MB) is here as well in case it is run otherwise.
# Python < 3.11 would also need tomli, exceptiongroup, typing-extensions
# (fetched too: small, and they let this script's check run on such a
# Python).
WHEELS=(scikit-build-core nanobind packaging pathspec)
OLD_PY_WHEELS=(tomli exceptiongroup typing-extensions)
cd ..
mkdir -p .deps/wheels
rm -f .deps/wheels/*.whl
echo "== pip download ${WHEELS[*]} -> .deps/wheels"
# the versions pyproject.toml asks for (>=), the newest that exist
python3 -m pip download -q --no-deps --only-binary=:all: -d .deps/wheels \
  "scikit-build-core>=0.10" "nanobind>=2.0" "packaging>=23.2" "pathspec>=0.12.0" "${OLD_PY_WHEELS[@]}"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 -d .deps/wheels ninja
for w in "${WHEELS[@]}" ninja; do
  f=$(ls .deps/wheels/"$(echo "$w" | tr - _)"-*.whl 2> /dev/null | head -n 1 || true)
  if [ -n "$f" ]; then
    echo "   ok  $f"
  else
    echo "   MISSING wheel $w" >&2
    missing=1
  fi
done
if [ "$missing" != 0 ]; then
  echo "fetch-gpu-deps: some wheels were not downloaded" >&2
  exit 1
fi
echo "   .deps is $(du -sh .deps | cut -f1) in all (the device tool carries at most 64 MiB)"
echo "== done: run scripts/gpu-check.sh (then scripts/gpu-python.sh) on the GPU machine with .deps/ carried along"
