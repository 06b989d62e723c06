#!/bin/bash
# dcn4 device call 2: tests; DCNv2 step (defaults, 30 steps) vs PyTorch; A/B at 100 steps:
# early embedding ids (default) vs in the backward, vectorized mask pass vs scalar, mask from the
# cuBLASLt bits (opt-in, not bit-identical) vs y; profiles; DLRM; memcheck.
B=.gpu-dcn4/bin
for f in $B/*.gz .gpu-dcn4/lib/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x $B/*
nvidia-smi > $OUT/gpu.txt 2>&1
T0=$(date +%s); ts() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DLB="$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16"
DL="$DLB --steps 30 --warmup 5"
DL100="$DLB --steps 100 --warmup 5"
PT="python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16"
{
ts "new tests"; timeout 120 $B/test_model --gtest_filter='GraphCuda.Bf16ReluBitMask*:GraphCuda.MlpMaskBits*'
ts "emb bench"; timeout 60 $B/bench_embedding_cuda --iters 50
} > $OUT/tests1.log 2>&1
grep -a "^\[t+\|OK \]\|FAILED\|Failure\|differ\|checksum\|Which is" $OUT/tests1.log | head -40
run() { # label cmd env...
  local l=$1 c=$2; shift 2
  local o; o=$(env "$@" $c 2>&1); echo "== $l" >> $OUT/bench_full.log; echo "$o" >> $OUT/bench_full.log
  echo "$l: $(echo "$o" | grep -E 'ms/iter' | tail -1 | grep -o 'ms/iter=[0-9.]*')"
}
{
for r in 1 2 3; do
  run "d30 default" "$DL" X=1
  ts pytorch; $PT 2>&1 | grep -E "ms/iter"
done
for r in 1 2 3 4 5 6; do
  run "d100 default" "$DL100" X=1
  run "i100 IDS_EARLY=0" "$DL100" DLREC_EMB_IDS_EARLY=0
  run "v100 BGRAD_VEC=0" "$DL100" DLREC_BGRAD_VEC=0
  run "b100 MASK_BITS=1" "$DL100" DLREC_MLP_MASK_BITS=1
done
ts "profiles"
for v in "d X=1" "b DLREC_MLP_MASK_BITS=1" "v DLREC_BGRAD_VEC=0" "d X=1" "b DLREC_MLP_MASK_BITS=1" "v DLREC_BGRAD_VEC=0"; do
  set -- $v; l=$1; shift
  env "$@" DLREC_PROFILE=1 $DLB --steps 12 --warmup 1 2>&1 | grep "profile\]" | sed "s/^/$l /"
done
ts "dlrm"
for v in "d X=1" "v DLREC_BGRAD_VEC=0" "d X=1" "v DLREC_BGRAD_VEC=0" "d X=1" "v DLREC_BGRAD_VEC=0"; do
  set -- $v; l=$1; shift
  run "dlrm $l" "$B/dlrec bench train --config configs/mlperf_dlrm.json --device cuda --batch 32768 --precision bf16 --steps 100 --warmup 5" "$@"
done
ts "end bench"
} > $OUT/bench.log 2>&1
grep -a -v "profile\]" $OUT/bench.log
grep -a "profile\]" $OUT/bench.log | grep -E "mask|emb|total"
{
ts "test_model"; timeout 150 $B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*'
ts "test_embedding"; timeout 60 $B/test_embedding --gtest_filter='*Cuda*'
ts "test_parity"; timeout 60 $B/test_parity
ts "memcheck graph"; DLREC_PARITY_STEPS=3 timeout 150 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16ReluBitMask*:GraphCuda.MlpMaskBits*:GraphCuda.Bf16DcnStacked*:GraphCuda.EmbeddingIntoConcat*:GraphCuda.DeviceTrainStep*'
ts "memcheck embedding"; timeout 90 compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='EmbeddingCuda.*:GraphHashedCuda.*'
ts end
} > $OUT/tests2.log 2>&1
grep -a "^\[t+\|PASSED\|FAILED\|ERROR SUMMARY\|tests ran" $OUT/tests2.log
