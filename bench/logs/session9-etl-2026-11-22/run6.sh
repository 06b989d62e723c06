#!/usr/bin/env bash
# session 9 call 6: the reader's scaling (bench_text_reader, c=8192) at 1-16 threads with user/sys
# time and page faults; the fit's profile (DLREC_ETL_FIT_PROFILE=1) at 16 threads; perf of the
# reader alone at 16 threads (with call graph of the kernel part).
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
{ for t in 1 2 4 8 12 16; do
  $G/bin/time -f "t=$t wall %e user %U sys %S minflt %R majflt %F ctxsw %c/%w" $G/bin/bench_text_reader $D $t 3 8192 2>&1 | grep -E "best|wall"
done; } > $L/reader.log 2>&1
{ for i in 1 2 3; do DLREC_ETL_FIT_PROFILE=1 DLREC_ETL_TIMES=1 $B --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp 2>&1 | grep -E "^bench etl|fit pass|count known|fit done|rows written"; done; } > $L/fitprof.log 2>&1
$G/bin/perf record -g -o /tmp/p.data $G/bin/bench_text_reader-sym $D 16 3 8192 > /dev/null 2>&1
$G/bin/perf report -i /tmp/p.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | grep -v "^ *|" | grep -v -- "--" | head -40 > $L/perf-reader16.txt
$G/bin/perf record -o /tmp/p2.data $G/bin/bench_text_reader-sym $D 1 2 8192 > /dev/null 2>&1
$G/bin/perf report -i /tmp/p2.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -20 > $L/perf-reader1.txt
