#!/bin/bash
# dcn3 device call 1: embedding bench old/new, the DCNv2 step, PyTorch once, embedding tests.
B=.gpu-dcn3/bin
for f in $B/*.gz .gpu-dcn3/lib/*.gz; do [ -e "$f" ] && gunzip -f "$f"; done
chmod +x $B/*
nvidia-smi > $OUT/gpu.txt 2>&1
T0=$(date +%s); ts() { echo "[t+$(( $(date +%s) - T0 ))s] $*"; }
DL="$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5"
{
for v in 1 0 chunk 1 0; do ts "emb bench uniform DLREC_EMB_BWD_OLD=$v"; DLREC_EMB_BWD_OLD=$v $B/bench_embedding_cuda --iters 50; done
for v in 1 0; do ts "emb bench zipf DLREC_EMB_BWD_OLD=$v"; DLREC_EMB_BWD_OLD=$v $B/bench_embedding_cuda --iters 50 --zipf; done
ts "dlrec default"; $DL
ts "dlrec DLREC_EMB_BWD_OLD=1"; DLREC_EMB_BWD_OLD=1 $DL
ts "pytorch"; python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16 2>&1 | grep -v sparse_coo
ts "dlrec default"; $DL
ts "dlrec DLREC_EMB_BWD_OLD=1"; DLREC_EMB_BWD_OLD=1 $DL
ts "end bench"
} 2>&1 | tee $OUT/bench.log
{
ts "profile default"; DLREC_PROFILE=1 $DL 2>&1 | grep -i "emb\|total\|profile\]  *h2d"
ts "profile old"; DLREC_EMB_BWD_OLD=1 DLREC_PROFILE=1 $DL 2>&1 | grep -i "emb\|total"
} 2>&1 | tee $OUT/profile.log
{
ts "test_embedding"; $B/test_embedding --gtest_filter='*Cuda*' 2>&1 | tail -25
ts "test_embedding old path"; DLREC_EMB_BWD_OLD=1 $B/test_embedding --gtest_filter='EmbeddingCuda.*' 2>&1 | tail -8
ts "memcheck"; timeout 150 compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='EmbeddingCuda.*' 2>&1 | tail -8
ts end
} 2>&1 | tee $OUT/tests.log
