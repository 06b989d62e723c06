set -u
L=$OUT/logs; mkdir -p $L
export WORK=/tmp
.gpu/bin/dlrec_cpu datagen --rows 8000000 --seed 7 --out /tmp/etl_scaling_8000000.tsv > /dev/null 2>&1; sync; cat /tmp/etl_scaling_8000000.tsv > /dev/null
ALTERNATE=1 REPEAT=5 PEER=$PWD/.gpu/dlrec_notrim.sh bash bench/etl_scaling.sh .gpu/bin/dlrec_cpu 8000000 16 2>&1 | tee $L/trim16.log | grep -E "MB/s|^peer" | cut -c1-200
DLREC_ETL_TIMES=1 .gpu/bin/dlrec_cpu --threads 16 bench etl --data /tmp/etl_scaling_8000000.tsv --repeat 1 --work-dir /tmp > $L/times_default.log 2>&1
DLREC_ETL_TIMES=1 .gpu/dlrec_notrim.sh --threads 16 bench etl --data /tmp/etl_scaling_8000000.tsv --repeat 1 --work-dir /tmp > $L/times_notrim.log 2>&1
tar czf $OUT/logs.tgz -C $OUT logs
