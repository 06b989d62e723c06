#!/usr/bin/env bash
# CI's sanitizer stage (docs/FUZZING.md): after the normal build and `make test`, .ci/run runs
#   1. an ASan+UBSan build (clang-14, CUDA off, libFuzzer coverage) of the CPU test programs of
#      the parsers, ETL, training, serving and the CLI pipeline, and runs them;
#   2. every fuzz target for --fuzz-seconds (default 60) from its generated seeds, with the same
#      sanitizers;
#   3. a ThreadSanitizer build of the threaded modules' tests (thread pool, spin team, text
#      reader, shard and Parquet, ETL threads), and runs them.
# Any sanitizer report, crash, fuzz finding or failing test fails the script (non-zero exit).
#
# Options: --fuzz-seconds N (0: skip the fuzzing), --no-tsan, --tsan-serve (also the batcher's
# tests under TSan: builds the serving stack with TSan too), --jobs N (build jobs; default
# nproc), --build-dir DIR (default build-sanitize; TSan in DIR-tsan), --cxx COMPILER (default
# clang++-14, Debian 12's). Times of each part are
# printed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzz_seconds=60
tsan=1
tsan_serve=0
jobs=$(nproc)
build=build-sanitize
CXX=clang++-14
while [ $# -gt 0 ]; do
  case "$1" in
    --fuzz-seconds) fuzz_seconds=$2; shift 2 ;;
    --no-tsan) tsan=0; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    --build-dir) build=$2; shift 2 ;;
    --cxx) CXX=$2; shift 2 ;;
    --tsan-serve) tsan_serve=1; shift ;;
    *) echo "ci-sanitizers: unknown option '$1'" >&2; exit 2 ;;
  esac
done
if ! command -v "$CXX" >/dev/null; then
  echo "ci-sanitizers: $CXX not found (scripts/install-deps.sh installs clang-14)" >&2
  exit 1
fi

# Test programs and, with the regex, the tests in them that run under ASan+UBSan.
ASAN_TESTS="test_core test_io test_etl test_train test_serve test_integration test_store"
# ThreadSanitizer: the modules with their own threads (the whole programs are too slow there).
# test_serve (the batcher) is left out of CI: it needs a TSan build of nn/model/train/serve as
# well, which would not fit CI's 90 minutes on 2 cores with the rest (docs/FUZZING.md); run it
# by hand with --tsan-serve.
TSAN_TESTS="test_core test_io test_etl"
FUZZ_TARGETS="fuzz_text_reader fuzz_parquet fuzz_shard fuzz_json fuzz_tensor_file
              fuzz_http_codec fuzz_infer_wire"

# A finding must end the program with a non-zero status; the log check below catches reports
# from a process whose status a test does not look at (a child of the CLI tests).
export ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1

logs=$(mktemp -d "${TMPDIR:-/tmp}/dlrec-sanitizers.XXXXXX")
trap 'rm -rf "$logs"' EXIT
declare -a times=()
t0=$SECONDS
mark() { times+=("$(printf '%-34s %5d s' "$1" $((SECONDS - t0)))"); t0=$SECONDS; }

reports() {  # sanitizer reports in a log
  grep -E "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|SUMMARY: UndefinedBehaviorSanitizer|==dlrec-fuzz==" "$1" || true
}

run_logged() {  # name, command...: runs it, fails on a non-zero status or a report in its log
  local name=$1 log="$logs/$1.log"
  shift
  if ! "$@" > "$log" 2>&1; then
    tail -n 60 "$log"
    echo "ci-sanitizers: $name failed" >&2
    return 1
  fi
  if [ -n "$(reports "$log")" ]; then
    reports "$log" | head -20
    tail -n 60 "$log"
    echo "ci-sanitizers: $name: sanitizer report" >&2
    return 1
  fi
  echo "ci-sanitizers: $name ok ($(grep -E '^\[  PASSED  \]|inputs ran|Done [0-9]+ runs' "$log" | tail -n 1))"
}

configure() {  # dir, sanitizers, fuzz
  cmake -S . -B "$1" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_CXX_COMPILER="$CXX" \
    -DDLREC_CUDA=OFF -DDLREC_BENCH=OFF -DDLREC_SANITIZE="$2" -DDLREC_FUZZ="$3" > "$logs/cmake-$(basename "$1").log"
}

# 1. ASan + UBSan
configure "$build" address,undefined ON
cmake --build "$build" -j"$jobs" --target $ASAN_TESTS dlrec $FUZZ_TARGETS make_fuzz_seeds \
  > "$logs/build-asan.log" 2>&1 || { tail -n 80 "$logs/build-asan.log"; exit 1; }
mark "ASan+UBSan build"
for t in $ASAN_TESTS; do
  run_logged "asan-$t" "$build/bin/$t" --gtest_brief=1
done
mark "ASan+UBSan tests"

# 2. Fuzzing from generated seeds
if [ "$fuzz_seconds" -gt 0 ]; then
  "$build/bin/make_fuzz_seeds" "$logs/seeds" > /dev/null
  for t in $FUZZ_TARGETS; do
    corpus="$logs/corpus-$t"
    mkdir -p "$corpus" "$logs/artifacts-$t"
    # A fixed seed and a cap on the runs: CI's bounded run is reproducible (the same inputs on
    # every machine, whatever its speed, up to the cap); finding new bugs is the long
    # campaign's job (scripts/fuzz-campaign.sh, random seeds, >= 10M runs per target).
    run_logged "$t" "$build/bin/$t" -seed=1 -runs=500000 -max_total_time="$fuzz_seconds" -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
      -artifact_prefix="$logs/artifacts-$t/" "$corpus" "$logs/seeds/${t#fuzz_}"
    echo "   $(grep -E '^stat::number_of_executed_units' "$logs/$t.log") in ${fuzz_seconds} s"
  done
  mark "fuzzing (${fuzz_seconds} s per target)"
fi

# 3. ThreadSanitizer
if [ "$tsan" = 1 ]; then
  if [ "$tsan_serve" = 1 ]; then TSAN_TESTS="$TSAN_TESTS test_serve"; fi
  configure "$build-tsan" thread OFF
  cmake --build "$build-tsan" -j"$jobs" --target $TSAN_TESTS > "$logs/build-tsan.log" 2>&1 \
    || { tail -n 80 "$logs/build-tsan.log"; exit 1; }
  mark "TSan build"
  run_logged tsan-test_core "$build-tsan/bin/test_core" --gtest_brief=1
  run_logged tsan-test_io "$build-tsan/bin/test_io" --gtest_brief=1 \
    --gtest_filter='TextReader*:Shard*:Parquet*'
  run_logged tsan-test_etl "$build-tsan/bin/test_etl" --gtest_brief=1 \
    --gtest_filter='ThreadsTest*:FitWindowTest*:CountRowsTest*:KeptChunkTest*:SpillTest*'
  if [ "$tsan_serve" = 1 ]; then
    run_logged tsan-test_serve "$build-tsan/bin/test_serve" --gtest_brief=1 \
      --gtest_filter='DynamicBatcher*:LatencyHistogram*'
  fi
  mark "TSan tests"
fi

echo "ci-sanitizers: all passed; times:"
printf '  %s\n' "${times[@]}"
