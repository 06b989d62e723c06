#!/bin/bash
# dcn4 device call 1: new tests, embedding bench checksums, DCNv2 step A/B (MLP mask bits, vectorized
# mask pass, early embedding ids) interleaved with PyTorch, profiles, suites, memcheck, DLRM.
B=.gpu-dcn4/bin
for f in $B/*.gz .gpu-dcn4/lib/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x $B/*
nvidia-smi > $OUT/gpu.txt 2>&1
T0=$(date +%s); ts() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DL="$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5"
PT="python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16"
{
ts "new tests"; timeout 120 $B/test_model --gtest_filter='GraphCuda.Bf16ReluBitMask*:GraphCuda.MlpMaskBits*'
ts "emb bench"; timeout 60 $B/bench_embedding_cuda --iters 50
} > $OUT/tests1.log 2>&1
grep -a "^\[t+\|OK \]\|FAILED\|Failure\|differ\|checksum" $OUT/tests1.log | head -40
run() { # label env...
  local l=$1; shift
  local o; o=$(env "$@" $DL 2>&1); echo "$o" >> $OUT/bench_full.log
  echo "$l: $(echo "$o" | grep -E 'ms/iter' | tail -1)"
}
{
for r in 1 2 3 4; do
  run "d default" X=1
  run "o old (MASK_BITS=0 BGRAD_VEC=0 IDS_EARLY=0)" DLREC_MLP_MASK_BITS=0 DLREC_BGRAD_VEC=0 DLREC_EMB_IDS_EARLY=0
  run "y MASK_BITS=0" DLREC_MLP_MASK_BITS=0
  run "i IDS_EARLY=0" DLREC_EMB_IDS_EARLY=0
  run "a IDS_EARLY=after" DLREC_EMB_IDS_EARLY=after
  run "l IDS_PRIO=low" DLREC_EMB_IDS_PRIO=low
  if [ $r != 4 ]; then ts pytorch; $PT 2>&1 | grep -E "ms/iter"; fi
done
ts "profiles"
for v in "d X=1" "y DLREC_MLP_MASK_BITS=0" "o DLREC_MLP_MASK_BITS=0 DLREC_BGRAD_VEC=0"; do
  set -- $v; l=$1; shift
  env "$@" DLREC_PROFILE=1 $DL --steps 12 --warmup 1 2>&1 | grep "profile\]" | sed "s/^/$l /"
done
ts "dlrm"
for v in "d X=1" "o DLREC_BGRAD_VEC=0" "d X=1" "o DLREC_BGRAD_VEC=0"; do
  set -- $v; l=$1; shift
  echo "dlrm $l: $(env "$@" $B/dlrec bench train --config configs/mlperf_dlrm.json --device cuda --batch 32768 --precision bf16 --steps 30 --warmup 5 2>&1 | grep ms/iter | tail -1)"
done
ts "end bench"
} > $OUT/bench.log 2>&1
grep -a -v "profile\]" $OUT/bench.log
grep -a "profile\]" $OUT/bench.log | grep -E "mask|emb|total" 
{
ts "test_model"; timeout 120 $B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*'
ts "test_embedding"; timeout 60 $B/test_embedding --gtest_filter='*Cuda*'
ts "test_parity"; timeout 60 $B/test_parity
ts "memcheck graph"; DLREC_PARITY_STEPS=3 timeout 120 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16ReluBitMask*:GraphCuda.MlpMaskBits*:GraphCuda.Bf16DcnStacked*:GraphCuda.EmbeddingIntoConcat*:GraphCuda.DeviceTrainStep*'
ts "memcheck embedding"; timeout 90 compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='EmbeddingCuda.*:GraphHashedCuda.*'
ts end
} > $OUT/tests2.log 2>&1
grep -a "^\[t+\|PASSED\|FAILED\|ERROR SUMMARY\|tests ran" $OUT/tests2.log
