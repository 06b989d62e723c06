#!/usr/bin/env bash
# Issue 3 measurements on one GPU host, in one go; every log under $OUT (default ./out).
#   bash bench/gpu_train_suite.sh tests|dlrec|peers|auc|fp16 ...   (parts, in the order given)
# Binaries from $BIN (default .gpu/bin: a bundle made by ../shared/tools/bundle-portable.sh);
# the facebookresearch/dlrm checkout for the reference run from $DLRM_DIR (default .gpu/dlrm).
set -u
OUT=${OUT:-out}
BIN=${BIN:-.gpu/bin}
DLRM_DIR=${DLRM_DIR:-.gpu/dlrm}
mkdir -p "$OUT"
KAGGLE=1460-583-10131227-2202608-305-24-12517-633-3-93145-5683-8351593-3194-27-14992-5461306-10-5652-2173-4-7046547-18-15-286181-105-142572
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
for part in "$@"; do
  case $part in
    tests)
      "$BIN/test_model" --gtest_filter='DlrmCuda.*' > "$OUT/parity.log" 2>&1; echo "parity rc=$?"
      "$BIN/test_train" --gtest_filter='Metrics.*' > "$OUT/metrics.log" 2>&1; echo "metrics rc=$?"
      for tool in memcheck racecheck; do
        DLREC_PARITY_STEPS=8 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_model" \
          --gtest_filter='DlrmCuda.*' > "$OUT/$tool.log" 2>&1; echo "$tool rc=$?"
      done
      compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/test_train" \
        --gtest_filter='Metrics.*' > "$OUT/memcheck_metrics.log" 2>&1; echo "memcheck metrics rc=$?"
      ;;
    dlrec)
      for p in fp32 tf32 bf16 fp16; do
        "$BIN/dlrec" bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 \
          --precision $p 2>&1 | tee -a "$OUT/dlrec_bench.log" | grep "^bench"
      done
      "$BIN/dlrec" bench train --device cuda --batch 32768 --steps 20 --warmup 5 --precision bf16 \
        --optimizer adagrad 2>&1 | tee -a "$OUT/dlrec_bench.log" | grep "^bench"
      DLREC_PROFILE=1 "$BIN/dlrec" bench train --device cuda --batch 32768 --steps 20 --warmup 5 \
        --precision bf16 > "$OUT/profile_bf16.log" 2>&1
      DLREC_PROFILE=1 "$BIN/dlrec" bench train --device cuda --batch 32768 --steps 20 --warmup 5 \
        --precision fp32 > "$OUT/profile_fp32.log" 2>&1
      ;;
    nsys)
      nsys profile -o "$OUT/bf16" --force-overwrite true "$BIN/dlrec" bench train --device cuda \
        --batch 32768 --steps 10 --warmup 3 --precision bf16 > "$OUT/nsys_run.log" 2>&1
      nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/bf16.nsys-rep" > "$OUT/kernels_bf16.csv" 2>&1
      rm -f "$OUT/bf16.nsys-rep" "$OUT/bf16.sqlite"
      ;;
    pytorch)
      python3 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 --warmup 5 \
        > "$OUT/pytorch_fp32.log" 2>&1; tail -2 "$OUT/pytorch_fp32.log"
      python3 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 --warmup 5 --bf16 \
        > "$OUT/pytorch_bf16.log" 2>&1; tail -2 "$OUT/pytorch_bf16.log"
      ;;
    peers)
      python3 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 --warmup 5 \
        > "$OUT/pytorch_fp32.log" 2>&1; tail -3 "$OUT/pytorch_fp32.log"
      python3 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 --warmup 5 --bf16 \
        > "$OUT/pytorch_bf16.log" 2>&1; tail -3 "$OUT/pytorch_bf16.log"
      for B in ${REF_BATCHES:-32768 55296}; do
        timeout ${REF_TIMEOUT:-300} python3 bench/dlrm_reference.py --dlrm "$DLRM_DIR" -- --use-gpu --print-time \
          --arch-sparse-feature-size=128 --arch-mlp-bot=13-512-256-128 \
          --arch-mlp-top=1024-1024-512-256-1 --arch-interaction-op=dot \
          --arch-embedding-size=$KAGGLE --data-generation=random --num-indices-per-lookup=1 \
          --num-indices-per-lookup-fixed=True --mini-batch-size=$B --num-batches=30 \
          --print-freq=10 --learning-rate=0.01 --loss-function=bce --round-targets=True \
          > "$OUT/dlrm_reference_$B.log" 2>&1; echo "reference $B rc=$?"; grep "ms/it" "$OUT/dlrm_reference_$B.log"
      done
      ;;
    auc)
      # bf16 vs fp32 validation AUC on the synthetic data (same data, config, seed).
      D=$(mktemp -d)
      "$BIN/dlrec" datagen --out "$D/logs.tsv" --rows 4000000 > "$OUT/auc.log" 2>&1
      "$BIN/dlrec" etl --input "$D/logs.tsv" --out "$D/data" >> "$OUT/auc.log" 2>&1
      # The input pipeline alone, and MLPerf-model training fed from these shards.
      "$BIN/dlrec" bench train --reader-only --data "$D/data" --batch 32768 --steps 30 2>&1 \
        | tee -a "$OUT/auc.log" | grep "^bench"
      "$BIN/dlrec" bench train --device cuda --data "$D/data" --batch 32768 --steps 60 \
        --warmup 5 --precision bf16 2>&1 | tee -a "$OUT/auc.log" | grep "^bench"
      for p in fp32 bf16; do
        "$BIN/dlrec" train --config configs/dlrm_small.json --data "$D/data" --run "$D/run_$p" \
          --device cuda --precision $p >> "$OUT/auc_$p.log" 2>&1
        echo "$p: $(grep -i 'auc' "$OUT/auc_$p.log" | tail -1)"
      done
      rm -rf "$D"
      ;;
    fp16)
      # fp16 with loss scaling beside bf16 (speed), and its validation AUC beside fp32's.
      for p in bf16 fp16; do
        "$BIN/dlrec" bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 \
          --precision $p 2>&1 | tee -a "$OUT/fp16_bench.log" | grep "^bench"
      done
      D=$(mktemp -d)
      "$BIN/dlrec" datagen --out "$D/logs.tsv" --rows 4000000 > "$OUT/fp16_auc.log" 2>&1
      "$BIN/dlrec" etl --input "$D/logs.tsv" --out "$D/data" >> "$OUT/fp16_auc.log" 2>&1
      for p in fp32 fp16; do
        "$BIN/dlrec" train --config configs/dlrm_small.json --data "$D/data" --run "$D/run_$p" \
          --device cuda --precision $p >> "$OUT/fp16_auc_$p.log" 2>&1
        echo "$p: $(grep -i 'auc' "$OUT/fp16_auc_$p.log" | tail -1)"
        grep "^\[fp16\]" "$OUT/fp16_auc_$p.log"
      done
      rm -rf "$D"
      ;;
  esac
done
