#!/usr/bin/env bash
# The GPU cache tier on one GPU (issue 22; bench/RESULTS.md, "Tiered embedding store"): a DLRM
# whose tables are served through the GPU cache at FRACTION (default 0.1) of their rows over a
# complete tier that generates rows in host memory, against the same model with its tables
# fully on the GPU, for power-law ids of alpha 1.05 and 1.2, batches 1, 2048, 32768: hit rate,
# p50/p99, throughput, and whether the predictions were bit for bit equal
# (bench/serve_gpu_cache.cc). Binaries from $BIN (default .gpu/bin); logs under $OUT.
#   TABLES (8) x ROWS (4194304) x DIM (64): the tables' size (8.6 GB fp32 by default; both
#   models are on the GPU at once, so 2 x that plus the cache must fit it). EVICTION (lfu),
#   THRESHOLD (0.9: insert_threshold), ITERS (300; a tenth, at least 20, at batch 32768),
#   WARMUP (2000 batches of 2048 per alpha before timing: the 10 % cache fills after ~500 and
#   its hit rate settles after ~1500). BASELINE_ROWS (0: ROWS): rows per table of the all-GPU
#   model; set it lower for tables larger than the GPU (the comparison is then with that smaller
#   variant, on its own ids, and predictions are not compared). PHASES (0): 1 prints, per line,
#   the phases of the slowest 1 % of batches beside the median one's (GpuCache::keep_phases;
#   the record costs ~10-20 us of a batch of 2048). TIER (generated): "held" holds every row in
#   host memory instead (TABLES x ROWS x DIM x 4 bytes of RAM), as a host holding the tables.
set -euo pipefail
OUT=${OUT:-out}
BIN=${BIN:-.gpu/bin}
mkdir -p "$OUT"
"$BIN/serve_gpu_cache" --tables "${TABLES:-8}" --rows "${ROWS:-4194304}" --dim "${DIM:-64}" \
  --fraction "${FRACTION:-0.1}" --eviction "${EVICTION:-lfu}" --threshold "${THRESHOLD:-0.9}" \
  --iters "${ITERS:-300}" --warmup-batches "${WARMUP:-2000}" --alpha "${ALPHAS:-1.05,1.2}" \
  --batch "${BATCHES:-1,2048,32768}" --baseline-rows "${BASELINE_ROWS:-0}" --phases "${PHASES:-0}" \
  --tier "${TIER:-generated}" 2>&1 | tee "$OUT/serve_gpu_cache.log"
