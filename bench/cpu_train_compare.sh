#!/usr/bin/env bash
# CPU training throughput, dlrec vs PyTorch, in one run: DLRM of configs/dlrm_criteo.json
# (dim 16, bottom 13-512-256-64-16, top 512-256-1), batch 4096, the same thread count, the same
# optimizer, on in-memory batches (Criteo Kaggle cardinalities capped at 1M rows per table).
# usage: bench/cpu_train_compare.sh [threads] [steps]     (needs python3 with torch for the peer)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BENCH=${BENCH_TRAIN_CPU:-$here/../build/bin/bench_train_cpu}
threads=${1:-$(nproc)}
steps=${2:-40}
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for opt in sgd adagrad; do
  "$BENCH" --config "$here/../configs/dlrm_criteo.json" --threads "$threads" --batch 4096 \
    --steps "$steps" --warmup 5 --optimizer "$opt" | sed "s/^/[dlrec $opt] /"
  python3 "$here/pytorch_dlrm_cpu.py" --threads "$threads" --batch 4096 --steps "$steps" \
    --warmup 5 --optimizer "$opt" | sed "s/^/[pytorch $opt] /"
done
