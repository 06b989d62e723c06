set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
$B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*' > $L/tests.log 2>&1; echo "test_model rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED|Bf16.*Fused" $L/tests.log | tail -8 | tee -a $L/summary.txt
DLREC_PARITY_STEPS=3 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16*Fused*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?" | tee -a $L/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | tee -a $L/summary.txt
T="bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5"
P="python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16"
for r in d p o d p d o p d; do
  case $r in
    d) $B/dlrec $T > $L/run.log 2>&1; echo "dlrec default: $(grep -E 'ms/iter' $L/run.log | tail -1)" | tee -a $L/bench.txt ;;
    o) DLREC_MLP_FUSED=0 $B/dlrec $T > $L/run.log 2>&1; echo "dlrec mlp unfused: $(grep -E 'ms/iter' $L/run.log | tail -1)" | tee -a $L/bench.txt ;;
    p) $P > $L/run.log 2>&1; echo "pytorch: $(grep -E 'ms/iter' $L/run.log | tail -1)" | tee -a $L/bench.txt ;;
  esac
  cat $L/run.log >> $L/bench_full.log
done
DLREC_PROFILE=1 $B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 12 --warmup 1 > $L/profile.log 2>&1
grep "profile\]" $L/profile.log | tee -a $L/summary.txt
tar czf $OUT/logs.tgz -C $OUT logs
