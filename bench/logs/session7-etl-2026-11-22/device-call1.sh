#!/usr/bin/env bash
# etl6 device call 1: new (997bc57) vs pre (510c984) at 16 threads, alternating; variants
# (pwrite blocks, parallel release) with the phase clock; whole-process wall time of `dlrec etl`;
# cmp of all outputs; tests.
set -u
R=$PWD; G=$R/.gpu-etl6
(cd $G && tar xJf lib.tar.xz); source $G/env.sh
B=$G/bin/dlrec; O=$G/bin/dlrec-pre; D=/tmp/etl_scaling_8000000.tsv
export WORK=/tmp
date -u; nproc; uname -r; df -hT /tmp | tail -1
$B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
ALTERNATE=1 REPEAT=5 PEER=$O timeout 100 bash bench/etl_scaling.sh $B 8000000 16 2>&1 | tee $OUT/sweep16.log
run() { local tag=$1; shift; env "$@" --threads 16 bench etl --data $D --work-dir /tmp 2>/tmp/r.err | sed "s/^/$tag /"; grep "etl times" /tmp/r.err | sed "s/^/$tag /"; }
{
for i in 1 2 3; do
  run map DLREC_ETL_TIMES=1 $B
  run pwrite DLREC_ETL_TIMES=1 DLREC_SHARD_WRITE=pwrite $B
  run release DLREC_ETL_TIMES=1 DLREC_ETL_RELEASE=parallel $B
  run peer DLREC_ETL_TIMES=1 $O
done
} 2>&1 | tee $OUT/variants.log
# whole process: dlrec etl (default workflow, valid_ratio from the CLI default), output deleted untimed
{
TIMEFORMAT='%R s wall, %U user %S sys'
for i in 1 2 3; do
  for who in new pre; do
    bin=$B; [ $who = pre ] && bin=$O
    rm -rf /tmp/o-$who; sync
    echo -n "etl-process $who: "; { time $bin --threads 16 etl --input $D --out /tmp/o-$who >/tmp/e.out 2>/tmp/e.err; } 2>&1
    tail -1 /tmp/e.out
  done
done
} 2>&1 | tee $OUT/process.log
{ ls /tmp/o-pre | wc -l; for f in /tmp/o-pre/*; do cmp $f /tmp/o-new/$(basename $f) && echo "same $(basename $f)"; done; ls /tmp/o-new; } > $OUT/cmp.txt 2>&1
timeout 40 $B --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/wN >/dev/null 2>&1
timeout 40 $O --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/wO >/dev/null 2>&1
{ echo "criteo workflow:"; ls /tmp/wO | wc -l; for f in /tmp/wO/*; do cmp $f /tmp/wN/$(basename $f) && echo "same $(basename $f)"; done; } >> $OUT/cmp.txt 2>&1
cat $OUT/cmp.txt; rm -rf /tmp/wN /tmp/wO /tmp/o-new /tmp/o-pre
(cd /tmp && timeout 40 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | tail -3; timeout 60 $G/bin/test_etl 2>&1 | tail -3) | tee $OUT/tests.log
date -u
