#!/usr/bin/env bash
# etl6 device call 2: new (a49caa1: pread count + two transform streams) vs pre (510c984),
# 16 threads alternating; variants (one stream, full chunks per stream) with the phase clock;
# 8 threads; whole-process wall time of `dlrec etl`; cmp of all outputs; tests.
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
  run two DLREC_ETL_TIMES=1 $B
  run one DLREC_ETL_TIMES=1 DLREC_ETL_STREAMS=1 $B
  run twofull DLREC_ETL_TIMES=1 DLREC_ETL_STREAM_CHUNKS=full $B
  run peer DLREC_ETL_TIMES=1 $O
done
} 2>&1 | tee $OUT/variants.log
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
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do cmp $f $3/$(basename $f) && echo "same $(basename $f)"; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; }
{ c default /tmp/o-pre /tmp/o-new; } > $OUT/cmp.txt 2>&1
rm -rf /tmp/o-new /tmp/o-pre
for a in "--workflow bench/etl_criteo_workflow.json" "--shard-rows 3000000"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "$a" /tmp/wO /tmp/wN >> $OUT/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
cat $OUT/cmp.txt
ALTERNATE=1 REPEAT=2 PEER=$O timeout 60 bash bench/etl_scaling.sh $B 8000000 8 2>&1 | tee $OUT/sweep8.log
for i in 1 2; do DLREC_ETL_STREAMS=1 $B --threads 8 bench etl --data $D --work-dir /tmp 2>/dev/null | sed "s/^/one8 /"; done | tee -a $OUT/sweep8.log
(cd /tmp && timeout 40 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | tail -3; timeout 60 $G/bin/test_etl 2>&1 | tail -3) | tee $OUT/tests.log
date -u
