set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*' > $OUT/test_model.log 2>&1; echo "test_model rc=$?"; tail -3 $OUT/test_model.log
$B/test_embedding --gtest_filter='GraphHashedCuda.*:HashTableCuda.*' > $OUT/test_embedding.log 2>&1; echo "test_embedding rc=$?"; tail -1 $OUT/test_embedding.log
$B/test_parity > $OUT/test_parity.log 2>&1; echo "test_parity rc=$?"; grep -E "PASSED|FAILED" $OUT/test_parity.log | head -3
$B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 300 --warmup 30 2>&1 | grep "^bench"
$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 20 --warmup 5 2>&1 | grep "^bench"
