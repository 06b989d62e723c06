#!/usr/bin/env bash
# INT8 inference on the CPU end to end (issue 21; bench/RESULTS.md "INT8 on the CPU"): the MLPerf
# DLRM architecture (bottom 512-256-128, top 1024-1024-512-256-1, dim 128) with small tables,
# trained briefly on generated rows, exported in fp32 (with model.onnx) and INT8 (PTQ,
# percentile 99.99), then `dlrec bench infer --device cpu` on both, alternating, and ONNX
# Runtime on the same model (fp32 and its own dynamic int8: bench/ort_infer_cpu.py) in the same
# call.
#
#   bash bench/cpu_infer_int8.sh [WORK_DIR] [BATCHES=1,256,2048] [ROUNDS=2]
#
# WORK_DIR (default: a temporary directory, removed at the end) keeps the data and models.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$here/build/bin/dlrec}
work=${1:-}
batches=${2:-1,256,2048}
rounds=${3:-2}
if [ -z "$work" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work"
cd "$work"
if [ ! -d int8 ]; then
  "$BIN" --quiet datagen --rows 300000 --seed 3 --out s.tsv
  "$BIN" --quiet etl --input s.tsv --workflow "$here/configs/etl_criteo.json" --valid-ratio 0.1 \
    --out data
  python3 - "$here/configs/mlperf_dlrm.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.pop("sharding", None)
c["optimizer"] = {"type": "sgd", "lr": 0.1}
c["train"] = {"batch_size": 2048, "eval_batch_size": 16384, "epochs": 1, "max_steps": 60,
              "log_every": 20, "device": "cpu", "seed": 1}
json.dump(c, open("cfg.json", "w"), indent=1)
PY
  "$BIN" --quiet train --config cfg.json --data data --run run
  "$BIN" --quiet export --run run --out fp32 --onnx
  "$BIN" --quiet compress --run run --out int8 --quantize --calibration percentile \
    --percentile 99.99 --calib-batches 2
fi
echo "commit $(git -C "$here" rev-parse --short HEAD), $(date -u '+%F %H:%M') UTC, $(nproc) CPUs"
for r in $(seq "$rounds"); do
  for m in fp32 int8; do
    "$BIN" bench infer --model "$m" --device cpu --batch "$batches" --iters 200 2>&1 |
      grep '^bench infer' | sed "s/^/round $r $m: /"
  done
done
python3 "$here/bench/ort_infer_cpu.py" --model fp32 --batch "$batches" --iters 200 2>&1 |
  grep -v -i warning
