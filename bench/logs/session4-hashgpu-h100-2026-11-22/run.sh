#!/usr/bin/env bash
# hashgpu device run: tests, memcheck, training throughput hashed vs plain tables.
# usage: run.sh [tests|bench|all]
set -u
what=${1:-all}
D=$(cd "$(dirname "$0")" && pwd)
source "$D/env.sh"
B=$D/bin
nvidia-smi -L
if [[ $what != bench ]]; then
  timeout 120 $B/test_embedding --gtest_filter='GraphHashedCuda.*:HashTableCuda.*' > $OUT/test_embedding.log 2>&1; echo "test_embedding rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|\[hashed (parity|eviction|bf16|tf32)|OK \]|Failure|Expected|Which is|actual" $OUT/test_embedding.log | head -60
  [[ $what == all ]] && [[ -x $B/test_model ]] && timeout 70 $B/test_model --gtest_filter='GraphCuda.*' > $OUT/test_model.log 2>&1; echo "test_model rc=$?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/test_model.log | head -20
  DLREC_PARITY_STEPS=6 timeout 60 compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='GraphHashedCuda.*' > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -8
fi
if [[ $what != tests ]]; then
  sed 's/, *"hashed": {[^}]*}//' configs/dlrm_hashed.json > /tmp/plain_small.json
  sed 's/, *"hashed": {[^}]*}//' configs/dlrm_hashed_large.json > /tmp/plain_large.json
  grep -c hashed /tmp/plain_small.json /tmp/plain_large.json
  bt() { timeout 50 $B/dlrec bench train --device cuda "$@" 2>&1 | grep -E "bench train:|error" | tee -a $OUT/bench.log; }
  for dist in uniform zipf; do
    echo "== small (dlrm_hashed.json) bf16 batch 16384 dist $dist"
    bt --config configs/dlrm_hashed.json --precision bf16 --batch 16384 --dist $dist
    bt --config /tmp/plain_small.json --precision bf16 --batch 16384 --dist $dist
  done
  for dist in uniform zipf; do
    echo "== large (dlrm_hashed_large.json) bf16 batch 65536 batches 32 dist $dist"
    bt --config configs/dlrm_hashed_large.json --precision bf16 --batch 65536 --batches 32 --dist $dist
    bt --config /tmp/plain_large.json --precision bf16 --batch 65536 --batches 32 --dist $dist
  done
  echo "== fp32 small uniform"
  bt --config configs/dlrm_hashed.json --precision fp32 --batch 16384
  bt --config /tmp/plain_small.json --precision fp32 --batch 16384
  echo "== profile large uniform (no graphs)"
  DLREC_PROFILE=1 timeout 40 $B/dlrec bench train --device cuda --config configs/dlrm_hashed_large.json --precision bf16 --batch 65536 --batches 32 --steps 10 2>&1 | grep -E "profile|bench train:"
fi
