# fmwide GPU run 2: the test changes after run 1 (WideDeep SGD 300 + Adagrad 100 steps, bf16
# learning check conditioned on the CPU reference), the 300-step Adagrad Wide&Deep trace, and
# Wide&Deep bench train on the CPU with as many steps as the GPU's (loss comparison).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O
[ -f .gpu-fmwide/lib/libopenblas.so.0 ] || xz -dk .gpu-fmwide/lib/libopenblas.so.0.xz
source .gpu-fmwide/env.sh
B=.gpu-fmwide/bin
S=$O/summary2.txt
{ date -u; nvidia-smi -L; } > $S
$B/test_model --gtest_filter='GraphCuda.*:DlrmCuda.*' > $O/test_model2.log 2>&1; echo "test_model rc=$?" >> $S
grep -E "^\[  FAILED|PASSED|total\)|graph bf16|graph parity" $O/test_model2.log >> $S
$B/test_parity > $O/test_parity2.log 2>&1; echo "test_parity rc=$?" >> $S
grep -E "^\[  FAILED|PASSED" $O/test_parity2.log >> $S
DLREC_PARITY_STEPS=3 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_model --gtest_filter='GraphCuda.WideDeep*:GraphCuda.Bf16DeepFm*' > $O/memcheck2.log 2>&1; echo "memcheck rc=$?" >> $S; tail -2 $O/memcheck2.log >> $S
DLREC_PARITY_TRACE=1 DLREC_PARITY_STEPS=300 $B/test_model --gtest_filter='GraphCuda.WideDeepAdagradMatchesCpuEveryStep' > $O/trace_widedeep_adagrad300.log 2>&1; echo "trace rc=$? (300 steps; failure expected)" >> $S
grep -E "step (0|1|2|5|10|20|50|100|150|200|250|280|290|295|296|297|298|299):|graph parity" $O/trace_widedeep_adagrad300.log >> $S
timeout 90 $B/dlrec bench train --config .gpu-fmwide/wide_deep_cuda.json --device cpu --optimizer adagrad --batch 4096 --steps 50 --warmup 5 2>&1 | grep -E "^bench|rror" >> $S
cp .gpu-fmwide/run2.sh $O/script2.sh
