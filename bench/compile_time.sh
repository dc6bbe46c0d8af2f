#!/usr/bin/env bash
# W4's compile time, bundle size and load time (issue 10's figures), on
# whatever machine this runs: the 2-core VM or the GPU machine.
#
#   bench/compile_time.sh SMELT RUN_BUNDLE [MODEL.yaml] [extra compile flags...]
#
# MODEL defaults to w4_prefill.yaml from `bench/gpu/bench.py --prepare`
# (made in $TMPDIR/w4p when missing).  For the embedded and the
# --external-weights bundle each: a cold compile (empty SMELT_CACHE_DIR: no
# NVRTC cache, no compile cache), a warm one (the same model, weights and
# options again: the compile cache), the bundle's size, and the median time
# of smelt_bundle_open (run_bundle --time-open; CUDA upload not included),
# and the time of the first smelt_session_create on cuda:0 after it
# (first_session_ms: the checks open defers -- the constants' and the
# external weights' checksums, assembling merged weights -- plus the upload
# to the GPU; on a machine without a GPU the session is refused after the
# deferred checks, so the column is those checks alone).
# Prints one table.
set -euo pipefail
SMELT=$(realpath "$1"); RUN_BUNDLE=$(realpath "$2"); shift 2
MODEL=${1:-}
[ $# -gt 0 ] && shift
TMP=${TMPDIR:-/tmp}
if [ -z "$MODEL" ]; then
  MODEL="$TMP/w4p/w4_prefill.yaml"
  [ -f "$MODEL" ] || python3 "$(dirname "$0")/gpu/bench.py" --prepare "$TMP/w4p" > /dev/null
fi
TARGET="--target cuda --arch sm_90a"
secs() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }'; }
LIB="$(dirname "$RUN_BUNDLE")/libsmelt_runtime.so"
first_session() {
  python3 - "$LIB" "$1" <<'PY' 2>/dev/null || echo -
import ctypes, sys, time
L = ctypes.CDLL(sys.argv[1]); P = ctypes.c_void_p
L.smelt_bundle_open.restype = P; L.smelt_bundle_open.argtypes = [ctypes.c_char_p, ctypes.POINTER(P)]
L.smelt_session_create.restype = P; L.smelt_session_create.argtypes = [P, ctypes.c_char_p, P, ctypes.POINTER(P)]
b, s = P(), P()
assert not L.smelt_bundle_open(sys.argv[2].encode(), ctypes.byref(b))
t0 = time.perf_counter()
L.smelt_session_create(b, b"cuda", None, ctypes.byref(s))
print(f"{1e3 * (time.perf_counter() - t0):.1f}")
PY
}
printf '%-10s %8s %8s %12s %9s %17s\n' mode cold_s warm_s bundle_MB open_ms first_session_ms
for mode in embedded external; do
  flags=()
  [ $mode = external ] && flags=(--external-weights)
  out="$TMP/w4_$mode.smelt"
  export SMELT_CACHE_DIR="$TMP/smelt-cache-$mode"
  rm -rf "$SMELT_CACHE_DIR" "$out"
  cold=$(secs "$SMELT" compile "$MODEL" $TARGET "${flags[@]}" "$@" -o "$out")
  warm=$(secs "$SMELT" compile "$MODEL" $TARGET "${flags[@]}" "$@" -o "$out")
  size=$(stat -c %s "$out")
  open=$("$RUN_BUNDLE" "$out" --time-open | awk '{print $2}')
  first=$(first_session "$out")
  printf '%-10s %8s %8s %12.1f %9s %17s\n' $mode "$cold" "$warm" "$(awk -v s="$size" 'BEGIN { print s / 1048576 }')" "$open" "$first"
done
