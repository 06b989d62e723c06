set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
{ uptime; nproc; lscpu | grep -E "Model name|Thread|Core|Socket|MHz|NUMA node0"; cat /sys/fs/cgroup/cpu.max 2>/dev/null; cat /sys/fs/cgroup/cpu.stat 2>/dev/null | head -6; } 2>&1 | tee $L/host.txt
for P in 1 4 8; do DLREC_INFER_PACK_THREADS=$P DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 2048 --iters 300 --warmup 30 2>&1 | grep -E "^bench|infer timing" | sed "s/^/pack=$P /"; done | tee $L/pack.txt
cat /sys/fs/cgroup/cpu.stat 2>/dev/null | head -6 | tee -a $L/host.txt
$B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^bench" | tee $L/engine.txt
python3 bench/pytorch_dlrm_infer_gpu.py --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep "^pytorch" | tee -a $L/engine.txt
DURATION=7 GRPC_THREADS="1" OUT=$L/e2e BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "summary|threads batch|ready" | tee $L/e2e.txt
uptime | tee -a $L/host.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
