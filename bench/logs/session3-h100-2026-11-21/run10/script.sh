set -u
B=.gpu/bin
for C in 8 32 64; do
  DLREC_LT_CANDIDATES=$C $B/dlrec bench infer --device cuda --precision bf16 --batch 1,2048,32768 --iters 500 --warmup 50 2>&1 | grep -E "^bench" | sed "s/^/cand $C: /"
  DLREC_LT_CANDIDATES=$C $B/dlrec bench train --device cuda --batch 32768,55296 --steps 30 --warmup 5 --precision bf16 2>&1 | grep "^bench" | sed "s/^/cand $C: /"
done
