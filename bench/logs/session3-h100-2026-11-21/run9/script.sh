set -u
O=/tmp/o; mkdir -p $O
B=.gpu/bin
$B/test_model --gtest_filter='DlrmCuda.Predict*:DlrmCuda.BadIds*:DlrmCuda.Instances*' > $O/tests.log 2>&1; echo "tests rc=$?"; grep -E "FAILED|PASSED" $O/tests.log | head -5
for K in 16 8 4 2; do DLREC_INFER_PACK_TASKS=$K DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 2048 --iters 500 --warmup 50 2>&1 | grep -E "^bench|timing" | sed "s/^/tasks $K: /"; done
for K in 16 8 4; do DLREC_INFER_PACK_TASKS=$K $B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep -E "^bench" | sed "s/^/tasks $K: /"; done
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch"
