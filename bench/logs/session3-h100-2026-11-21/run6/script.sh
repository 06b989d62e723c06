set -u
O=/tmp/o; mkdir -p $O
B=.gpu/bin
$B/test_parity > $O/parity.log 2>&1; echo "test_parity rc=$?"; grep -E "^\[  FAILED|PASSED" $O/parity.log | head
for BS in 1 2048 32768; do DLREC_INFER_TIMING=1 $B/dlrec bench infer --device cuda --precision bf16 --batch $BS --iters 500 --warmup 50 2>&1 | grep -E "^bench|timing"; done
for T in 4 8; do echo "grpc-threads $T"; (GRPC_THREADS=$T SATURATION_ONLY=1 OUT=$O/sat$T BIN=$B bash bench/serve_gpu_e2e.sh e2e) 2>&1 | grep "^summary"; done
