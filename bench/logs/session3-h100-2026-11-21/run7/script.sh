set -u
O=/tmp/o; mkdir -p $O
B=.gpu/bin
for p in bf16 fp16 tf32; do $B/dlrec bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 --precision $p 2>&1 | grep "^bench"; done
python3 bench/pytorch_dlrm_gpu.py --batch 32768,55296 --steps 30 --warmup 5 --bf16 > $O/pytorch_bf16.log 2>&1; tail -3 $O/pytorch_bf16.log
for S in 16384 131072; do DLREC_INFER_PACK_SERIAL_IDS=$S DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch 2048 --iters 500 --warmup 50 2>&1 | grep -E "^bench|timing" | sed "s/^/serial $S: /"; done
GRPC_THREADS=4 OUT=$O/serve BIN=$B bash bench/serve_gpu_e2e.sh engine e2e 2>&1 | grep -E "^bench|^pytorch|^summary|ready"
