#!/usr/bin/env bash
# ETL across processes: `dlrec etl` as one process, then under `mpirun -np N` for each N, on one
# Criteo-shaped TSV (docs/ETL.md "Several processes"); checks that every run's output is the
# single-process run's, byte for byte.
#
#   bench/etl_ranks_scaling.sh DLREC_BIN [ROWS] [RANKS...]
#
# Generates ROWS (default 8000000) rows with `dlrec datagen --seed 7` into $WORK (default /tmp)
# unless DATA=file.tsv is given. RANKS default: 1 2 4 8 16 32 64 up to the core count (1 is
# the plain single-process run, no mpirun). Each configuration runs REPEAT times (default 3);
# printed per run: the wall seconds of the whole command (mpirun's start included), MB/s of
# input, and for N > 1 the parse phase's seconds (rank 0's "etl: N processes parsed" line).
# MPIRUN_ARGS adds options to mpirun (default: --oversubscribe --bind-to none, and
# --allow-run-as-root as root). THREADS=T passes `--threads T` to every rank (default: all
# cores on each). ARGS="..." adds `dlrec etl` options.
# Where the statistics are merged (docs/ETL.md "Several processes") each file is written by the
# rank holding most of its rows: ARGS="--shard-rows 131072" gives the ranks files of their own.
# For the 64-core figure of issue 19 on a lent x4 host (its CPUs):
#   bash bench/etl_ranks_scaling.sh build/bin/dlrec 32000000 1 2 4 8 16 32 64
set -euo pipefail
DLREC=${1:?usage: $0 DLREC_BIN [ROWS] [RANKS...]}
ROWS=${2:-8000000}
shift $(( $# >= 2 ? 2 : 1 ))
RANKS=("$@")
CORES=$(nproc)
if [ ${#RANKS[@]} -eq 0 ]; then
  for n in 1 2 4 8 16 32 64; do [ "$n" -le "$CORES" ] && RANKS+=("$n"); done
fi
WORK=${WORK:-/tmp}
REPEAT=${REPEAT:-3}
MPIRUN=${MPIRUN:-mpirun}
DEFAULT_MPI_ARGS="--oversubscribe --bind-to none"
[ "$(id -u)" = 0 ] && DEFAULT_MPI_ARGS+=" --allow-run-as-root"
MPIRUN_ARGS=${MPIRUN_ARGS:-$DEFAULT_MPI_ARGS}
THREAD_ARGS=""
[ -n "${THREADS:-}" ] && THREAD_ARGS="--threads $THREADS"
echo "machine: $CORES cores, $(lscpu | sed -n 's/^Model name: *//p'); $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "commit: $(git -C "$(dirname "$0")" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "output file system: $(df -hT "$WORK" | tail -1)"
DATA=${DATA:-}
if [ -z "$DATA" ]; then
  DATA=$WORK/etl_ranks_${ROWS}.tsv
  [ -f "$DATA" ] || "$DLREC" datagen --rows "$ROWS" --seed 7 --out "$DATA" 2>/dev/null
fi
BYTES=$(stat -c %s "$DATA")
echo "input: $DATA ($BYTES bytes)"
OUT=$WORK/etl_ranks_out.$$
REF=$WORK/etl_ranks_ref.$$
trap 'rm -rf "$OUT" "$REF"' EXIT
for n in "${RANKS[@]}"; do
  for ((i = 0; i < REPEAT; ++i)); do
    rm -rf "$OUT"
    if [ "$n" = 1 ]; then
      cmd=("$DLREC" $THREAD_ARGS etl --input "$DATA" --out "$OUT" ${ARGS:-})
    else
      cmd=("$MPIRUN" -np "$n" $MPIRUN_ARGS "$DLREC" $THREAD_ARGS etl --input "$DATA"
           --out "$OUT" ${ARGS:-})
    fi
    t0=$(date +%s.%N)
    log=$("${cmd[@]}" 2>&1)
    t1=$(date +%s.%N)
    parse=$(echo "$log" | sed -n 's/^etl: .* processes parsed .* in \([0-9.]*\)s (rank 0.s part \([0-9.]*\)s)$/\1 (own part \2)/p')
    line=$(echo "$log" | grep '^etl: train=' || true)
    sec=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')
    printf 'ranks=%d run=%d wall=%.2fs %.1f MB/s parse=%ss | %s\n' "$n" "$i" "$sec" \
      "$(awk -v b="$BYTES" -v s="$sec" 'BEGIN { printf "%.1f", b / 1e6 / s }')" "${parse:--}" "$line"
    if [ ! -d "$REF" ]; then
      mv "$OUT" "$REF"
    elif ! diff -r -q "$REF" "$OUT" >/dev/null; then
      echo "ERROR: ranks=$n run=$i: the output differs from the first run's" >&2
      diff -r -q "$REF" "$OUT" >&2 || true
      exit 1
    fi
  done
done
echo "every output identical to the first run's (ranks=${RANKS[0]})"
