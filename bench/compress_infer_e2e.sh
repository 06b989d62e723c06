#!/usr/bin/env bash
# Issue 21's end-to-end inference figure: `dlrec bench infer` on the MLPerf DLRM and DCNv2
# shapes, the same trained model as bf16 (plain export), 2:4, int8 and 2:4+int8 exports, at
# batch 1, 2048 and 32768 (bench/RESULTS.md, "Compression").
#
#   bash bench/compress_infer_e2e.sh prepare OUT DLREC [CONFIGS]  # CPU: data, a few steps,
#                                                         # dlrec compress, the 8 exports
#   bash bench/compress_infer_e2e.sh run OUT DLREC [ITERS]        # GPU: bench infer of each
#   bash bench/compress_infer_e2e.sh breakdown OUT DLREC [ITERS]  # GPU: the bf16 and 2:4+int8
#     exports at 2048 and 32768 with --breakdown (where one chunk's time goes: host packing,
#     the input copy, each layer and dense layer, the captured graph)
#   bash bench/compress_infer_e2e.sh small OUT DLREC [ITERS]      # GPU: batch 1 and 8 (the
#     fused small-batch kernel), the bf16 export and the int8 ones under --kernels fastest
#     (dense 16-bit weights in the fused kernel) and compressed (its INT8 form)
#
# prepare: 20,000 synthetic Criteo-like rows (13 dense, 26 categorical: the MLPerf layout, so
# that the GEMM shapes are the MLPerf DLRM's and DCNv2's; the tables are small), 2 steps of
# batch 1024 on the CPU per model, then one-shot 2:4 pruning (--skip-incompatible: bottom.0,
# 13 inputs, stays dense), PTQ (max calibration, 1 batch of 2048) of the dense and of the
# pruned run. The speed of the serving GEMMs does not depend on how well the model is trained.
# The exports are too big to carry (DCNv2's 2:4 + INT8 one is 139 MB): prepare runs where the
# bench does.
set -euo pipefail
mode=${1:?prepare or run}
out=${2:?output folder}
dlrec=${3:?dlrec binary}
arg4=${4:-}
models="mlperf_dlrm dcnv2"
configs=$(cd "$(dirname "$0")/.." && pwd)/configs iters=60
if [ "$mode" = prepare ]; then configs=${arg4:-$configs}; else iters=${arg4:-60}; fi

if [ "$mode" = prepare ]; then
  mkdir -p "$out"
  "$dlrec" datagen --out "$out/logs.tsv" --rows 20000 --seed 3
  "$dlrec" etl --input "$out/logs.tsv" --out "$out/data" --overwrite
  for m in $models; do
    r=$out/$m
    rm -rf "$r"
    "$dlrec" train --config "$configs/$m.json" --data "$out/data" --run "$r/run" \
      --device cpu --batch-size 1024 --max-steps 2
    "$dlrec" export --run "$r/run" --out "$r/bf16"
    "$dlrec" compress --run "$r/run" --out "$r/pruned" --skip-incompatible
    "$dlrec" export --run "$r/pruned" --out "$r/sparse24"
    "$dlrec" compress --run "$r/run" --out "$r/int8" --quantize --calibration max \
      --calib-batches 1 --calib-batch-size 2048
    "$dlrec" compress --run "$r/pruned" --out "$r/sparse24_int8" --quantize --calibration max \
      --calib-batches 1 --calib-batch-size 2048
    rm -rf "$r/run" "$r/pruned"
  done
  exit 0
fi

[ "$mode" = run ] || [ "$mode" = breakdown ] || [ "$mode" = small ] ||
  { echo "mode: prepare, run, breakdown or small" >&2; exit 2; }
batches=1,2048,32768 extra=() exports="bf16 sparse24 int8 sparse24_int8" policies=fastest
if [ "$mode" = breakdown ]; then batches=2048,32768 extra=(--breakdown) exports="bf16 sparse24_int8"; fi
if [ "$mode" = small ]; then batches=1,8 exports="bf16 int8 sparse24_int8" policies="fastest compressed"; fi
for m in $models; do
  for e in $exports; do
    for k in $policies; do
      [ "$e" = bf16 ] && [ "$k" = compressed ] && continue
      echo "=== $m $e --kernels $k"
      "$dlrec" bench infer --model "$out/$m/$e" --device cuda:0 --precision bf16 \
        --batch "$batches" --iters "$iters" --warmup 5 --kernels "$k" "${extra[@]}" 2>&1 |
        grep -v "^\[bench infer\] model ready" || echo "FAILED $m $e"
    done
  done
done
