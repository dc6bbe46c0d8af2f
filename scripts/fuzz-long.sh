#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz for a long time, then minimises
# every crash they found and prints a table of what ran.
#
#   scripts/fuzz-long.sh [-t SECONDS] [-j JOBS] [-f WORKERS] [TARGET...]
#     -t SECONDS  per target, wall time (default 3600)
#     -j JOBS     targets fuzzed at once (default: the number of CPUs)
#     -f WORKERS  libFuzzer fork-mode workers per target (default 1): a
#                 target gets WORKERS x SECONDS of CPU time
#     TARGET      yaml npy safetensors elf bundle bundle_crc onnx (default all)
#   SMELT_FUZZ_BUILD_DIR  the fuzz build (default build-fuzz: clang,
#                         -DSMELT_FUZZ=ON, configured and built here)
#   SMELT_FUZZ_PREBUILT=1 use the fuzzers already in the build directory
#                         (another machine's build, carried over), no cmake
#   SMELT_FUZZ_TIMEOUT    seconds one input may take (default 10)
#
# Each target runs in libFuzzer's fork mode, which carries on after a crash,
# a timeout or running out of memory, from its committed seeds, its
# regression inputs and the corpus earlier runs grew (BUILD/fuzz-work/corpus,
# the same one the ctest smoke uses).  Afterwards every input that failed is
# minimised (-minimize_crash) into BUILD/fuzz-work/minimised/, and the
# corpus is merged down to the inputs that add coverage.  A minimised crash
# goes, once fixed, to tests/fuzz/regress/TARGET/ with a .expect file
# (tests/fuzz/replay.c).  Exits 1 when anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=3600
jobs=$(nproc)
workers=1
while getopts "t:j:f:" opt; do
  case $opt in
    t) secs=$OPTARG ;;
    j) jobs=$OPTARG ;;
    f) workers=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(yaml npy safetensors elf bundle bundle_crc onnx)

build=${SMELT_FUZZ_BUILD_DIR:-build-fuzz}
if [ "${SMELT_FUZZ_PREBUILT:-0}" != 1 ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang cmake -S . -B "$build" -DSMELT_FUZZ=ON -DSMELT_LLVM=OFF >/dev/null
  fi
  cmake --build "$build" -j"$(nproc)" --target smelt_fuzzers >/dev/null
fi

work=$build/fuzz-work
mkdir -p "$work/logs" "$work/minimised"
seeds_of() { [ "$1" = bundle_crc ] && echo bundle || echo "$1"; }

fuzz_one() {
  local t=$1 s; s=$(seeds_of "$t")
  local dir="$work/corpus/$t" crashes="$work/long-artifacts/$t"
  rm -rf "$crashes"
  mkdir -p "$dir" "$crashes"
  local extra=(); [ -d "tests/fuzz/regress/$t" ] && extra=("tests/fuzz/regress/$t")
  local dict=(); [ -f "tests/fuzz/dict/$s.dict" ] && dict=(-dict="tests/fuzz/dict/$s.dict")
  "$build/tests/fuzz/fuzz_$t" -fork="$workers" -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
    -max_total_time="$secs" -timeout="${SMELT_FUZZ_TIMEOUT:-10}" -rss_limit_mb=2048 "${dict[@]}" \
    -artifact_prefix="$crashes/" "$dir" "tests/fuzz/corpus/$s" "${extra[@]}" > "$work/logs/$t.log" 2>&1 || true
}
export -f fuzz_one seeds_of
export build work secs workers

echo "fuzz-long: ${targets[*]}, ${secs} s each with $workers workers, $jobs at once; logs in $work/logs"
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'fuzz_one {}'

status=0
printf '%-12s %8s %10s %14s %10s %s\n' target seconds cpu_s executions cov failed
for t in "${targets[@]}"; do
  # fork mode's progress lines: "#EXECS: cov: C ... oom/timeout/crash: O/T/C time: Ss ..."
  last=$(grep -E '^#[0-9]+: cov:' "$work/logs/$t.log" | tail -1 || true)
  execs=$(sed -E 's/^#([0-9]+):.*/\1/' <<<"$last")
  cov=$(sed -E 's/.* cov: ([0-9]+).*/\1/' <<<"$last")
  took=$(sed -E 's/.* time: ([0-9]+)s.*/\1/' <<<"$last")
  found=()
  for a in "$work/long-artifacts/$t"/*; do
    [ -f "$a" ] || continue
    found+=("$a")
    out="$work/minimised/$t-$(basename "$a")"
    "$build/tests/fuzz/fuzz_$t" -minimize_crash=1 -max_total_time=120 -runs=200000 \
      -exact_artifact_path="$out" "$a" > "$work/logs/$t-minimise.log" 2>&1 || true
    [ -f "$out" ] || cp "$a" "$out" # timeouts and leaks do not minimise: keep the input
  done
  printf '%-12s %8s %10s %14s %10s %s\n' "$t" "${took:-?}" "$(( ${took:-0} * workers ))" "${execs:-?}" "${cov:-?}" "${#found[@]}"
  [ ${#found[@]} -eq 0 ] || status=1
  # keep the corpus small: only inputs that add coverage
  merged="$work/corpus-merged/$t"
  rm -rf "$merged" && mkdir -p "$merged"
  if "$build/tests/fuzz/fuzz_$t" -merge=1 "$merged" "$work/corpus/$t" > "$work/logs/$t-merge.log" 2>&1; then
    rm -rf "$work/corpus/$t" && mv "$merged" "$work/corpus/$t"
  fi
done
[ $status -eq 0 ] || echo "fuzz-long: failing inputs, minimised, in $work/minimised (details: $work/logs)"
exit $status
