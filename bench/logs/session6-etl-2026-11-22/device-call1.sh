#!/usr/bin/env bash
# etl5 device call 1: reader pieces claimed continuously (new) vs the pre-change build (57616d3),
# 16 threads; parse_ahead / fit window variants; per-thread CPU samples; page-cache write
# streams (dd); shard blocks queued for the file (DLREC_ETL_WRITE_QUEUE_MB); cmp at 16
# threads; reader and shard tests on 16 cores.
set -u
R=$PWD; G=$R/.gpu-etl5
(cd $G && tar xJf lib.tar.xz); source $G/env.sh
B=$G/bin/dlrec; O=$G/bin/dlrec-pre; D=/tmp/etl_scaling_8000000.tsv
export WORK=/tmp
date -u; nproc; free -g | head -2; uname -r
time $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null
{
for n in 1 2 4; do
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  s=$EPOCHREALTIME
  for ((i = 0; i < n; ++i)); do dd if=/dev/zero of=/tmp/w$i bs=4M count=$((320 / n)) status=none & done; wait
  e=$EPOCHREALTIME
  echo "dd $n streams, 1280 MiB buffered in all: $(echo "$s $e" | awk '{printf "%.3f s, %.0f MB/s", $2-$1, 1342.2/($2-$1)}')"
  rm -f /tmp/w*
done
} 2>&1 | tee $OUT/dd.log
ALTERNATE=1 REPEAT=5 PEER=$O timeout 120 bash bench/etl_scaling.sh $B 8000000 16 2>&1 | tee $OUT/sweep16.log
run() { local tag=$1; shift; timeout 40 "$@" --threads 16 bench etl --data $D --work-dir /tmp 2>/dev/null | sed "s/^/$tag /"; }
sample() { # tag env... -- runs one bench etl, sampling /proc/PID/task/*/stat every 50 ms
  local tag=$1; shift
  env "$@" --threads 16 bench etl --data $D --work-dir /tmp > /tmp/s.out 2>/dev/null & local pid=$!
  while kill -0 $pid 2>/dev/null; do echo "T $EPOCHREALTIME"; cat /proc/$pid/task/*/stat 2>/dev/null; sleep 0.05; done > $OUT/samples-$tag.txt
  wait $pid; sed "s/^/$tag /" /tmp/s.out
}
{
DLREC_ETL_PARSE_AHEAD=16 run ahead16 $B
DLREC_ETL_PARSE_AHEAD=64 run ahead64 $B
DLREC_ETL_FIT_WINDOW=4 run window4 $B
run peer $O
DLREC_ETL_WRITE_QUEUE_MB=1024 run wq1024 $B
run new $B
DLREC_ETL_WRITE_QUEUE_MB=1024 run wq1024 $B
run peer $O
DLREC_ETL_WRITE_QUEUE_MB=256 run wq256 $B
DLREC_ETL_PARSE_AHEAD=8 run ahead8 $B
sample new-sampled $B
sample peer-sampled $O
sample wq1024-sampled DLREC_ETL_WRITE_QUEUE_MB=1024 $B
} 2>&1 | tee $OUT/variants.log
(cd $OUT && tar czf samples.tgz samples-*.txt && rm samples-*.txt)
timeout 40 $B --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oN >/dev/null 2>&1
timeout 40 $O --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oO >/dev/null 2>&1
DLREC_ETL_WRITE_QUEUE_MB=1024 timeout 40 $B --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oQ >/dev/null 2>&1
{ ls /tmp/oO | wc -l; for f in /tmp/oO/*; do cmp $f /tmp/oQ/$(basename $f) && echo "same wq1024 $(basename $f)"; done; for f in /tmp/oO/*; do cmp $f /tmp/oN/$(basename $f) && echo "same $(basename $f)"; done; } > $OUT/cmp.txt 2>&1
cat $OUT/cmp.txt; rm -rf /tmp/oN /tmp/oO /tmp/oQ
ALTERNATE=1 REPEAT=2 PEER=$O timeout 60 bash bench/etl_scaling.sh $B 8000000 8 2>&1 | tee $OUT/sweep8.log
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | tail -3) | tee $OUT/tests.log
date -u
