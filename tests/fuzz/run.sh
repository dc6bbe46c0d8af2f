#!/usr/bin/env bash
# Runs one fuzz target for a fixed time, as ctest's fuzz/NAME does:
#   run.sh FUZZER SEEDS SECONDS WORKDIR [DIR...] [libFuzzer flags...]
# FUZZER starts from what earlier runs found (WORKDIR/corpus/NAME, where new
# inputs go), the committed seeds tests/fuzz/corpus/SEEDS and any DIR (the
# regression inputs), with the dictionary tests/fuzz/dict/SEEDS.dict.  A
# crash, leak, timeout or out-of-memory input is saved as
# WORKDIR/artifacts/NAME-crash-... (-leak-, -timeout-, -oom-) and the run
# fails; libFuzzer's last lines say how many inputs ran.
#   SMELT_FUZZ_TIMEOUT  seconds one input may take (default 30)
set -euo pipefail
fuzzer=$1 seeds=$2 secs=$3 work=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
name=$(basename "$fuzzer")
name=${name#fuzz_}
mkdir -p "$work/corpus/$name" "$work/artifacts"
flags=(-max_total_time="$secs" -timeout="${SMELT_FUZZ_TIMEOUT:-30}" -rss_limit_mb=2048 -error_exitcode=1
       -print_final_stats=1 -artifact_prefix="$work/artifacts/$name-")
[ -f "$here/dict/$seeds.dict" ] && flags+=(-dict="$here/dict/$seeds.dict")
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# the first directory receives the new inputs: never a committed one
exec "$fuzzer" "${flags[@]}" "$work/corpus/$name" "$here/corpus/$seeds" "$@"
