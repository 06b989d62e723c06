set -u
B=.gpu-lead/bin
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/gpu.txt
$B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*' > $L/tests.log 2>&1; echo "test_model rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED|Bf16CrossFused" $L/tests.log | tail -8 | tee -a $L/summary.txt
$B/test_parity > $L/parity.log 2>&1; echo "test_parity rc=$?" | tee -a $L/summary.txt; grep -E "^\[  (PASSED|FAILED) " $L/parity.log | tee -a $L/summary.txt
$B/test_embedding --gtest_filter='*Cuda*' > $L/emb.log 2>&1; echo "test_embedding rc=$?" | tee -a $L/summary.txt; grep -E "^\[  (PASSED|FAILED) " $L/emb.log | tee -a $L/summary.txt
DLREC_PARITY_STEPS=3 compute-sanitizer --tool memcheck $B/test_model --gtest_filter='GraphCuda.Bf16CrossFused*:GraphCuda.Bf16DcnStacked*:GraphCuda.EmbeddingIntoConcat*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?" | tee -a $L/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | tee -a $L/summary.txt
run() { # name env...
  local n=$1; shift
  env "$@" $B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5 > $L/bench_$n.log 2>&1
  echo "$n $* : $(grep -o 'ms/iter=[0-9.]*' $L/bench_$n.log) $(grep -o 'samples/s=[0-9.]*' $L/bench_$n.log)" | tee -a $L/summary.txt
}
pt() { python3 bench/pytorch_dcnv2_gpu.py --batch 55296 --steps 30 --warmup 5 --bf16 > $L/pytorch_$1.log 2>&1; echo "pytorch $1: $(grep -o 'ms/iter=[0-9.]*' $L/pytorch_$1.log)" | tee -a $L/summary.txt; }
run a1 X=1
pt 1
run a2 X=1
pt 2
run b1 DLREC_CROSS_FUSED_BWD=0
run a3 X=1
pt 3
run a4 X=1
pt 4
run a5 X=1
$B/dlrec bench train --config configs/mlperf_dlrm.json --device cuda --batch 32768 --precision bf16 --steps 30 --warmup 5 > $L/dlrm.log 2>&1; echo "dlrm: $(grep -o 'ms/iter=[0-9.]*' $L/dlrm.log)" | tee -a $L/summary.txt
for f in 1 0; do
  DLREC_CROSS_FUSED_BWD=$f DLREC_PROFILE=1 $B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 12 --warmup 1 > $L/profile_$f.log 2>&1
  grep "profile\]" $L/profile_$f.log | grep -E "cross|top|total" | sed "s/^/bwdfused=$f /" | tee -a $L/summary.txt
done
tar czf $OUT/logs.tgz -C $OUT logs
