#!/usr/bin/env bash
# etl7 device call 1: page faults / huge pages survey on HEAD (pre) at 16 threads, alternating.
set -u
R=$PWD; G=$R/.gpu-etl7
(cd $G/lib && tar xJf ../lib.tar.xz); source $G/env.sh
O=$G/bin/dlrec-pre; T=$G/bin/time; D=/tmp/etl_scaling_8000000.tsv
{
date -u; nproc; uname -r; ldd --version | head -1; df -hT /tmp | tail -1; free -g | head -2
for f in enabled defrag shmem_enabled khugepaged/defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done
cat /sys/kernel/mm/transparent_hugepage/hpage_pmd_size; grep -i huge /proc/meminfo
} 2>&1 | tee $OUT/host.txt
$O datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
TR="glibc.malloc.trim_threshold=4294967296:glibc.malloc.mmap_threshold=33554432"
vm() { awk '/^thp_fault_alloc |^thp_fault_fallback |^pgfault /{printf "%s=%s ", $1, $2}' /proc/vmstat; }
one() { local tag=$1 tun=$2; shift 2
  local v0; v0=$(vm)
  env ${tun:+GLIBC_TUNABLES=$tun} DLREC_ETL_TIMES=1 $T -f "TIME %e wall %U user %S sys %R minflt %F majflt %M maxKB %c invcs %w volcs" -o /tmp/t.txt \
    $O --threads 16 bench etl --data $D --repeat 1 --work-dir /tmp "$@" >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep '^bench etl:' /tmp/o.txt)"; echo "$tag $(cat /tmp/t.txt)"; grep "etl times" /tmp/e.txt | sed "s/^/$tag /"
  echo "$tag vm before: $v0"; echo "$tag vm after:  $(vm)"
}
{
for i in 1 2 3; do
  one base ""
  one huge "glibc.malloc.hugetlb=1"
  one hugecache "glibc.malloc.hugetlb=1" --cache-huge-pages
  one keep "$TR"
  one hugekeep "glibc.malloc.hugetlb=1:$TR"
  one compact "" --cache-form compact
  one compacthuge "glibc.malloc.hugetlb=1" --cache-form compact --cache-huge-pages
done
} 2>&1 | tee $OUT/survey.log
grep -i huge /proc/meminfo > $OUT/meminfo-after.txt; date -u | tee -a $OUT/host.txt
