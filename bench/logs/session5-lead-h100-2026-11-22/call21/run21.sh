set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
uptime | tee $L/uptime.txt
for i in 1 2; do $B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^bench"; done | tee $L/engine_dlrec.txt
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch" | tee $L/engine_pytorch.txt
DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 2048 --iters 200 --warmup 20 > $L/timing2048.txt 2>&1; tail -5 $L/timing2048.txt
uptime | tee -a $L/uptime.txt
DURATION=7 GRPC_THREADS="1" OUT=$L/e2e BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "summary|threads batch|ready" | tee $L/e2e.txt
uptime | tee -a $L/uptime.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
