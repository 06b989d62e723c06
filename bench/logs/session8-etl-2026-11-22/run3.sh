#!/usr/bin/env bash
# lead call 3 (session 8): d76d1a9 (direct shard encoding + barrier-free transform from the cache)
# vs its batch path (DLREC_ETL_DIRECT=0) vs pre (13720cf's ETL = etl7's final build), 16 threads
# alternating; 8 threads; cmp; tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-pre; T=$G/bin/time; P=$G/bin/perf; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; cat /proc/buddyinfo; grep -i "unaccepted\|MemFree" /proc/meminfo; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
one() { local tag=$1 bin=$2 th=$3; shift 3
  env DLREC_ETL_TIMES=1 "$@" $T -f "TIME %e wall %U user %S sys %R minflt %M maxKB" -o /tmp/t.txt \
    $bin --threads $th bench etl --data $D --repeat 1 --work-dir /tmp >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; echo "$tag $(cat /tmp/t.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
}
{
for i in 1 2 3 4 5 6; do
  one new $B 16
  one pre $O 16
  one old $B 16 DLREC_ETL_DIRECT=0
done
for i in 1 2; do one new8 $B 8; one pre8 $O 8; done
} > $L/ab.log 2>&1
cd /tmp
$P record -F 1999 -o /tmp/p.data -- $B --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp > $L/perf-run.txt 2>&1
$P report -i /tmp/p.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -70 > $L/perf-sym.txt
$P report -i /tmp/p.data --no-children --sort pid 2>/dev/null | grep -v "^#" | grep "%" | head -50 > $L/perf-pid.txt
cd - >/dev/null
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do cmp $f $3/$(basename $f) && echo "same $(basename $f)"; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; }
for a in "" "--workflow bench/etl_criteo_workflow.json" "--shard-rows 3000000"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 120 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
date -u >> $L/host.txt
tar czf $OUT/logs.tgz -C $OUT logs
