#!/usr/bin/env bash
# etl4 device call: fit without a barrier per batch (window 4 default) vs the pre-change build
# (bc21aed), 16 and 8 threads; window variants; per-strand profile; cmp at 16 threads; tests.
set -u
R=$PWD; G=$R/.gpu-etl4
(cd $G && tar xJf lib.tar.xz); source $G/env.sh
B=$G/bin/dlrec-t; O=$G/bin/dlrec-pre; D=/tmp/etl_scaling_8000000.tsv
export WORK=/tmp
date -u; nproc; free -g | head -2
time $G/bin/dlrec datagen --rows 8000000 --seed 7 --out $D 2>/dev/null
ALTERNATE=1 REPEAT=3 PEER=$O timeout 100 bash bench/etl_scaling.sh $B 8000000 16 2>&1 | tee $OUT/sweep16.log
run() { local t=$1 tag=$2; shift 2; timeout 40 "$@" --threads $t bench etl --data $D --work-dir /tmp 2>/dev/null | sed "s/^/$tag t$t /"; }
{
DLREC_ETL_FIT_PROFILE=1 timeout 40 $B --threads 16 bench etl --data $D --work-dir /tmp 2>&1 | grep -E "^fit pass|^bench" | sed 's/^/profile t16 /'
for w in 1 2 8; do DLREC_ETL_FIT_WINDOW=$w run 16 window$w $B; done
run 16 peer $O
DLREC_ETL_FIT_WINDOW=16 run 16 window16 $B
} 2>&1 | tee $OUT/variants.log
timeout 40 $B --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oN >/dev/null 2>&1
timeout 40 $O --threads 16 etl --input $D --workflow bench/etl_criteo_workflow.json --out /tmp/oO >/dev/null 2>&1
{ ls /tmp/oO | wc -l; for f in /tmp/oO/*; do cmp $f /tmp/oN/$(basename $f) && echo "same $(basename $f)"; done; } > $OUT/cmp.txt 2>&1
cat $OUT/cmp.txt; rm -rf /tmp/oN /tmp/oO
ALTERNATE=1 REPEAT=3 PEER=$O timeout 70 bash bench/etl_scaling.sh $B 8000000 8 2>&1 | tee $OUT/sweep8.log
(cd /tmp && timeout 40 $G/bin/test_etl --gtest_filter='FitWindow*:ThreadsTest*' 2>&1 | tail -3) | tee $OUT/tests.log
date -u
