set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*' 2>&1 | tail -5 > $OUT/tests.log
tail -3 $OUT/tests.log
$B/test_parity 2>&1 | tail -4 > $OUT/parity.log; tail -2 $OUT/parity.log
for i in 1 2; do
DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep -v "^\[progress" | tail -12
done
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch"
GRPC_THREADS=1 OUT=$OUT/e2e bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^bench|ready" | head -20
