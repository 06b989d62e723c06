set -u
O=/tmp/o; mkdir -p $O
B=.gpu/bin
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*' > $O/tests.log 2>&1; echo "test_model rc=$?"; grep -E "FAILED|PASSED" $O/tests.log | head
$B/test_parity > $O/parity.log 2>&1; echo "test_parity rc=$?"; grep -E "FAILED|PASSED|dlrm_class" $O/parity.log | grep -v "^\[ RUN\|OK \]" | head -20
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_model --gtest_filter='DlrmCuda.Fused*' > $O/memcheck_fused.log 2>&1; echo "memcheck fused rc=$?"; tail -1 $O/memcheck_fused.log
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 $B/test_model --gtest_filter='DlrmCuda.Fused*' > $O/racecheck_fused.log 2>&1; echo "racecheck fused rc=$?"; tail -1 $O/racecheck_fused.log
for F in 4096 -1; do
  DLREC_FUSE_EMB_DOT_ROWS=$F $B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^bench" | sed "s/^/fuse $F: /"
  DLREC_FUSE_EMB_DOT_ROWS=$F $B/dlrec bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 --precision bf16 2>&1 | grep "^bench" | sed "s/^/fuse $F: /"
done
DLREC_FUSE_EMB_DOT_ROWS=0 $B/dlrec bench infer --device cuda --precision bf16 --batch 2048 --iters 500 --warmup 50 2>&1 | grep "^bench" | sed "s/^/fuse 0: /"
DLREC_PROFILE=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 32768 --iters 100 --warmup 10 2>&1 | grep "profile\]"
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch"
