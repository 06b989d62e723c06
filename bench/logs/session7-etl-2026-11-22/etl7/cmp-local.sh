#!/bin/bash
# usage: cmp-local.sh NEWBIN ; compares every output file against the pre-change build's
# (/tmp/etl7/dlrec-pre, HEAD 43a1f71 built before any change) on the 2M-row file.
set -u
NEW=$1; REF=/tmp/etl7/dlrec-pre; D=/tmp/c2m.tsv; W=/tmp/etl7
[ -d $W/ref-plain ] || $REF --threads 2 etl --input $D --out $W/ref-plain --overwrite 2>/dev/null
[ -d $W/ref-budget ] || $REF --threads 2 etl --input $D --out $W/ref-budget --memory-budget 64 --train-rows 1800000 --overwrite 2>/dev/null
[ -d $W/ref-r0 ] || $REF --threads 2 etl --input $D --out $W/ref-r0 --valid-ratio 0 --shard-rows 300000 --overwrite 2>/dev/null
[ -d $W/ref-1m ] || $REF --threads 2 etl --input $D --out $W/ref-1m --shard-rows 1000000 --overwrite 2>/dev/null
[ -d $W/ref-small ] || $REF --threads 2 etl --input $D --out $W/ref-small --shard-rows 300000 --overwrite 2>/dev/null
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

EXTRA="--valid-ratio 0 --shard-rows 300000" run "t3-r0-300k" "" r0 --threads 3
EXTRA="--shard-rows 1000000" run "t2-1m" "" 1m --threads 2
EXTRA="--shard-rows 1000000 --cache-form compact" run "t3-1m-compact" "" 1m --threads 3
EXTRA="--shard-rows 300000" run "t4-shardrows300k" "" small --threads 4
EXTRA="--input-cache 0" run "t8-nocache" "" plain --threads 8
rm -rf $W/out
# etl7: the huge-page / cache-form choices against the same references
EXTRA="--no-cache-huge-pages" run "t3-nohuge" "" plain --threads 3
EXTRA="--cache-huge-pages --cache-form parsed" run "t2-huge-parsed" "" plain --threads 2
EXTRA="--cache-huge-pages --memory-budget 64 --train-rows 1800000" run "t3-huge-budget" "" budget --threads 3
rm -rf $W/out
