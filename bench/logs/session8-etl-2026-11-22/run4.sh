#!/usr/bin/env bash
# lead call 4 (session 8): the transform's file thread: writeback on its own thread (DLREC_SHARD_WB=1)
# or none (2), one worker less (DLREC_ETL_WORKERS=1); 16 threads, rounds alternating.
set -u
G=$PWD/.gpu-lead; B=$G/bin/dlrec; O=$G/bin/dlrec-pre; T=$G/bin/time; D=/tmp/etl_scaling_8000000.tsv
L=$OUT/logs; mkdir -p $L
[ -f $D ] || $B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
one() { local tag=$1 bin=$2 th=$3; shift 3
  env DLREC_ETL_TIMES=1 "$@" $T -f "TIME %e wall %U user %S sys %R minflt %M maxKB" -o /tmp/t.txt \
    $bin --threads $th bench etl --data $D --repeat 1 --work-dir /tmp >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; echo "$tag $(cat /tmp/t.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
}
{
for i in 1 2 3 4 5; do
  one new $B 16
  one wb1 $B 16 DLREC_SHARD_WB=1
  one w15 $B 16 DLREC_ETL_WORKERS=1
  one wb1w15 $B 16 DLREC_SHARD_WB=1 DLREC_ETL_WORKERS=1
  one wb2 $B 16 DLREC_SHARD_WB=2
  one pre $O 16
done
} > $L/ab.log 2>&1
tar czf $OUT/logs.tgz -C $OUT logs
