set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== GRPC_THREADS=2"; GRPC_THREADS=2 OUT=$OUT/t2 BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads" | sed 's/requests=.*failures/failures/'
echo "== GRPC_THREADS=4"; GRPC_THREADS=4 OUT=$OUT/t4 BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads" | sed 's/requests=.*failures/failures/'
echo "== GRPC_THREADS=4 SPIN_US=50 INLINE_ROWS=4096"; GRPC_THREADS=4 SPIN_US=50 INLINE_ROWS=4096 OUT=$OUT/t4s BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads" | sed 's/requests=.*failures/failures/'
