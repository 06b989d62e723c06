set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== GRPC_THREADS=2 SPIN_US=50"; GRPC_THREADS=2 SPIN_US=50 OUT=$OUT/t2s BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads" | sed 's/requests=.*failures/failures/'
echo "== GRPC_THREADS=3 SPIN_US=50"; GRPC_THREADS=3 SPIN_US=50 OUT=$OUT/t3s BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads" | sed 's/requests=.*failures/failures/'
