#!/usr/bin/env bash
# Issue 21 accuracy on the 10,000-row Criteo sample (../shared/data): bench/compress_accuracy.sh
# on DLRM (configs/criteo_sample.json) and DCNv2 (the same training settings, DCNv2 small's
# model), several seeds each, since AUC on 2,000 validation rows is noisy. ETL as
# bench/criteo_sample.sh: first 8,000 rows train, last 2,000 validate. Fine-tunes (tables
# frozen): by default 125 steps (one epoch of batch 64) at lr 0.03 (a tenth of the training
# lr); `--ft-steps 500 --ft-lr 0.3` runs the training schedule again, as NVIDIA's ASP recipe
# retrains a 2:4-pruned model (bench/RESULTS.md compares the recipes).
# Usage: bench/compress_accuracy_criteo.sh [--seeds "1234 1 2"] [--ft-steps 125] [--ft-lr 0.03]
#        [--bin build/bin/dlrec] [--models "dlrm dcnv2"] [--variants LIST]
#        [--alpha A] [--temperature T] (the last three passed to compress_accuracy.sh)
# Prints each run's table, then per variant the mean delta vs dense, its standard error over
# the seeds and its min/max.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BIN=$here/build/bin/dlrec
DATA=$here/../shared/data/criteo/day_0.part.tsv
seeds="1234 1 2"
ft_steps=125 ft_lr=0.03
models="dlrm dcnv2" variants="" distill_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) seeds=$2; shift 2 ;;
    --ft-steps) ft_steps=$2; shift 2 ;;
    --ft-lr) ft_lr=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --alpha|--temperature) distill_args+=("$1" "$2"); shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -f "$DATA" ] || { echo "SKIP: criteo sample not found at $DATA" >&2; exit 0; }
[ -x "$BIN" ] || { echo "build first: $BIN missing" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$BIN" --quiet etl --input "$DATA" --workflow "$here/configs/etl_criteo.json" --train-rows 8000 \
  --out "$work/data"
python3 - "$here/configs/criteo_sample.json" "$work/dcnv2.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["model"] = {"arch": "dcnv2", "embedding_dim": 16, "bottom_mlp": [64, 16],
              "top_mlp": [64, 32, 1], "cross_layers": 2, "cross_low_rank": 0}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
for model in $models; do
  config=$here/configs/criteo_sample.json
  [ "$model" = dcnv2 ] && config=$work/dcnv2.json
  for seed in $seeds; do
    echo "== $model seed $seed"
    bash "$here/bench/compress_accuracy.sh" --bin "$BIN" --data "$work/data" --config "$config" \
      --work "$work/$model.$seed" --keep --seed "$seed" --ft-steps "$ft_steps" --ft-lr "$ft_lr" \
      ${variants:+--variants "$variants"} ${distill_args[@]+"${distill_args[@]}"} 2>/dev/null
    cp "$work/$model.$seed/results.tsv" "$work/res.$model.$seed.tsv"
    rm -rf "$work/$model.$seed"
  done
done
python3 - "$work" "$models" $seeds <<'PY'
import sys, statistics
work, seeds = sys.argv[1], sys.argv[3:]
for model in sys.argv[2].split():
    runs = []
    for s in seeds:
        r = dict(l.rstrip("\n").split("\t") for l in open(f"{work}/res.{model}.{s}.tsv") if l.strip())
        runs.append({k: float(v) for k, v in r.items()})
    print(f"\n{model}: dense AUC over seeds {[round(r['dense'], 5) for r in runs]}")
    print("| variant | mean delta vs dense | standard error | min | max |")
    print("|---|---|---|---|---|")
    for k in runs[0]:
        if k.startswith("dense"):
            continue
        ref = "dense_6digits" if k.startswith(("ptq_", "tables_")) else "dense"
        d = [r[k] - r.get(ref, r["dense"]) for r in runs]
        se = statistics.stdev(d) / len(d) ** 0.5 if len(d) > 1 else float("nan")
        print(f"| {k} | {statistics.mean(d):+.5f} | {se:.5f} | {min(d):+.5f} | {max(d):+.5f} |")
PY
