set -u
B=.gpu/bin
nvidia-smi --query-gpu=name --format=csv,noheader
$B/test_model --gtest_filter='DlrmCuda.*:GraphCuda.*' > $OUT/test_model.log 2>&1; echo "test_model rc=$?"; tail -3 $OUT/test_model.log
$B/test_embedding --gtest_filter='GraphHashedCuda.*:HashTableCuda.*' > $OUT/test_embedding.log 2>&1; echo "test_embedding rc=$?"; tail -2 $OUT/test_embedding.log
$B/test_parity > $OUT/test_parity.log 2>&1; echo "test_parity rc=$?"; grep -E "PASSED|FAILED" $OUT/test_parity.log | head -3
OUT=$OUT/engine BIN=$B bash bench/serve_gpu_e2e.sh engine
OUT=$OUT/e2e BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "^summary|^threads|ready"
python3 -c "import json,sys;c=json.load(open(sys.argv[1]));[l.pop('hashed',None) for l in c['model']['layers']];json.dump(c,open(sys.argv[2],'w'))" configs/dlrm_hashed_large.json /tmp/plain_large.json
grep -c hashed /tmp/plain_large.json
for dist in uniform zipf; do for cfg in configs/dlrm_hashed_large.json /tmp/plain_large.json; do
  echo "$cfg $dist:"; timeout 60 $B/dlrec bench train --device cuda --config $cfg --precision bf16 --batch 65536 --batches 32 --dist $dist 2>&1 | grep -E "bench train:|rror" | tee -a $OUT/hashed_bench.log
done; done
