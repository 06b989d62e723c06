set -u
B=.gpu/bin
L=$OUT/logs; mkdir -p $L
{ uptime; nproc; cat /sys/devices/system/cpu/cpuidle/current_driver; grep . /sys/module/haltpoll/parameters/* ; lscpu | grep -i "model name\|hypervisor"; } > $L/host.txt 2>&1
export WORK=/tmp/e2e REUSE=1 DURATION=5 BIN=$B
i=0
for cfg in ${CFGS:-C D C}; do
  i=$((i + 1))
  case $cfg in A) S=""; C="";; B) S=""; C=2000;; C) S=2000; C=2000;; D) S=2000; C="";; esac
  SPIN_US=$S CLIENT_SPIN_US=$C OUT=$L/e2e_${i}_$cfg bash bench/serve_gpu_e2e.sh e2e 2>&1 \
    | grep -E "summary|threads batch|server p|ready after|exited" | sed "s/^/cfg=$cfg$i /" | tee -a $L/e2e.txt
done
uptime >> $L/host.txt
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
