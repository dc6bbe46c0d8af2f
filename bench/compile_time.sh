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
# of smelt_bundle_open (run_bundle --time-open; CUDA upload not included).
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
printf '%-10s %8s %8s %12s %9s\n' mode cold_s warm_s bundle_MB open_ms
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
  printf '%-10s %8s %8s %12.1f %9s\n' $mode "$cold" "$warm" "$(awk -v s="$size" 'BEGIN { print s / 1048576 }')" "$open"
done
