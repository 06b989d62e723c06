set -u
B=.gpu/bin
$B/dlrec bench train --device cuda --batch 32768 --steps 30 --warmup 5 --precision bf16 2>&1 | grep "^bench"
REF_BATCHES=32768 REF_TIMEOUT=420 OUT=$OUT/ref BIN=$B bash bench/gpu_train_suite.sh peers 2>&1 | grep -v "^$" | tail -12
