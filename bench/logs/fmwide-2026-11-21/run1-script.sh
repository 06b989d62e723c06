# fmwide GPU verification: tests, sanitizers, bench train (DeepFM / Wide&Deep, GPU vs CPU).
set -u
O=${OUT:-/tmp/o}; mkdir -p $O
[ -f .gpu-fmwide/lib/libopenblas.so.0 ] || xz -dk .gpu-fmwide/lib/libopenblas.so.0.xz
source .gpu-fmwide/env.sh
B=.gpu-fmwide/bin
S=$O/summary.txt
{ date -u; nvidia-smi -L; nproc; git log -1 --format=%H 2>/dev/null; } > $S
$B/test_model --gtest_filter='GraphCuda.*:DlrmCuda.*' > $O/test_model.log 2>&1; echo "test_model rc=$?" >> $S
grep -E "^\[  FAILED|PASSED|total\)" $O/test_model.log >> $S
$B/test_parity > $O/test_parity.log 2>&1; echo "test_parity rc=$?" >> $S
grep -E "^\[  FAILED|PASSED|SKIPPED.*(fm|wide)" $O/test_parity.log | head -30 >> $S
F='GraphCuda.DeepFm*:GraphCuda.Wide*:GraphCuda.Bf16DeepFm*:GraphCuda.DeviceTrainStepAndGraphReplay:GraphCuda.InitialParameters*'
DLREC_PARITY_STEPS=4 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/test_model --gtest_filter="$F" > $O/memcheck.log 2>&1; echo "memcheck rc=$?" >> $S; tail -3 $O/memcheck.log >> $S
DLREC_PARITY_STEPS=2 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 $B/test_model --gtest_filter='GraphCuda.DeepFmGathered*:GraphCuda.WideDeep*:GraphCuda.Bf16DeepFm*' > $O/racecheck.log 2>&1; echo "racecheck rc=$?" >> $S; tail -3 $O/racecheck.log >> $S
{
for cfg in configs/deepfm.json .gpu-fmwide/wide_deep_cuda.json; do
  for p in fp32 tf32 bf16; do
    timeout 60 $B/dlrec bench train --config $cfg --device cuda --optimizer adagrad --precision $p --batch 4096,16384 --steps 50 --warmup 5 2>&1 | grep -E "^bench|rror"
  done
  timeout 60 $B/dlrec bench train --config $cfg --device cpu --optimizer adagrad --batch 4096 --steps 10 --warmup 2 2>&1 | grep -E "^bench|rror"
done
DLREC_PROFILE=1 timeout 40 $B/dlrec bench train --config configs/deepfm.json --device cuda --optimizer adagrad --precision bf16 --batch 16384 --steps 20 --warmup 5 2>&1 | grep -E "profile\]"
} > $O/bench.log 2>&1
cat $O/bench.log >> $S
cp .gpu-fmwide/run.sh $O/script.sh
