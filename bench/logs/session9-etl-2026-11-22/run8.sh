#!/usr/bin/env bash
# session 9 call 8 (exploration): what the per-row categorical offsets cost the parse: the reader
# alone, as built vs a build whose fast path does not append them (wrong output, measurement only).
set -u
G=$PWD/.gpu-lead; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
[ -f $D ] || $G/bin/dlrec datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
{ for i in 1 2 3; do for t in 16 1; do r=3; [ $t = 1 ] && r=1
  echo "asis t=$t $($G/bin/time -f 'user %U sys %S' $G/bin/bench_text_reader $D $t $r 8192 2>&1 | grep -E 'best|user' | tr '\n' ' ')"
  echo "nooff t=$t $($G/bin/time -f 'user %U sys %S' $G/bin/bench_text_reader-nooff $D $t $r 8192 2>&1 | grep -E 'best|user' | tr '\n' ' ')"
done; done; } > $L/nooff.log 2>&1
