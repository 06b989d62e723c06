#!/usr/bin/env bash
cd "$(dirname "$0")/.."
B=.gpu2/bin
export DLREC_SOURCE_DIR=$PWD
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; date -u; python3 -c 'import torch; print("torch", torch.__version__)'; } > $OUT/gpu.txt 2>&1
timeout 80 $B/test_model --gtest_filter='GraphCuda.*:DlrmCuda.*:Graph*' > $OUT/tests.log 2>&1; echo "rc=$?" >> $OUT/tests.log
BT="$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296"
{
for p in bf16 tf32; do timeout 40 $BT --precision $p --steps 30 --warmup 5 2>&1; done
timeout 40 $BT --precision fp32 --steps 10 --warmup 3 2>&1
} > $OUT/bench.log
{
timeout 40 python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16 2>&1
timeout 40 python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 10 --warmup 3 --tf32 2>&1
timeout 40 python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 10 --warmup 3 2>&1
} > $OUT/pytorch.log
{
set -x
T=/tmp/e2e; mkdir -p $T
$B/dlrec datagen --rows 400000 --seed 7 --out $T/logs.tsv && \
$B/dlrec etl --input $T/logs.tsv --workflow configs/etl_criteo.json --valid-ratio 0.1 --out $T/data && \
for d in "cpu fp32" "cuda fp32" "cuda bf16"; do set -- $d
  timeout 60 $B/dlrec train --config configs/criteo_sample_dcnv2.json --data $T/data --run $T/run_$1_$2 --device $1 --precision $2 --batch-size 1024 --epochs 1 2>&1 | tail -2
  $B/dlrec eval --run $T/run_$1_$2 2>&1 | tail -2
done
} > $OUT/e2e.log 2>&1
