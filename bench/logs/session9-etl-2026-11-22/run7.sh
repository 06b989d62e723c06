#!/usr/bin/env bash
# session 9 call 7: knobs of the final build at 16 threads, rounds alternating: default, fit
# window 2 and 4, read-ahead 4, parse-ahead 64, chunk rows 16384, count first.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
run() { local tag=$1; shift; echo "$tag $(env "$@" --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp $A 2>/dev/null)"; }
{ for i in 1 2 3 4; do
  A=""; run default $B
  A=""; run window2 DLREC_ETL_FIT_WINDOW=2 $B
  A=""; run window4 DLREC_ETL_FIT_WINDOW=4 $B
  A="--read-ahead 4"; run readahead4 $B
  A=""; run parseahead64 DLREC_ETL_PARSE_AHEAD=64 $B
  A="--chunk-rows 16384"; run chunk16k $B
  A=""; run countfirst DLREC_ETL_COUNT_AHEAD=0 $B
done; } > $L/knobs.log 2>&1
