set -u
cd "$(dirname "$0")/.."
for f in .gpu-infer2/lib/*.gz; do gunzip -f "$f"; done
source .gpu-infer2/env.sh
B=.gpu-infer2/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*' > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log; grep -E "FAILED|Failure|Expected|Which is|rows " $OUT/tests.log | head -20
r() { $B/dlrec bench infer --device cuda --precision bf16 --iters 500 --warmup 50 "$@" 2>&1 | grep -E "^bench infer:|infer timing|fused|rror" | sed 's/ iters=500//;s/ device=cuda:0 precision=bf16//;s/checksum=\(......\).*/checksum=\1/'; }
{
for rep in 1 2; do
echo "== fused default (<= 8 rows), rep $rep"; r --batch 1,2,8,64,2048,32768
echo "== fused off"; DLREC_INFER_FUSED=0 r --batch 1,2,8,64
done
echo "== fused rows 64"; DLREC_INFER_FUSED_ROWS=64 r --batch 9,16,32,64
for nb in 66 33; do echo "== blocks $nb"; DLREC_INFER_FUSED_BLOCKS=$nb DLREC_INFER_FUSED_ROWS=64 r --batch 1,8,64; done
echo "== timing fused"; DLREC_INFER_TIMING=1 r --batch 1
echo "== timing off"; DLREC_INFER_FUSED=0 DLREC_INFER_TIMING=1 r --batch 1
echo "== fp16 fused / off"; $B/dlrec bench infer --device cuda --precision fp16 --iters 300 --warmup 30 --batch 1,8 2>&1 | grep "^bench"; DLREC_INFER_FUSED=0 $B/dlrec bench infer --device cuda --precision fp16 --iters 300 --warmup 30 --batch 1,8 2>&1 | grep "^bench"
} 2>&1 | tee $OUT/bench.log
echo "== engine script"
BIN=$B timeout 120 bash bench/serve_gpu_e2e.sh engine
echo "== memcheck"
timeout 90 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='DlrmCuda.FusedSmallBatch*:DlrmCuda.PredictMatchesForward' > $OUT/memcheck.log 2>&1; echo "rc $?"; grep "ERROR SUMMARY" $OUT/memcheck.log; tail -4 $OUT/memcheck.log
