#!/usr/bin/env bash
# session 9 call 2: count ahead (a thread of its own, beside the fit) vs count first, the same
# binary (DLREC_ETL_COUNT_AHEAD=0), alternating, 16/8/4 threads; --valid-ratio 0 (no count at
# all) as the bound; the disk's write speed (dd with fsync); cmp of outputs; tests.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-base; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
{ date -u; nproc; } > $L/host.txt 2>&1
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
run() { local tag=$1; shift; echo "$tag $(env "$@" --threads $T bench etl --data $D --repeat 1 --work-dir /tmp 2>/dev/null)"; }
{ for T in 16; do for i in 1 2 3 4 5 6; do
  run "ahead t=$T" $B; run "first t=$T" DLREC_ETL_COUNT_AHEAD=0 $B; run "base t=$T" $O
done; done
for T in 8 4; do for i in 1 2; do
  run "ahead t=$T" $B; run "first t=$T" DLREC_ETL_COUNT_AHEAD=0 $B
done; done
T=16; for i in 1 2; do
  echo "noval t=16 $($B --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp --valid-ratio 0 --cache-huge-pages 2>/dev/null)"
done; } > $L/ab.log 2>&1
{ for i in 1 2; do
  s=$(date +%s.%N); dd if=/dev/zero of=/tmp/dd.bin bs=8M count=160 conv=fsync 2>&1 | tail -1; e=$(date +%s.%N)
  echo "dd 1342MB+fsync: $s $e"; rm -f /tmp/dd.bin
  dd if=/dev/zero of=/tmp/dd.bin bs=8M count=160 2>&1 | tail -1; rm -f /tmp/dd.bin
done; } > $L/dd.txt 2>&1
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do cmp $f $3/$(basename $f) && echo "same $(basename $f)"; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; }
for a in "" "--shard-rows 3000000" "--valid-ratio 0.37"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $L/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
(cd /tmp && timeout 120 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]") > $L/tests.log 2>&1
date -u >> $L/host.txt
