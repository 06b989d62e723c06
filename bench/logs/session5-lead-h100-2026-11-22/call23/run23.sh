set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
uptime | tee $L/host.txt
for r in off on off on; do
  A=""; [ $r = off ] && A="--grpc-parse-threads 0"
  SERVE_ARGS="$A" DURATION=4 OUT=$L/e2e_$r BIN=$B bash bench/serve_gpu_e2e.sh e2e 2>&1 | grep -E "summary|threads batch" | sed "s/^/parse=$r /" | tee -a $L/e2e.txt
done
uptime | tee -a $L/host.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
