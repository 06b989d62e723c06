#!/bin/bash
# usage: cmp.sh NEWBIN ; compares against /tmp/etl4/ref-{plain,budget}
set -u
NEW=$1; REF=/work/etl3-base/bin/dlrec; D=/tmp/c2m.tsv
[ -d /tmp/etl4/ref-plain ] || $REF --threads 2 etl --input $D --out /tmp/etl4/ref-plain --overwrite 2>/dev/null
[ -d /tmp/etl4/ref-budget ] || $REF --threads 2 etl --input $D --out /tmp/etl4/ref-budget --memory-budget 64 --train-rows 1800000 --overwrite 2>/dev/null
check() { # name refdir outdir
  local bad=0
  for f in $(ls $2); do cmp -s $2/$f $3/$f || { echo "DIFF $1 $f"; bad=1; }; done
  [ "$(ls $2)" = "$(ls $3)" ] || { echo "DIFF $1 file list"; bad=1; }
  [ $bad = 0 ] && echo "same $1"
}
run() { # name env refname args...
  local name=$1 envs=$2 ref=$3; shift 3
  rm -rf /tmp/etl4/out
  env $envs $NEW "$@" etl --input $D --out /tmp/etl4/out --overwrite "${@:0:0}" $EXTRA 2>/tmp/etl4/err.log || { echo "FAIL $name"; tail -3 /tmp/etl4/err.log; return; }
  check "$name" /tmp/etl4/ref-$ref /tmp/etl4/out
}
for t in 1 2 3; do
  EXTRA="" run "t$t" "" plain --threads $t
  EXTRA="--memory-budget 64 --train-rows 1800000" run "t$t-budget" "" budget --threads $t
done
EXTRA="--cache-form compact" run "t3-compact" "" plain --threads 3
EXTRA="--input-cache 0" run "t3-nocache" "" plain --threads 3
EXTRA="" run "t3-w2" "DLREC_ETL_FIT_WINDOW=2" plain --threads 3
EXTRA="--cache-form compact" run "t2-w16-compact" "DLREC_ETL_FIT_WINDOW=16" plain --threads 2
EXTRA="--input-cache 0" run "t8-w3-nocache" "DLREC_ETL_FIT_WINDOW=3" plain --threads 8
EXTRA="--memory-budget 64 --train-rows 1800000" run "t3-budget-w4env" "DLREC_ETL_FIT_WINDOW=4" budget --threads 3
rm -rf /tmp/etl4/out
