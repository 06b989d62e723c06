set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
ls /usr/local/cuda/bin 2>/dev/null | tr '\n' ' '; which ncu nsys 2>/dev/null; echo
$B/test_model --gtest_filter='DlrmCuda.*' 2>&1 | tail -3 > $OUT/tests.log; tail -2 $OUT/tests.log
run() { $B/dlrec bench infer --device cuda --precision bf16 --iters 500 --warmup 50 "$@" 2>&1 | grep -E "^bench infer:|infer timing" | sed 's/ iters=500//;s/checksum=.*//'; }
for i in 1 2; do
  DLREC_INFER_TIMING=1 run --batch 1,2048,32768
  for P in 1 4 16; do echo "pack threads $P:"; DLREC_INFER_PACK_THREADS=$P DLREC_INFER_TIMING=1 run --batch 2048; done
done
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch"
for BT in 1 2048 32768; do
  DLREC_PROFILE=1 $B/dlrec bench infer --device cuda --precision bf16 --batch $BT --iters 200 --warmup 20 > $OUT/profile_$BT.log 2>&1
  grep "profile\]" $OUT/profile_$BT.log
done
