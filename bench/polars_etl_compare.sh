#!/usr/bin/env bash
# dlrec vs Polars on the Criteo ETL of configs/etl_criteo.json (issue 24's CPU peer).
#
#   bench/polars_etl_compare.sh DLREC_BIN [ROWS] [PAIRS]
#
# Generates ROWS (default 2,000,000) rows with `dlrec datagen --seed 7` (or DATA=file.tsv), runs
# bench/polars_criteo_etl.py and `dlrec bench etl --workflow configs/etl_criteo.json` on it
# alternately, PAIRS times (default 5; the order flips every pair), both with valid ratio 0.1
# and all cores, then checks once that the two outputs agree (bench/polars_compare.py) and prints
# the medians: MB/s (wall) and MB per CPU second (user + sys of all threads) of each, and
# dlrec's ratio to Polars on both. PYTHON (default python3) must have polars
# (bench/requirements-polars.txt), numpy and pyarrow. WORK (default a new folder under /tmp)
# holds the data and outputs; it is removed at the end unless KEEP=1.
set -euo pipefail
DLREC=${1:?usage: $0 DLREC_BIN [ROWS] [PAIRS]}
ROWS=${2:-2000000}
PAIRS=${3:-5}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d /tmp/dlrec_polars_compare.XXXXXX)}
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"
DATA=${DATA:-$WORK/criteo_$ROWS.tsv}
[ -f "$DATA" ] || "$DLREC" datagen --rows "$ROWS" --seed 7 --out "$DATA" >/dev/null 2>&1
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "input: $DATA ($(stat -c %s "$DATA") bytes)"

ours() {
  "$DLREC" bench etl --data "$DATA" --workflow "$ROOT/configs/etl_criteo.json" --repeat 1 \
    --valid-ratio 0.1 2>/dev/null | grep '^bench etl: input' | tee -a "$WORK/dlrec.txt"
}
peer() {
  rm -rf "$WORK/polars_out"
  "$PYTHON" "$ROOT/bench/polars_criteo_etl.py" --data "$DATA" --out "$WORK/polars_out" \
    --valid-ratio 0.1 | tee -a "$WORK/polars.txt"
}
: > "$WORK/dlrec.txt"
: > "$WORK/polars.txt"
for i in $(seq 1 "$PAIRS"); do
  if [ $((i % 2)) = 1 ]; then ours; peer; else peer; ours; fi
done

# The outputs agree (one dlrec etl into a folder the comparison can read).
"$DLREC" etl --input "$DATA" --workflow "$ROOT/configs/etl_criteo.json" --valid-ratio 0.1 \
  --out "$WORK/dlrec_out" --overwrite >/dev/null 2>&1
"$PYTHON" "$ROOT/bench/polars_compare.py" "$WORK/dlrec_out" "$WORK/polars_out"

"$PYTHON" - "$WORK/dlrec.txt" "$WORK/polars.txt" <<'PY'
import re, statistics, sys
def figures(path):
    rows = [dict(re.findall(r"(MB/s|MB/cpu_s|cpu_seconds|seconds)=([0-9.]+)", l)) for l in open(path)]
    return {k: statistics.median(float(r[k]) for r in rows) for k in ("seconds", "MB/s", "cpu_seconds", "MB/cpu_s")}, len(rows)
d, n = figures(sys.argv[1])
p, _ = figures(sys.argv[2])
print(f"medians of {n} runs each: dlrec {d['seconds']:.2f} s, {d['MB/s']:.1f} MB/s, {d['cpu_seconds']:.2f} CPU s, "
      f"{d['MB/cpu_s']:.1f} MB/cpu_s; Polars {p['seconds']:.2f} s, {p['MB/s']:.1f} MB/s, "
      f"{p['cpu_seconds']:.2f} CPU s, {p['MB/cpu_s']:.1f} MB/cpu_s")
print(f"dlrec / Polars: wall {d['MB/s'] / p['MB/s']:.2f}x, per CPU second {d['MB/cpu_s'] / p['MB/cpu_s']:.2f}x")
PY
