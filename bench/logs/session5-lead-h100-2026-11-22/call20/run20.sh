# Session 5, lead's final check of the integrated HEAD: GPU tests (incl. the fused small-batch
# default, never run on a GPU before), memcheck of the fused tests, the engine vs PyTorch, and
# the gRPC end to end with the default (1 queue + 2 parse threads) twice.
set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $L/gpu.txt
nproc | tee -a $L/gpu.txt
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*:Graph*' > $L/test_model.log 2>&1; echo "test_model rc=$?"; tail -3 $L/test_model.log
$B/test_embedding --gtest_filter='*Cuda*' > $L/test_embedding.log 2>&1; echo "test_embedding rc=$?"; tail -1 $L/test_embedding.log
$B/test_parity > $L/test_parity.log 2>&1; echo "test_parity rc=$?"; tail -1 $L/test_parity.log
compute-sanitizer --tool memcheck $B/test_model --gtest_filter='DlrmCuda.Fused*:DlrmCuda.InstancesPredict*:DlrmCuda.SmallBatch*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | head -4
OUT=$L/engine BIN=$B bash bench/serve_gpu_e2e.sh engine 2>&1 | tee $L/engine.txt
for B1 in 1 2 8; do for F in 1 0; do DLREC_INFER_FUSED=$F $B/dlrec bench infer --device cuda --precision bf16 --batch $B1 --iters 500 --warmup 50 2>&1 | grep "^bench" | sed "s/^/fused=$F /"; done; done | tee $L/fused_ab.txt
DURATION=7 GRPC_THREADS="1 1" OUT=$L/e2e BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | tee $L/e2e.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
