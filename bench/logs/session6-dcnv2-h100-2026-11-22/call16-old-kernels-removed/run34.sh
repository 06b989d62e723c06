set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
$B/test_embedding --gtest_filter='*Cuda*' > $L/emb_tests.log 2>&1; echo "test_embedding rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED" $L/emb_tests.log | tee -a $L/summary.txt
$B/test_model --gtest_filter='GraphCuda.*:Graph*:DlrmCuda.*' > $L/tests.log 2>&1; echo "test_model rc=$?" | tee -a $L/summary.txt
grep -E "^\[  (PASSED|FAILED) |FAILED" $L/tests.log | tee -a $L/summary.txt
compute-sanitizer --tool memcheck $B/test_embedding --gtest_filter='EmbeddingCuda.*:GraphHashedCuda.*' > $L/memcheck.log 2>&1; echo "memcheck rc=$?" | tee -a $L/summary.txt
grep -E "ERROR SUMMARY|PASSED|FAILED" $L/memcheck.log | tee -a $L/summary.txt
$B/bench_embedding_cuda --iters 50 > $L/embbench.log 2>&1; grep -E "checksum|forward|backward" $L/embbench.log | tee -a $L/summary.txt
$B/dlrec bench train --config configs/dcnv2.json --device cuda --batch 55296 --precision bf16 --steps 30 --warmup 5 2>&1 | grep ms/iter | tee -a $L/summary.txt
tar czf $OUT/logs.tgz -C $OUT logs
