#!/bin/bash
# usage: cmp-local.sh NEWBIN ; compares every output file against the pre-change build's
# (/tmp/etl5/dlrec-pre, HEAD 57616d3 built before any change) on the 2M-row file.
set -u
NEW=$1; REF=/tmp/etl5/dlrec-pre; D=/tmp/c2m.tsv; W=/tmp/etl5
[ -d $W/ref-plain ] || $REF --threads 2 etl --input $D --out $W/ref-plain --overwrite 2>/dev/null
[ -d $W/ref-budget ] || $REF --threads 2 etl --input $D --out $W/ref-budget --memory-budget 64 --train-rows 1800000 --overwrite 2>/dev/null
[ -d $W/ref-skip ] || $REF --threads 2 etl --input $D --out $W/ref-skip --train-rows 1500000 --input-cache 0 --overwrite 2>/dev/null
check() { # name refdir outdir
  local bad=0
  for f in $(ls $2); do cmp -s $2/$f $3/$f || { echo "DIFF $1 $f"; bad=1; }; done
  [ "$(ls $2)" = "$(ls $3)" ] || { echo "DIFF $1 file list"; bad=1; }
  [ $bad = 0 ] && echo "same $1 ($(ls $3 | wc -l) files)"
}
run() { # name env refname args...
  local name=$1 envs=$2 ref=$3; shift 3
  rm -rf $W/out
  env $envs $NEW "$@" etl --input $D --out $W/out --overwrite $EXTRA 2>$W/err.log || { echo "FAIL $name"; tail -3 $W/err.log; return; }
  check "$name" $W/ref-$ref $W/out
}
for t in 1 2 3; do
  EXTRA="" run "t$t" "" plain --threads $t
  EXTRA="--memory-budget 64 --train-rows 1800000" run "t$t-budget" "" budget --threads $t
done
EXTRA="--cache-form compact" run "t3-compact" "" plain --threads 3
EXTRA="--input-cache 0" run "t8-nocache" "" plain --threads 8
EXTRA="--train-rows 1500000 --input-cache 0" run "t5-maxrows-nocache" "" skip --threads 5
EXTRA="" run "t4-ahead1" "DLREC_ETL_PARSE_AHEAD=1" plain --threads 4
rm -rf $W/out
