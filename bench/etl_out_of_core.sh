#!/usr/bin/env bash
# Out-of-core ETL: a ~20 GB Criteo-layout TSV whose 26 categorical columns draw from 10M
# values each (bench/etl_out_of_core_datagen.json: 76.5M rows, Zipf 0.9), processed with a
# memory budget, peak RSS measured by /usr/bin/time -v; then the same file without a budget
# (vocabulary counts all in memory) and a byte comparison of the two outputs.
#
#   bench/etl_out_of_core.sh [DLREC_BIN] [BUDGET_MB]
#
# WORK (default /tmp/dlrec_etl_ooc) needs ~60 GB free: input 20 GB, two outputs of ~12 GB,
# spill files. SKIP_INMEMORY=1 skips the in-memory run (it needs ~8 GB of RAM); KEEP=1 keeps
# the files; ROWS=N overrides the row count (a smaller test).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DLREC=${1:-$ROOT/build/bin/dlrec}
BUDGET=${2:-1500}
WORK=${WORK:-/tmp/dlrec_etl_ooc}
mkdir -p "$WORK"
DATA=$WORK/big.tsv
CFG=$ROOT/bench/etl_out_of_core_datagen.json
if [ -n "${ROWS:-}" ]; then
  CFG=$WORK/datagen.json
  sed "s/\"rows\": [0-9]*/\"rows\": $ROWS/" "$ROOT/bench/etl_out_of_core_datagen.json" > "$CFG"
  DATA=$WORK/big_$ROWS.tsv
fi
WF=$ROOT/bench/etl_criteo_workflow.json
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GB RAM; $(date -u '+%Y-%m-%d %H:%M UTC')"
if [ ! -f "$DATA" ]; then
  "$DLREC" datagen --config "$CFG" --out "$DATA" 2>/dev/null
fi
echo "input: $DATA ($(stat -c %s "$DATA") bytes)"

run() {  # run NAME EXTRA_ARGS...
  local name=$1; shift
  rm -rf "$WORK/$name"
  /usr/bin/time -v "$DLREC" etl --input "$DATA" --workflow "$WF" --out "$WORK/$name" "$@" \
    2> "$WORK/$name.time" | grep '^etl:'
  grep -E "Maximum resident set size|Elapsed \(wall" "$WORK/$name.time" | sed 's/^\s*/  /'
}

echo "== budget ${BUDGET} MB"
run budget --memory-budget "$BUDGET"
rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/budget.time")
echo "peak RSS with the budget: $((rss / 1024)) MB"
python3 - "$WORK/budget/stats.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
d = [c["distinct_values"] for c in s["columns"]["categorical"]]
v = [c["vocab_size"] for c in s["columns"]["categorical"]]
print(f"distinct values per column: min {min(d)}, max {max(d)}, total {sum(d)}; "
      f"vocabulary (>= 15): total {sum(v)}")
EOF

if [ "${SKIP_INMEMORY:-0}" != 1 ]; then
  echo "== no budget (in memory)"
  run memory
  same=1
  for f in $(cd "$WORK/memory" && ls); do
    cmp -s "$WORK/memory/$f" "$WORK/budget/$f" || { echo "DIFFERS: $f"; same=0; }
  done
  [ "$(ls "$WORK/memory" | wc -l)" = "$(ls "$WORK/budget" | wc -l)" ] || same=0
  [ $same = 1 ] && echo "outputs identical (every shard, workflow.json, stats.json, dataset.json)"
fi
if [ "${KEEP:-0}" != 1 ]; then rm -rf "$WORK/budget" "$WORK/memory"; fi
