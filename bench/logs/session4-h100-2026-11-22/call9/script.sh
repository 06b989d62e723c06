set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*' > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log; grep -E "FAILED|Failure" $OUT/tests.log | head
compute-sanitizer --tool memcheck $B/test_model --gtest_filter='DlrmCuda.SmallBatchInference*:DlrmCuda.PredictMatchesForward' > $OUT/memcheck.log 2>&1; tail -2 $OUT/memcheck.log; grep "ERROR SUMMARY" $OUT/memcheck.log
run() { $B/dlrec bench infer --device cuda --precision bf16 --iters 500 --warmup 50 "$@" 2>&1 | grep -E "^bench infer:|infer timing" | sed 's/ iters=500//;s/checksum=\(......\).*/checksum=\1/'; }
for i in 1 2; do
  run --batch 1,2,8,2048,32768
  echo "skinny off:"; DLREC_INFER_SKINNY=0 run --batch 1,2,8
done
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch"
DLREC_PROFILE=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 1 --iters 200 --warmup 20 2>&1 | grep "profile\]" | head -16
