#!/usr/bin/env bash
# lead call 5 (session 8): HEAD (direct encoding, barrier-free transform, writeback thread, SSE2
# count, validation first) vs pre (13720cf's ETL = etl7's final build): the sweep script
# alternating at 16 threads, then 8; cmp; tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-pre; T=$G/bin/time; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; cat /proc/buddyinfo; } > $L/host.txt 2>&1
export WORK=/tmp
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
ALTERNATE=1 REPEAT=7 PEER=$O timeout 150 bash bench/etl_scaling.sh $B 8000000 16 > $L/sweep16.log 2>&1
ALTERNATE=1 REPEAT=2 PEER=$O timeout 60 bash bench/etl_scaling.sh $B 8000000 8 4 > $L/sweep8.log 2>&1
one() { local tag=$1 bin=$2; shift 2
  env DLREC_ETL_TIMES=1 "$@" $T -f "TIME %e wall %U user %S sys %R minflt %M maxKB" -o /tmp/t.txt \
    $bin --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; echo "$tag $(cat /tmp/t.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
}
{ for i in 1 2; do one new $B; one pre $O; done; } > $L/times.log 2>&1
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do cmp $f $3/$(basename $f) && echo "same $(basename $f)"; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; }
for a in "" "--workflow bench/etl_criteo_workflow.json" "--shard-rows 3000000" "--valid-ratio 0"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 120 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
date -u >> $L/host.txt
tar czf $OUT/logs.tgz -C $OUT logs
