#!/usr/bin/env bash
# Issue 21 accuracy: every compression variant of one model against its dense fp32 model, on one
# dataset, on the CPU engine. The protocol is the 1M-row one of bench/RESULTS.md ("QAT, 2:4
# fine-tuning, distillation and row-wise embeddings"):
#   dense      train the model (its config's epochs), export it (the teacher)
#   PTQ        dlrec compress --quantize, calibration max, percentile 99.9/99.99/99.999, entropy
#   fine-tunes each from a copy of the dense checkpoint, --ft-steps more steps, dense layers at
#              --ft-lr, embedding tables frozen (optimizer.embedding_lr 0):
#              control (no compression), 2:4 (dlrec compress --skip-incompatible), QAT,
#              QAT + distillation, 2:4 + QAT + distillation (teacher: the dense export)
#   tables     dlrec compress --embeddings int8 (fp32 and fp16 scale/bias) and int4, no fine-tune
# Prints one table (variant, AUC, delta vs dense, delta vs the fp32 fine-tune control) and writes
# it to WORK/results.tsv. AUCs: the training run's final validation (5 digits) or
# quant_report.json's validation (6 digits).
#
# Usage:
#   bench/compress_accuracy.sh --data ETL_DIR --config MODEL.json --work DIR
#       [--ft-steps 300] [--ft-lr 0.002] [--alpha 0.5] [--temperature 1]
#       [--variants dense,ptq,control,24,24_distill,qat,qat_distill,24_qat_distill,tables]
#       (24_distill, 2:4 fine-tuned with distillation and no QAT, runs only when asked)
#       [--calibrations "max percentile:99.9 percentile:99.99 percentile:99.999 entropy"]
#       [--seed N] [--bin build/bin/dlrec] [--keep]
# MODEL.json: a full training config (model, optimizer, train). ETL_DIR: `dlrec etl` output with a
# validation split. "dense" always runs first (or is reused if WORK/dense/checkpoint.dlrec and
# WORK/dense_model exist). WORK is deleted at the end unless --keep.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
BIN=$here/build/bin/dlrec
data="" config="" work="" ft_steps=300 ft_lr=0.002 alpha=0.5 temperature=1 seed=""
variants="dense,ptq,control,24,qat,qat_distill,24_qat_distill,tables" keep=0
calibrations="max percentile:99.9 percentile:99.99 percentile:99.999 entropy"
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --ft-steps) ft_steps=$2; shift 2 ;;
    --ft-lr) ft_lr=$2; shift 2 ;;
    --alpha) alpha=$2; shift 2 ;;
    --temperature) temperature=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --calibrations) calibrations=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[ -n "$data" ] && [ -n "$config" ] && [ -n "$work" ] || { echo "need --data, --config, --work" >&2; exit 2; }
[ -d "$data" ] || { echo "no dataset at $data" >&2; exit 2; }
[ -f "$config" ] || { echo "no config at $config" >&2; exit 2; }
[ -x "$BIN" ] || { echo "build first: $BIN missing" >&2; exit 2; }
mkdir -p "$work"
[ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
results="$work/results.tsv"
touch "$results"  # appended: a rerun with a reused dense run adds its rows
log() { echo "[compress_accuracy $(date -u +%H:%M:%S)] $*" >&2; }
has() { case ",$variants," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }

# config.json edits: python3 merges a JSON patch into a config (objects recursively).
merge() {  # merge IN OUT PATCH_JSON
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
src, out, patch = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
cfg = json.load(open(src))
def merge(a, b):
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(a.get(k), dict):
            merge(a[k], v)
        else:
            a[k] = v
merge(cfg, patch)
json.dump(cfg, open(out, "w"), indent=1)
PY
}
last_auc() { grep -o 'AUC=[0-9.]*' "$1" | tail -1 | cut -d= -f2; }
report_auc() {  # report_auc MODEL_DIR key  -> validation.<key>.auc with 6 digits
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['validation']; print('%.6f' % r[sys.argv[2]]['auc'])" \
    "$1/quant_report.json" "$2"
}
record() { printf '%s\t%s\n' "$1" "$2" >> "$results"; log "$1: AUC $2"; }

dense_cfg="$work/dense.json"
if [ -n "$seed" ]; then merge "$config" "$dense_cfg" "{\"train\": {\"seed\": $seed}}"; else cp "$config" "$dense_cfg"; fi
if [ -f "$work/dense/checkpoint.dlrec" ] && [ -d "$work/dense_model" ] && [ -f "$work/dense.auc" ]; then
  log "reusing $work/dense"
else
  log "dense: training"
  start=$(date +%s)
  "$BIN" train --config "$dense_cfg" --data "$data" --run "$work/dense" > "$work/dense.log" 2>&1
  log "dense: $(( $(date +%s) - start )) s"
  "$BIN" export --run "$work/dense" --out "$work/dense_model" > /dev/null
  last_auc "$work/dense.log" > "$work/dense.auc"
fi
dense_auc=$(cat "$work/dense.auc")
record dense "$dense_auc"
# The dense run's last step: fine-tunes stop at dense + ft_steps.
dense_steps=$(grep -o 'trained: steps=[0-9]*' "$work/dense.log" | tail -1 | grep -o '[0-9]*$' || true)
[ -n "$dense_steps" ] || { echo "cannot read the dense run's step count" >&2; exit 2; }
dense_epochs=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['train'].get('epochs', 1))" "$dense_cfg")
steps_per_epoch=$(( (dense_steps + dense_epochs - 1) / dense_epochs ))
log "dense: $dense_steps steps ($dense_epochs epochs), AUC $dense_auc"

if has ptq; then
  for calib in $calibrations; do
    name=${calib%%:*} args=(--calibration "${calib%%:*}")
    [ "$name" = percentile ] && { args+=(--percentile "${calib#*:}"); name="percentile_${calib#*:}"; }
    "$BIN" compress --run "$work/dense" --out "$work/ptq_$name" --quantize "${args[@]}" \
      > "$work/ptq_$name.log" 2>&1
    [ -s "$work/dense6.auc" ] || report_auc "$work/ptq_$name" fp32 > "$work/dense6.auc"
    record "ptq_$name" "$(report_auc "$work/ptq_$name" int8)"
    rm -rf "$work/ptq_$name"
  done
fi

if has tables; then
  for t in int8:fp32 int8:fp16 int4:fp32; do
    "$BIN" compress --run "$work/dense" --out "$work/emb" --embeddings "${t%%:*}" \
      --embedding-scale "${t#*:}" > "$work/emb_${t%%:*}_${t#*:}.log" 2>&1
    [ -s "$work/dense6.auc" ] || report_auc "$work/emb" fp32 > "$work/dense6.auc"
    record "tables_${t%%:*}_${t#*:}" "$(report_auc "$work/emb" int8)"
    rm -rf "$work/emb"
  done
fi

# One fine-tune: finetune NAME SOURCE_RUN PATCH_JSON. The run starts from SOURCE_RUN's checkpoint
# (and its config, which carries a 2:4 section after `dlrec compress`).
finetune() {
  local name=$1 src=$2 patch=$3 run="$work/$1"
  rm -rf "$run"; mkdir -p "$run"
  cp "$src/checkpoint.dlrec" "$run/"
  local base="$dense_cfg"; [ -f "$src/config.json" ] && [ "$src" != "$work/dense" ] && base="$src/config.json"
  # epochs: enough more that max_steps, not the epoch count, ends the fine-tune.
  merge "$base" "$run.cfg.json" "{\"train\": {\"max_steps\": $((dense_steps + ft_steps)),
    \"epochs\": $((dense_epochs + (ft_steps + steps_per_epoch - 1) / steps_per_epoch + 1))},
    \"optimizer\": {\"lr\": $ft_lr, \"embedding_lr\": 0}}"
  merge "$run.cfg.json" "$run.cfg.json" "$patch"
  local start; start=$(date +%s)
  "$BIN" train --config "$run.cfg.json" --data "$data" --run "$run" --resume > "$run.log" 2>&1
  log "$name: $(( $(date +%s) - start )) s"
  record "$name" "$(last_auc "$run.log")"
  rm -rf "$run"
}
distill="{\"teacher\": \"$work/dense_model\", \"alpha\": $alpha, \"temperature\": $temperature}"
has control && finetune control "$work/dense" '{}'
if has 24 || has 24_distill || has 24_qat_distill; then
  "$BIN" compress --run "$work/dense" --out "$work/pruned" --skip-incompatible > "$work/pruned.log" 2>&1
  has 24 && finetune 24 "$work/pruned" '{}'
  has 24_distill && finetune 24_distill "$work/pruned" "{\"compress\": {\"distill\": $distill}}"
  has 24_qat_distill && finetune 24_qat_distill "$work/pruned" \
    "{\"compress\": {\"qat\": {}, \"distill\": $distill}}"
fi
has qat && finetune qat "$work/dense" '{"compress": {"qat": {}}}'
has qat_distill && finetune qat_distill "$work/dense" "{\"compress\": {\"qat\": {}, \"distill\": $distill}}"

if [ -s "$work/dense6.auc" ]; then record dense_6digits "$(cat "$work/dense6.auc")"; fi
python3 - "$results" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
auc = {k: float(v) for k, v in rows}  # a rerun's rows replace earlier ones
rows = list(dict(rows).items())
ctrl = auc.get("control")
print("| variant | AUC | delta vs dense | delta vs fp32 fine-tune |")
print("|---|---|---|---|")
for k, v in rows:
    # PTQ and tables: against the compress report's own fp32 AUC (6 digits); fine-tunes: against
    # the dense training log's (5 digits, as theirs).
    ref = auc.get("dense_6digits", auc["dense"]) if k.startswith(("ptq_", "tables_")) else auc["dense"]
    d = "" if k.startswith("dense") else "%+.6f" % (float(v) - ref)
    c = "%+.5f" % (float(v) - ctrl) if ctrl is not None and k in (
        "24", "24_distill", "qat", "qat_distill", "24_qat_distill") else ""
    print("| %s | %s | %s | %s |" % (k, v, d, c))
PY
