#!/bin/bash
# Two dlrec builds and Polars on one Criteo TSV, in rotating order (issue 24's CPU peer).
#
#   bench/polars_etl_rotate.sh DLREC_BEFORE DLREC_AFTER DATA ROUNDS THREADS [WORKFLOW] [POLARS_SCRIPT]
#
# Each round runs `DLREC --threads T bench etl --data DATA --workflow WORKFLOW --repeat 1
# --valid-ratio 0.1` for both builds and `bench/polars_criteo_etl.py --threads T` (PYTHON,
# default python3, with polars 2.1: bench/requirements-polars.txt), the order rotating by one
# every round, and prints one line per run ("before|after|polars threads= seconds= MB/s=
# cpu_seconds= MB/cpu_s=", CPU = user + sys of all threads, getrusage) and the load. WORKFLOW
# defaults to configs/etl_criteo.json. Polars' output goes to TMPD (default a new folder under
# /tmp, removed at the end).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BEFORE=${1:?usage: $0 DLREC_BEFORE DLREC_AFTER DATA ROUNDS THREADS [WORKFLOW] [POLARS_SCRIPT]}
AFTER=${2:?}; DATA=${3:?}; R=${4:?}; T=${5:?}
WF=${6:-$ROOT/configs/etl_criteo.json}; PS=${7:-$ROOT/bench/polars_criteo_etl.py}
PY=${PYTHON:-python3}
if [ -n "${TMPD:-}" ]; then
  trap 'rm -rf "$TMPD/pout"' EXIT
else
  TMPD=$(mktemp -d /tmp/dlrec_polars_rotate.XXXXXX)
  trap 'rm -rf "$TMPD"' EXIT
fi
fields='s/.*(threads=[0-9]+) (seconds=[0-9.]+) (MB\/s=[0-9.]+).*(cpu_seconds=[0-9.]+) (MB\/cpu_s=[0-9.]+).*/\1 \2 \3 \4 \5/'
run() {
  case $1 in
    before | after)
      local b=$BEFORE
      [ "$1" = after ] && b=$AFTER
      "$b" --threads "$T" bench etl --data "$DATA" --workflow "$WF" --repeat 1 --valid-ratio 0.1 \
        2>/dev/null | grep '^bench etl: input' ;;
    polars)
      rm -rf "$TMPD/pout"
      "$PY" "$PS" --data "$DATA" --out "$TMPD/pout" --valid-ratio 0.1 --threads "$T" 2>&1 |
        grep '^polars etl' ;;
  esac | sed -E "$fields" | sed "s/^/$1 /"
}
order=(before after polars)
for i in $(seq 1 "$R"); do
  for k in 0 1 2; do run "${order[$(((i + k) % 3))]}"; done
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
done
