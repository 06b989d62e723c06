set -u
(cd .gpu-etll && tar xJf lib.tar.xz); source .gpu-etll/env.sh; G=$PWD/.gpu-etll; B=$G/bin/dlrec; T=$G/bin/time; D=/tmp/etl_scaling_8000000.tsv
{ date -u; nproc; lscpu | grep -E "Model name|Thread|Core|Socket"; cat /sys/kernel/mm/transparent_hugepage/enabled; } | tee $OUT/host.txt
$B datagen --rows 8000000 --seed 7 --out $D 2>/dev/null; sync; cat $D > /dev/null
one() { local tag=$1 th=$2 tun=$3
  env ${tun:+GLIBC_TUNABLES=$tun} $T -f "%e wall %U user %S sys %R minflt %M maxKB" -o /tmp/t.txt \
    $B --threads $th bench etl --data $D --repeat 1 --work-dir /tmp >/tmp/o.txt 2>/tmp/e.txt
  echo "$tag $(grep -o 'MB/s=[0-9.]*' /tmp/o.txt | head -1) $(grep -o '(count.*' /tmp/o.txt) | $(cat /tmp/t.txt)"
}
MT=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296
for i in 1 2 3 4; do
  one t16 16 ""
  one t24 24 ""
  one t16tun 16 "$MT"
  one t32 32 ""
  one t24tun 24 "$MT"
done 2>&1 | tee $OUT/variants.log
date -u
