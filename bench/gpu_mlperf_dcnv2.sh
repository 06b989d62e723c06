#!/usr/bin/env bash
# The MLPerf DLRM-DCNv2 multi-hot model on 1 and 4 GPUs with the PyTorch peer, in one device call
# (issue 19 item 2; bench/RESULTS.md, "MLPerf DCNv2 multi-hot on 4 GPUs"). Run from a bundle made
# by /work/shared/tools/bundle-portable.sh holding bin/dlrec and env.sh (or b.tar.xz of them),
# this script, mlperf_dcnv2_multihot.json and pytorch_dcnv2_ddp.py:   cd BUNDLE && bash gpu_mlperf_dcnv2.sh
# Logs and summary.txt go to $OUT (or ./out). B: rows per GPU (13,824: HugeCTR's global batch
# 55,296 over 4 GPUs); CAP: the rows per table of the variant that fits one 80 GB GPU.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
H=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$H/out}; mkdir -p "$OUT"; S=$OUT/summary.txt
[ -x /usr/bin/mpiexec ] || { M=$(command -v mpiexec || command -v mpirun); [ -n "$M" ] && ln -sf $M /usr/bin/mpiexec; }
# The binaries: bin/, lib/ and env.sh beside this script, or packed in b.tar.xz (the device
# call's 64 MiB limit).
P=$H
if [ -f $H/b.tar.xz ]; then P=/tmp/dcnv2_bundle; mkdir -p $P && tar xJf $H/b.tar.xz -C $P; fi
source $P/env.sh
B=${B:-13824}; CAP=${CAP:-10000000}; STEPS=${STEPS:-20}; WARM=${WARM:-5}
{ nvidia-smi -L; nvidia-smi --query-gpu=memory.total,memory.free --format=csv; date -u;
  cat $H/COMMIT 2>/dev/null; mpiexec --version 2>&1 | head -1;
  python3 -c 'import torch; print("torch", torch.__version__)';
  python3 -m pip list 2>/dev/null | grep -iE "^(torchrec|fbgemm)" || echo "no torchrec/fbgemm-gpu installed"; } >> $S 2>&1
run() { local name=$1 lim=$2; shift 2; local t0=$(date +%s); timeout $lim "$@" > $OUT/$name.log 2>&1;
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> $S;
  grep -hE "^bench train:|^pytorch ddp|peak memory|\[shard\] GPU|Error|error:|what\(\)" $OUT/$name.log | head -14 >> $S; }
D="$P/bin/dlrec bench train --config $H/mlperf_dcnv2_multihot.json --cardinalities mlperf_dcnv2 --dist zipf --precision bf16 --steps $STEPS --warmup $WARM"
run full4 130 $D --gpus 4 --batch $B,6912
run peer4 90 python3 -m torch.distributed.run --nproc_per_node 4 $H/pytorch_dcnv2_ddp.py --local-batch $B --steps $STEPS --warmup $WARM --bf16 --max-rows $CAP
run cap1 50 $D --device cuda:0 --max-rows $CAP --batch $B
run cap4 70 $D --gpus 4 --max-rows $CAP --batch $B
cat $S
