#!/usr/bin/env bash
# etl7 device call 2: new (e9dd0b4: compacted cache with huge pages by default) vs pre (43a1f71),
# 16 threads alternating; variants with faults/sys time/phase clock; cmp of outputs; tests.
set -u
R=$PWD; G=$R/.gpu-etl7
(cd $G/lib && tar xJf ../lib.tar.xz); source $G/env.sh
B=$G/bin/dlrec; O=$G/bin/dlrec-pre; T=$G/bin/time; D=/tmp/etl_scaling_8000000.tsv
export WORK=/tmp
{ date -u; nproc; uname -r; cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag; cat /proc/buddyinfo; } | tee $OUT/host.txt
$B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
ALTERNATE=1 REPEAT=5 PEER=$O timeout 100 bash bench/etl_scaling.sh $B 8000000 16 2>&1 | tee $OUT/sweep16.log
vm() { awk '/^thp_fault_alloc |^pgfault /{printf "%s=%s ", $1, $2}' /proc/vmstat; }
one() { local tag=$1 bin=$2 tun=$3; shift 3
  local v0; v0=$(vm)
  env ${tun:+GLIBC_TUNABLES=$tun} DLREC_ETL_TIMES=1 $T -f "TIME %e wall %U user %S sys %R minflt %M maxKB" -o /tmp/t.txt \
    $bin --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp "$@" >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; echo "$tag $(cat /tmp/t.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
  echo "$tag vm before: $v0"; echo "$tag vm after:  $(vm)"
}
{
for i in 1 2 3; do
  one new $B ""
  one pre $O ""
  one newenv $B "glibc.malloc.hugetlb=1"
  one newnohuge $B "" --no-cache-huge-pages
  one precompacthuge $O "" --cache-form compact --cache-huge-pages
done
} 2>&1 | tee $OUT/variants.log
c() { echo "$1: $(ls $2 | wc -l) files"; for f in $2/*; do cmp $f $3/$(basename $f) && echo "same $(basename $f)"; done; [ "$(ls $2)" = "$(ls $3)" ] || echo "DIFF file list"; }
for a in "" "--workflow bench/etl_criteo_workflow.json" "--shard-rows 3000000"; do
  timeout 40 $B --threads 16 etl --input $D $a --out /tmp/wN >/dev/null 2>&1
  timeout 40 $O --threads 16 etl --input $D $a --out /tmp/wO >/dev/null 2>&1
  c "${a:-default}" /tmp/wO /tmp/wN >> $OUT/cmp.txt 2>&1; rm -rf /tmp/wN /tmp/wO
done
cat $OUT/cmp.txt
(cd /tmp && timeout 40 $G/bin/test_io --gtest_filter='TextReader*:Shard*' 2>&1 | grep -E "^\[  (PASSED|FAILED|SKIPPED)|FAILED  \]"; timeout 90 $G/bin/test_etl 2>&1 | grep -E "^\[  (PASSED|FAILED)|FAILED  \]") | tee $OUT/tests.log
date -u
