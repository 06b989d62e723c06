#!/usr/bin/env bash
# CPU training throughput, dlrec vs PyTorch, in one run: DLRM of configs/dlrm_criteo.json
# (dim 16, bottom 13-512-256-64-16, top 512-256-1), batch 4096, the same thread count, the same
# optimizer, on in-memory batches (Criteo Kaggle cardinalities capped at 1M rows per table).
# usage: bench/cpu_train_compare.sh [threads] [steps]     (needs python3 with torch for the peer)
# (The figures in bench/RESULTS.md were taken with bench_train_cpu, since folded into
# `dlrec bench train`: the same model, batches and timing loop.)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DLREC=${DLREC_BIN:-$here/../build/bin/dlrec}
threads=${1:-$(nproc)}
steps=${2:-40}
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for opt in sgd adagrad; do
  "$DLREC" --threads "$threads" bench train --config "$here/../configs/dlrm_criteo.json" \
    --device cpu --batch 4096 --steps "$steps" --warmup 5 --batches 32 --dist zipf \
    --max-rows 1000000 --optimizer "$opt" --lr 0.02 | sed "s/^/[dlrec $opt] /"
  python3 "$here/pytorch_dlrm_cpu.py" --threads "$threads" --batch 4096 --steps "$steps" \
    --warmup 5 --optimizer "$opt" | sed "s/^/[pytorch $opt] /"
done
