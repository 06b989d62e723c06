#!/bin/bash
# dcn3 device call 2 (final): embedding bench, DCNv2 step vs PyTorch interleaved, tests, memcheck, DLRM.
B=.gpu-dcn3/bin
for f in $B/*.gz .gpu-dcn3/lib/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x $B/*
nvidia-smi > $OUT/gpu.txt 2>&1
T0=$(date +%s); ts() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DL="$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5"
PT="python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16"
OLD="env DLREC_EMB_BWD_OLD=1 DLREC_EMB_FWD_OLD=1"
EB="$B/bench_embedding_cuda --iters 50"
{
ts "emb bench uniform default"; $EB
ts "emb bench uniform old (DLREC_EMB_BWD_OLD=1 DLREC_EMB_FWD_OLD=1)"; $OLD $EB
ts "emb bench uniform DLREC_EMB_PAIRS=0"; DLREC_EMB_PAIRS=0 $EB
ts "emb bench uniform DLREC_EMB_FWD_OLD=1"; DLREC_EMB_FWD_OLD=1 $EB
ts "emb bench uniform default"; $EB
ts "emb bench uniform old"; $OLD $EB
ts "emb bench zipf default"; $EB --zipf
ts "emb bench zipf old"; $OLD $EB --zipf
ts "emb bench uniform f32 gradient default"; $EB --f32-grad
} 2>&1 | tee $OUT/embbench.log
{
ts "dlrec default"; $DL
ts "pytorch"; $PT 2>&1 | grep -v -i "sparse"
ts "dlrec default"; $DL
ts "dlrec old embedding kernels"; $OLD $DL
ts "pytorch"; $PT 2>&1 | grep -v -i "sparse"
ts "dlrec default"; $DL
ts "dlrec old embedding kernels"; $OLD $DL
ts "dlrec DLREC_EMB_FWD_OLD=1"; DLREC_EMB_FWD_OLD=1 $DL
ts "dlrm bf16 32768 default"; $B/dlrec bench train --config configs/mlperf_dlrm.json --device cuda --batch 32768 --precision bf16 --steps 30 --warmup 5
ts "dlrm bf16 32768 old embedding kernels"; $OLD $B/dlrec bench train --config configs/mlperf_dlrm.json --device cuda --batch 32768 --precision bf16 --steps 30 --warmup 5
ts "profile default"; DLREC_PROFILE=1 $DL 2>&1 | grep -i "emb\|total\|x0\|h2d"
ts "end bench"
} 2>&1 | tee $OUT/bench.log
{
ts "test_embedding"; $B/test_embedding --gtest_filter='*Cuda*'
ts "test_embedding, old kernels"; $OLD $B/test_embedding --gtest_filter='EmbeddingCuda.*'
ts "test_model"; $B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*'
ts "test_parity"; $B/test_parity
ts end
} > $OUT/tests.log 2>&1
grep -a "^\[t+\|PASSED\|FAILED\|tests ran" $OUT/tests.log
{
ts "memcheck embedding"; timeout 200 compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='EmbeddingCuda.*:GraphHashedCuda.*'
ts "memcheck graph"; DLREC_PARITY_STEPS=3 timeout 150 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Dcn*:GraphCuda.EmbeddingIntoConcat*:GraphCuda.DeviceTrainStep*:GraphCuda.WideDeepSgd*:DlrmCuda.AdagradMeanDotLossesMatchCpuEveryStep'
ts end
} > $OUT/memcheck.log 2>&1
grep -a "^\[t+\|PASSED\|FAILED\|ERROR SUMMARY\|tests ran" $OUT/memcheck.log
