set -u
B=.gpu-lead/bin; L=$OUT/logs; mkdir -p $L
$B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*' > $L/tests.log 2>&1; echo "test_model rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED" $L/tests.log | tail -4 | tee -a $L/summary.txt
DLREC_PARITY_STEPS=3 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16CrossFused*' > $L/memcheck.log 2>&1; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | tee -a $L/summary.txt
for i in 1 2; do $B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5 2>&1 | grep -o 'ms/iter=[0-9.]*' | tee -a $L/summary.txt; done
tar czf $OUT/logs.tgz -C $OUT logs
