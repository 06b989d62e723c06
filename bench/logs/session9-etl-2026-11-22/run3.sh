#!/usr/bin/env bash
# session 9 call 3: HEAD (count ahead + shard format 2: u8/u16 ids by cardinality) vs base
# (8cc304b), alternating at 16 threads (the sweep script), ETL phase times, row-level equality
# of the outputs (shard_diff; the other files cmp), a perf profile, tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-base; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
export WORK=/tmp
ALTERNATE=1 REPEAT=7 PEER=$O timeout 150 bash bench/etl_scaling.sh $B 8000000 16 > $L/sweep16.log 2>&1
one() { local tag=$1 bin=$2; shift 2
  env DLREC_ETL_TIMES=1 "$@" $bin --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
}
{ for i in 1 2; do one new $B; one base $O; done; } > $L/times.log 2>&1
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do case $f in *.shard) echo "$(basename $f): $($G/bin/shard_diff $f $3/$(basename $f))";; *) cmp $f $3/$(basename $f) && echo "same $(basename $f)";; esac; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; du -sb $2 $3; }
for a in "" "--workflow bench/etl_criteo_workflow.json" "--shard-rows 3000000" "--valid-ratio 0"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
$G/bin/perf record -o /tmp/p.data $G/bin/dlrec-sym --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp > $L/perf-run.txt 2>&1
$G/bin/perf report -i /tmp/p.data --no-children --sort sym 2>/dev/null | grep -v "^#" | grep "%" | head -45 > $L/perf-sym.txt
(cd /tmp && timeout 60 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 120 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
date -u >> $L/host.txt
