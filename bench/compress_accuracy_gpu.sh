#!/usr/bin/env bash
# Issue 21 accuracy on one GPU: the compression fine-tunes of bench/compress_accuracy.sh trained
# by the CUDA graph engine in bf16 (2:4 masks, QAT and distillation in the training step), on
# the synthetic 4M-row data, for the DLRM small and DCNv2 small models of bench/RESULTS.md,
# each against its dense bf16 model of the same call.
#
# Usage: bench/compress_accuracy_gpu.sh WORK [--bin DLREC] [--rows 4000000] [--ft-steps 300]
#        [--variants dense,control,24,qat,qat_distill,24_qat_distill]
# Prints the two tables of compress_accuracy.sh and keeps each model's logs in WORK/<model>.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 1 ] || { echo "usage: $0 WORK [--bin DLREC] [--rows N] [--ft-steps N] [--variants V]" >&2; exit 2; }
work=$1; shift
BIN=$here/build/bin/dlrec rows=4000000 ft_steps=300 variants=dense,control,24,qat,qat_distill,24_qat_distill
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --ft-steps) ft_steps=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$work"
if [ ! -f "$work/data/dataset.json" ]; then
  "$BIN" datagen --rows "$rows" --seed 7 --out "$work/logs.tsv" > "$work/datagen.log" 2>&1
  "$BIN" etl --input "$work/logs.tsv" --workflow "$here/configs/etl_criteo.json" \
    --valid-ratio 0.1 --out "$work/data" --overwrite > "$work/etl.log" 2>&1
  rm -f "$work/logs.tsv"
fi
gpu='{"train": {"device": "cuda:0", "precision": "bf16"}}'
python3 - "$here/configs/dlrm_small.json" "$work/dlrm.json" "$work/dcnv2.json" "$gpu" <<'PY'
import json, sys
src, dlrm, dcn, gpu = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
cfg = json.load(open(src))
cfg["train"].update(gpu["train"])
json.dump(cfg, open(dlrm, "w"), indent=1)
cfg["model"] = {"arch": "dcnv2", "embedding_dim": 16, "bottom_mlp": [64, 16],
                "top_mlp": [64, 32, 1], "cross_layers": 2, "cross_low_rank": 0}
json.dump(cfg, open(dcn, "w"), indent=1)
PY
for m in dlrm dcnv2; do
  echo "== $m (bf16, one GPU)"
  bash "$here/bench/compress_accuracy.sh" --data "$work/data" --config "$work/$m.json" \
    --work "$work/$m" --bin "$BIN" --ft-steps "$ft_steps" --variants "$variants" --keep
done
