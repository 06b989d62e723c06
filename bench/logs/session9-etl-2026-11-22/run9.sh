#!/usr/bin/env bash
# session 9 call 9: the final build (9a379a7) vs base (8cc304b, the session's first build):
# the sweep script alternating at 16 threads (REPEAT=9), then 8, 4, 2 (REPEAT=2); ETL phase
# times; shard_diff of the outputs; dlrec's open-file limit; tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-base; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; cat /proc/loadavg; ulimit -Sn; ulimit -Hn; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
export WORK=/tmp
ALTERNATE=1 REPEAT=9 PEER=$O timeout 200 bash bench/etl_scaling.sh $B 8000000 16 > $L/sweep16.log 2>&1
ALTERNATE=1 REPEAT=2 PEER=$O timeout 200 bash bench/etl_scaling.sh $B 8000000 8 4 2 > $L/sweep842.log 2>&1
{ for i in 1 2; do env DLREC_ETL_TIMES=1 $B --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp 2>&1 | grep -E "^bench etl|etl times"; done; } > $L/times.log 2>&1
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do case $f in *.shard) echo "$(basename $f): $($G/bin/shard_diff $f $3/$(basename $f))";; *) cmp $f $3/$(basename $f) && echo "same $(basename $f)";; esac; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; du -sb $2 $3; }
for a in "" "--workflow bench/etl_criteo_workflow.json" "--valid-ratio 0.37"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 150 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
date -u >> $L/host.txt
