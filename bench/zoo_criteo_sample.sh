#!/usr/bin/env bash
# The model zoo on the 10,000 real Criteo rows in ../shared/data (first 8,000 rows train, last
# 2,000 validate), like bench/criteo_sample.sh for DLRM: ETL with configs/etl_criteo.json, then
# each configs/criteo_sample_<model>.json trained with seeds 0-4; prints each run's validation
# AUC and "<model> mean AUC=<value>". bench/pytorch_zoo_criteo_sample.py is the peer.
# THREADS=N: dlrec --threads N (default 0: all cores).
# Recipe: the DLRM one of configs/criteo_sample.json (dim 16, batch 64, 4 epochs, SGD) except the
# learning rate, 0.1 instead of 0.3 for all four models. It was chosen without the validation
# rows: `pytorch_zoo_criteo_sample.py --holdout --lr X` (train rows 0-5,999, holdout rows
# 6,000-7,999, 5 seeds) over X in {0.3, 0.1, 0.03}: 0.1 was the best holdout AUC for Wide&Deep
# and parallel DCNv2 and within 0.005 of the best for DCNv2 and DeepFM, while 0.3 made DCNv2
# diverge (NaN) for seed 1 on the 8,000 training rows. bench/RESULTS.md has the figures.
# wide_deep_ftrl (not in the default list): Wide&Deep with the paper's optimizers, FTRL for the
# wide part and Adagrad for the rest (configs/criteo_sample_wide_deep_ftrl.json); its learning
# rates were chosen with the peer's --holdout, --wide-lr/--deep-lr (3 seeds; results-zoo.md).
#   bench/zoo_criteo_sample.sh [wide_deep dcnv2 dcnv2_parallel deepfm wide_deep_ftrl]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BIN=${DLREC_BIN:-$here/build/bin/dlrec}
DATA=${CRITEO_SAMPLE:-$here/../shared/data/criteo/day_0.part.tsv}
[ -f "$DATA" ] || { echo "criteo sample not found at $DATA" >&2; exit 2; }
[ -x "$BIN" ] || { echo "build first (make build): $BIN missing" >&2; exit 2; }
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(wide_deep dcnv2 dcnv2_parallel deepfm)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN" --quiet --threads "${THREADS:-0}" etl --input "$DATA" --workflow "$here/configs/etl_criteo.json" --train-rows 8000 \
  --out "$work/data"
for model in "${models[@]}"; do
  config="$here/configs/criteo_sample_$model.json"
  sum=0
  for seed in 0 1 2 3 4; do
    sed "s/\"seed\": 1234/\"seed\": $seed/" "$config" > "$work/config.json"
    grep -q "\"seed\": $seed" "$work/config.json" || { echo "cannot set the seed" >&2; exit 2; }
    "$BIN" --quiet --threads "${THREADS:-0}" train --config "$work/config.json" --data "$work/data" --run "$work/run_$model$seed" \
      > "$work/train.log"
    auc=$(grep -o 'AUC=[0-9.]*' "$work/train.log" | tail -1 | cut -d= -f2)
    echo "$model seed $seed: AUC=$auc"
    sum=$(python3 -c "print($sum + $auc)")
  done
  python3 -c "print('$model mean AUC=%.5f' % ($sum / 5))"
done
