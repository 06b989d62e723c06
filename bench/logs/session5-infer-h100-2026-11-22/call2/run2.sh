set -u
cd "$(dirname "$0")/.."
for f in .gpu-infer2/lib/*.gz; do gunzip -f "$f"; done
source .gpu-infer2/env.sh
B=.gpu-infer2/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*' > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log; grep -E "FAILED|Failure|Expected|Which is|rows " $OUT/tests.log | head -20
timeout 60 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='DlrmCuda.FusedSmallBatch*:DlrmCuda.InstancesPredict*' > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"; grep "ERROR SUMMARY" $OUT/memcheck.log; tail -2 $OUT/memcheck.log
r() { $B/dlrec bench infer --device cuda --precision bf16 --iters 500 --warmup 50 "$@" 2>&1 | grep -E "^bench infer:|infer timing|fused|rror" | sed 's/ iters=500//;s/ device=cuda:0 precision=bf16//;s/checksum=\(......\).*/checksum=\1/'; }
{
for rep in 1 2; do
echo "== fused on, rep $rep"; DLREC_INFER_FUSED=1 r --batch 1,2,8,64
echo "== fused off"; DLREC_INFER_FUSED=0 r --batch 1,2,8,64
done
echo "== fused on, rows 64"; DLREC_INFER_FUSED=1 DLREC_INFER_FUSED_ROWS=64 r --batch 9,16,32,64
echo "== fused on, 66 blocks"; DLREC_INFER_FUSED=1 DLREC_INFER_FUSED_BLOCKS=66 r --batch 1,8
echo "== fused on, plain launch"; DLREC_INFER_FUSED=1 DLREC_INFER_FUSED_COOP=0 r --batch 1,8
echo "== timing fused"; DLREC_INFER_FUSED=1 DLREC_INFER_TIMING=1 r --batch 1
echo "== timing off"; DLREC_INFER_FUSED=0 DLREC_INFER_TIMING=1 r --batch 1
echo "== fp16 fused / off"; for f in 1 0; do DLREC_INFER_FUSED=$f $B/dlrec bench infer --device cuda --precision fp16 --iters 300 --warmup 30 --batch 1,8 2>&1 | grep "^bench" | sed "s/^/fused=$f /"; done
} 2>&1 | tee $OUT/bench.log
echo "== engine script, fused on"
DLREC_INFER_FUSED=1 BIN=$B timeout 110 bash bench/serve_gpu_e2e.sh engine
echo "== e2e, fused on"
mkdir -p $OUT/e2e
DLREC_INFER_FUSED=1 OUT=$OUT/e2e BIN=$B timeout 125 bash bench/serve_gpu_e2e.sh e2e
echo "e2e rc $?"
