#!/usr/bin/env bash
# A long fuzzing campaign (docs/FUZZING.md): every fuzz target for at least --runs executions
# (default 10,000,000) on all cores, with ASan + UBSan, from the generated seeds. Pass
# criteria: no crash, no sanitizer report, no input slower than 10 s, no out-of-memory (2 GB
# RSS, 1 GB in one allocation). The corpora, logs and any crashing inputs stay in --out for
# the next campaign and for reproduction (`$BUILD/bin/fuzz_x CRASH_FILE` runs one input).
#
#   scripts/fuzz-campaign.sh [--runs N] [--jobs N] [--out DIR (default BUILD/campaign)] [--build-dir DIR]
#                            [--targets "fuzz_a fuzz_b"] [--strict-errors] [--cxx COMPILER]
#                            [--prebuilt BIN_DIR] [--seeds DIR] [--max-seconds S]
#
# --jobs: fuzzing processes per target (default: nproc); the targets run one after the other,
#   each job doing runs/jobs executions into a corpus the jobs share.
# --strict-errors: also fail when an exception other than dlrec::Error escapes a reader
#   (fuzz/fuzz_util.h; the known ones are listed in docs/FUZZING.md, "Findings").
# Builds DIR (default build-fuzz: clang-14, ASan+UBSan, libFuzzer, CUDA off) when needed.
# --prebuilt BIN_DIR: use the targets and make_fuzz_seeds already built in BIN_DIR (e.g. copied to
#   a machine with more cores and no compiler); nothing is built. --out is then required.
# --seeds DIR: seeds made beforehand by make_fuzz_seeds (it reads configs/ from the source tree
#   it was built in, which another machine may lack), instead of generating them in OUT/seeds.
# --max-seconds S: stop each target after S seconds (libFuzzer's -max_total_time per job) even
#   when it has fewer than --runs executions (it then fails the --runs criterion, visibly).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=10000000
jobs=$(nproc)
out=""
build=build-fuzz
cxx=clang++-14
strict=""
prebuilt=""
max_seconds=0
seeds=""
targets="fuzz_text_reader fuzz_parquet fuzz_shard fuzz_json fuzz_tensor_file fuzz_http_codec
         fuzz_infer_wire"
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --targets) targets=$2; shift 2 ;;
    --strict-errors) strict=--dlrec-strict-errors; shift ;;
    --cxx) cxx=$2; shift 2 ;;
    --prebuilt) prebuilt=$2; shift 2 ;;
    --max-seconds) max_seconds=$2; shift 2 ;;
    --seeds) seeds=$2; shift 2 ;;
    *) echo "fuzz-campaign: unknown option '$1'" >&2; exit 2 ;;
  esac
done
export ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1

if [ -n "$prebuilt" ]; then
  [ -n "$out" ] || { echo "fuzz-campaign: --prebuilt needs --out" >&2; exit 2; }
  bin=$(cd "$prebuilt" && pwd)
else
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_CXX_COMPILER="$cxx" \
    -DDLREC_CUDA=OFF -DDLREC_BENCH=OFF -DDLREC_SANITIZE=address,undefined -DDLREC_FUZZ=ON >/dev/null
  cmake --build "$build" -j"$jobs" --target $targets make_fuzz_seeds >/dev/null
  bin=$PWD/$build/bin
fi
out=${out:-$build/campaign}
mkdir -p "$out"
out=$(cd "$out" && pwd)
if [ -n "$seeds" ]; then
  seeds=$(cd "$seeds" && pwd)
else
  rm -rf "$out/seeds"
  "$bin/make_fuzz_seeds" "$out/seeds" >/dev/null
  seeds=$out/seeds
fi
limit=""
[ "$max_seconds" -le 0 ] || limit="-max_total_time=$max_seconds"

per_job=$(( (runs + jobs - 1) / jobs ))
status=0
summary=()
for t in $targets; do
  name=${t#fuzz_}
  corpus="$out/corpus/$name" art="$out/artifacts/$name" logdir="$out/logs/$name"
  mkdir -p "$corpus" "$art" "$logdir"
  start=$SECONDS
  # -jobs children write fuzz-<i>.log into the working directory.
  (cd "$logdir" && rm -f fuzz-*.log &&
   "$bin/$t" $strict -jobs="$jobs" -workers="$jobs" -runs="$per_job" $limit \
     -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
     -artifact_prefix="$art/" "$corpus" "$seeds/$name" > driver.log 2>&1) || true
  secs=$((SECONDS - start))
  execs=$(cat "$logdir"/fuzz-*.log 2>/dev/null | awk '/^stat::number_of_executed_units/ {s += $2} END {print s + 0}')
  found=$(ls "$art" | grep -E '^(crash|timeout|oom|leak)-' || true)
  reports=$(grep -lE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|==dlrec-fuzz==|ERROR: libFuzzer" "$logdir"/fuzz-*.log 2>/dev/null || true)
  verdict=pass
  if [ -n "$found" ] || [ -n "$reports" ] || [ "$execs" -lt "$runs" ]; then
    verdict=FAIL
    status=1
  fi
  line=$(printf '%-18s %s  %12d execs  %6d s  %8d exec/s' "$t" "$verdict" "$execs" "$secs" \
         $(( execs / (secs > 0 ? secs : 1) )))
  summary+=("$line")
  echo "$line"
  [ -z "$found" ] || echo "  artifacts: $(echo $found)"
  [ -z "$reports" ] || echo "  reports in: $(echo $reports)"
done
echo "fuzz-campaign: $runs runs per target wanted, $jobs jobs; corpora and logs in $out"
printf '  %s\n' "${summary[@]}"
exit $status
