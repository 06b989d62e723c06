#!/usr/bin/env bash
# session 9 call 1: where the parse's time goes on the 16-core host. bench_text_reader (parse
# only) new (SSE2 line scan + known-length fields) vs base (HEAD 8cc304b) at 1/8/16 threads with
# 65536- and 8192-row chunks; bench etl at 16 threads with --chunk-rows default/16384/8192.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-base; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; lscpu | grep -E "Model name|NUMA|L2|L3"; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
{ for t in 1 8 16; do for c in 65536 8192; do
  r=3; [ $t = 1 ] && r=2
  echo "new t=$t c=$c $($G/bin/bench_text_reader $D $t $r $c | tail -1)"
  echo "base t=$t c=$c $($G/bin/bench_text_reader-base $D $t $r $c | tail -1)"
done; done; } > $L/reader.log 2>&1
{ for i in 1 2 3; do for c in 0 16384 8192; do
  a=""; [ $c != 0 ] && a="--chunk-rows $c"
  echo "new c=$c $($B --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp $a 2>/dev/null)"
  echo "base c=$c $($O --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp $a 2>/dev/null)"
done; done; } > $L/etl.log 2>&1
perf stat -e task-clock,page-faults $G/bin/bench_text_reader $D 16 3 65536 > $L/perfstat.txt 2>&1
perf record -o /tmp/pr.data $G/bin/bench_text_reader-sym $D 16 3 65536 > /dev/null 2>&1
perf report -i /tmp/pr.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -30 > $L/perf-reader16.txt
timeout 60 $G/bin/test_io --gtest_filter='TextReader*' 2>&1 | tail -3 > $L/tests.log
date -u >> $L/host.txt
