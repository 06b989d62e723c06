#!/usr/bin/env bash
# session 9 call 4: new (count ahead + shard format 2 + dense ops on contiguous values) vs mid
# (without the dense change, 601ccc1) vs base (8cc304b), rounds alternating at 16 threads; then
# the sweep script new vs base; cmp new vs mid; tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; M=$G/bin/dlrec-mid; O=$G/bin/dlrec-base; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; cat /proc/loadavg; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
run() { local tag=$1 bin=$2; echo "$tag $($bin --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp 2>/dev/null)"; }
{ for i in 1 2 3 4 5 6; do run new $B; run mid $M; run base $O; done; } > $L/rounds.log 2>&1
export WORK=/tmp
ALTERNATE=1 REPEAT=5 PEER=$O timeout 120 bash bench/etl_scaling.sh $B 8000000 16 > $L/sweep16.log 2>&1
for a in "" "--workflow bench/etl_criteo_workflow.json"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $M --threads 16 etl --input $D $a --out /tmp/wM >/dev/null 2>&1
  { echo "${a:-default}"; for f in /tmp/wM/*; do cmp $f /tmp/wN/$(basename $f) && echo "same $(basename $f)"; done; } >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wM
done
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 150 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
$G/bin/perf record -o /tmp/p.data $G/bin/dlrec-sym --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp > $L/perf-run.txt 2>&1
$G/bin/perf report -i /tmp/p.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -45 > $L/perf-sym.txt
date -u >> $L/host.txt
