#!/usr/bin/env bash
# ETL thread scaling: `dlrec bench etl` on one Criteo-shaped TSV at several thread counts.
#
#   bench/etl_scaling.sh DLREC_BIN [ROWS] [THREADS...]
#
# Generates ROWS (default 8000000) rows with `dlrec datagen --seed 7` into $WORK (default /tmp)
# unless DATA=file.tsv is given, then runs `dlrec --threads T bench etl --data FILE --repeat R`
# for each T (default 1 2 4 8 16; R = $REPEAT, default 3, or 2 for T <= 2). PEER=other_dlrec_bin
# adds that binary's run at the largest T (e.g. an older build, same file, same session).
# ALTERNATE=1 (with PEER) instead runs, at every T, R pairs of single runs (DLREC_BIN --repeat 1,
# then PEER --repeat 1), so both builds share the same minutes and neither times the deletion
# of a previous run's output; lines of PEER's runs start with "peer". ARGS="..." adds options
# to DLREC_BIN's `bench etl` runs only (e.g. ARGS="--cache-form compact").
set -euo pipefail
DLREC=${1:?usage: $0 DLREC_BIN [ROWS] [THREADS...]}
ROWS=${2:-8000000}
shift $(( $# >= 2 ? 2 : 1 ))
THREADS=("$@")
[ ${#THREADS[@]} -gt 0 ] || THREADS=(1 2 4 8 16)
WORK=${WORK:-/tmp}
echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "output file system: $(df -hT "$WORK" | tail -1)"
DATA=${DATA:-}
if [ -z "$DATA" ]; then
  DATA=$WORK/etl_scaling_${ROWS}.tsv
  [ -f "$DATA" ] || "$DLREC" datagen --rows "$ROWS" --seed 7 --out "$DATA" 2>/dev/null
fi
echo "input: $DATA ($(stat -c %s "$DATA") bytes)"
for t in "${THREADS[@]}"; do
  r=${REPEAT:-3}
  [ "$t" -le 2 ] && [ -z "${REPEAT:-}" ] && r=2
  if [ -n "${PEER:-}" ] && [ "${ALTERNATE:-0}" = 1 ]; then
    for ((i = 0; i < r; ++i)); do
      "$DLREC" --threads "$t" bench etl --data "$DATA" --repeat 1 --work-dir "$WORK" ${ARGS:-} 2>/dev/null
      "$PEER" --threads "$t" bench etl --data "$DATA" --repeat 1 --work-dir "$WORK" 2>/dev/null |
        sed 's/^/peer /'
    done
    continue
  fi
  "$DLREC" --threads "$t" bench etl --data "$DATA" --repeat "$r" --work-dir "$WORK" ${ARGS:-} 2>/dev/null
done
if [ -n "${PEER:-}" ] && [ "${ALTERNATE:-0}" != 1 ]; then
  t=${THREADS[-1]}
  echo "peer: $PEER"
  "$PEER" --threads "$t" bench etl --data "$DATA" --repeat "${REPEAT:-3}" --work-dir "$WORK" 2>/dev/null
fi
