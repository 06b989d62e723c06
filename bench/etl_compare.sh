#!/usr/bin/env bash
# ETL throughput: dlrec vs facebookresearch/dlrm's NumPy Criteo preprocessing on one file.
#
#   bench/etl_compare.sh DLRM_DIR [ROWS] [DLREC_BIN]
#
# DLRM_DIR: a checkout of https://github.com/facebookresearch/dlrm (data_utils.py is imported,
# not copied). ROWS (default 1000000) rows of Criteo-layout TSV are generated with
# `dlrec datagen --seed 7` (or set DATA=file.tsv to use a file). The peer runs first under
# $PEER_PYTHON (default: a virtual environment in $WORK/venv with NumPy < 2, created with pip
# when missing: dlrm keeps int(key, 16) in int32, which NumPy >= 2 rejects for keys >= 2^31),
# then `dlrec bench etl --data` on the same file ($REPEAT runs, default 3). Prints both lines
# and the ratio of the MB/s figures (dlrec best / peer).
set -euo pipefail
DLRM=${1:?usage: $0 DLRM_DIR [ROWS] [DLREC_BIN]}
ROWS=${2:-1000000}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DLREC=${3:-$ROOT/build/bin/dlrec}
WORK=${WORK:-/tmp/dlrec_etl_compare}
REPEAT=${REPEAT:-3}
mkdir -p "$WORK"
[ -x "$DLREC" ] || { echo "no dlrec binary at $DLREC (build first, or pass it)"; exit 1; }

DATA=${DATA:-}
if [ -z "$DATA" ]; then
  DATA=$WORK/criteo_${ROWS}.tsv
  [ -f "$DATA" ] || "$DLREC" datagen --rows "$ROWS" --seed 7 --out "$DATA" 2>/dev/null
fi

PEER_PYTHON=${PEER_PYTHON:-}
if [ -z "$PEER_PYTHON" ]; then
  if [ ! -x "$WORK/venv/bin/python" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q "numpy<2"
  fi
  PEER_PYTHON=$WORK/venv/bin/python
fi

echo "machine: $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "input: $DATA ($(stat -c %s "$DATA") bytes)"
PEER=$("$PEER_PYTHON" "$ROOT/bench/dlrm_numpy_peer.py" --dlrm "$DLRM" --data "$DATA" | tail -1)
echo "$PEER"
OURS=$("$DLREC" bench etl --data "$DATA" --repeat "$REPEAT" 2>/dev/null)
echo "$OURS"
peer_rate=$(echo "$PEER" | sed -n 's/.*MB\/s=\([0-9.]*\).*/\1/p')
best=$(echo "$OURS" | grep '^bench etl: input' | sed -n 's/.* MB\/s=\([0-9.]*\) .*/\1/p' | sort -g | tail -1)
python3 -c "print('ratio: dlrec %.1f MB/s / dlrm numpy %.2f MB/s = %.0fx' % ($best, $peer_rate, $best / $peer_rate))"
