set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
$B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*' > $L/tests.log 2>&1; echo "test_model rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED|Bf16CrossFused" $L/tests.log | tail -6 | tee -a $L/summary.txt
DLREC_PARITY_STEPS=3 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16CrossFused*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?" | tee -a $L/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | tee -a $L/summary.txt
for f in 1 0; do
  DLREC_CROSS_FUSED=$f DLREC_PROFILE=1 $B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 12 --warmup 1 > $L/profile_$f.log 2>&1
  grep "profile\]" $L/profile_$f.log | grep -E "cross|total" | sed "s/^/fused=$f /" | tee -a $L/summary.txt
done
tar czf $OUT/logs.tgz -C $OUT logs
