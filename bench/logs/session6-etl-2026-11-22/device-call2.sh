#!/usr/bin/env bash
# etl5 device call 2: final build vs the pre-change build (57616d3) at 16 and 8 threads;
# phase clock (DLREC_ETL_TIMES) with per-thread samples; shard write queue A/B; cmp; tests.
set -u
R=$PWD; G=$R/.gpu-etl5
(cd $G && tar xJf lib.tar.xz); source $G/env.sh
B=$G/bin/dlrec; O=$G/bin/dlrec-pre; D=/tmp/etl_scaling_8000000.tsv
export WORK=/tmp
date -u; nproc; uname -r
$B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
ALTERNATE=1 REPEAT=5 PEER=$O timeout 120 bash bench/etl_scaling.sh $B 8000000 16 2>&1 | tee $OUT/sweep16.log
sample() { # tag env... -- one bench etl, /proc/PID/task/*/stat every 50 ms
  local tag=$1; shift
  env "$@" --threads 16 bench etl --data $D --work-dir /tmp > /tmp/s.out 2>/tmp/s.err & local pid=$!
  while kill -0 $pid 2>/dev/null; do echo "T $EPOCHREALTIME"; cat /proc/$pid/task/*/stat 2>/dev/null; sleep 0.05; done > $OUT/samples-$tag.txt
  wait $pid; grep "etl times" /tmp/s.err | sed "s/^/$tag /"; sed "s/^/$tag /" /tmp/s.out
}
run() { local tag=$1; shift; env "$@" --threads 16 bench etl --data $D --work-dir /tmp 2>/tmp/r.err | sed "s/^/$tag /"; grep "etl times" /tmp/r.err | sed "s/^/$tag /"; }
{
sample times-sampled DLREC_ETL_TIMES=1 $B
sample peer-sampled $O
run times1 DLREC_ETL_TIMES=1 $B
for i in 1 2 3; do
  run wq256 DLREC_ETL_WRITE_QUEUE_MB=256 $B
  run default $B
  run peer $O
done
} 2>&1 | tee $OUT/variants.log
(cd $OUT && tar czf samples.tgz samples-*.txt && rm samples-*.txt)
timeout 40 $B --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oN >/dev/null 2>&1
timeout 40 $O --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oO >/dev/null 2>&1
{ ls /tmp/oO | wc -l; for f in /tmp/oO/*; do cmp $f /tmp/oN/$(basename $f) && echo "same $(basename $f)"; done; } > $OUT/cmp.txt 2>&1
cat $OUT/cmp.txt; rm -rf /tmp/oN /tmp/oO
ALTERNATE=1 REPEAT=3 PEER=$O timeout 60 bash bench/etl_scaling.sh $B 8000000 8 2>&1 | tee $OUT/sweep8.log
(cd /tmp && timeout 50 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | tail -3; DLREC_ETL_WRITE_QUEUE_MB=64 timeout 50 $G/bin/test_etl --gtest_filter='ThreadsTest*:RunEtl*' 2>&1 | tail -3) | tee $OUT/tests.log
date -u
