set -u
O=/tmp/o; mkdir -p $O
B=.gpu/bin
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*' > $O/tests.log 2>&1; echo "test_model rc=$?"; grep -E "FAILED|PASSED" $O/tests.log | head
$B/test_parity > $O/parity.log 2>&1; echo "test_parity rc=$?"; grep -E "^\[  FAILED|PASSED|dlrm_class/(bf16|fp16)" $O/parity.log | head -20
F='DlrmCuda.Bf16WideInteractionMatchesCpu:DlrmCuda.Fp16Adagrad*:DlrmCuda.PredictMatchesForward:GraphCuda.Bf16Dlrm*'
DLREC_PARITY_STEPS=6 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_model --gtest_filter="$F" > $O/memcheck.log 2>&1; echo "memcheck rc=$?"; tail -2 $O/memcheck.log
DLREC_PARITY_STEPS=3 timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $B/test_model --gtest_filter='DlrmCuda.Bf16WideInteractionMatchesCpu:DlrmCuda.Fp16Adagrad*' > $O/racecheck.log 2>&1; echo "racecheck rc=$?"; tail -2 $O/racecheck.log
for p in bf16 fp16; do $B/dlrec bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 --precision $p 2>&1 | grep "^bench"; done
DLREC_PROFILE=1 $B/dlrec bench train --device cuda --batch 32768 --steps 20 --warmup 5 --precision bf16 2>&1 | grep "profile\]"
DLREC_PROFILE=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 32768 --iters 100 --warmup 10 2>&1 | grep "profile\]"
