#!/usr/bin/env python3
"""PyTorch's compressed GEMMs on the shapes of bench/bench_gemm_compress.cc (the peer of
issue 21's GEMM figures), on one GPU:

  dense bf16 / fp16: F.linear (cuBLASLt)
  2:4 bf16 / fp16:   F.linear with torch.sparse.to_sparse_semi_structured weights (cuSPARSELt
                     backend)
  int8:              torch._int_mm (int8 x int8 -> int32)
  2:4 int8:          torch._cslt_compress + torch._cslt_sparse_mm (cuSPARSELt; bf16 output:
                     torch refuses an int8 output for int8 inputs)

Y [batch, out] = X [batch, in] W^T with W 2:4-pruned (the 2 smallest |w| of each group of 4 along
`in`). Each figure is the median over --reps of the mean time of --iters GEMMs replayed from a
CUDA graph (no Python overhead in the timing). Prints the same columns as the C++ bench and a
`RESULT {json}` line per shape and batch.

  python3 bench/pytorch_gemm_compress.py [--batches 8192,32768,65536] [--iters 30] [--reps 5]
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F

SHAPES = [
    ("dlrm", "bottom.1", 256, 512), ("dlrm", "bottom.2", 128, 256),
    ("dlrm", "top.0", 1024, 479), ("dlrm", "top.1", 1024, 1024),
    ("dlrm", "top.2", 512, 1024), ("dlrm", "top.3", 256, 512),
    ("dcnv2", "cross.v", 512, 3456), ("dcnv2", "cross.u", 3456, 512),
    ("dcnv2", "top.0", 1024, 3456), ("dcnv2", "top.1", 1024, 1024),
    ("dcnv2", "top.2", 512, 1024), ("dcnv2", "top.3", 256, 512),
]


def pruned(out, inp, gen):
    w = torch.randn(out, inp, generator=gen, device="cuda") / math.sqrt(inp)
    g = inp // 4 * 4
    q = w[:, :g].reshape(out, g // 4, 4)
    idx = q.abs().argsort(dim=-1)[..., :2]
    q.scatter_(-1, idx, 0.0)
    w[:, :g] = q.reshape(out, g)
    return w


def timed(fn, iters, reps):
    """Median over reps of the mean ms of iters calls, replayed from a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    times.sort()
    return times[len(times) // 2]


def attempt(label, make, iters, reps, notes):
    try:
        return timed(make(), iters, reps)
    except Exception as e:  # a backend that refuses the shape or type: say why
        notes.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
        return float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8192,32768,65536")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    from torch.sparse import SparseSemiStructuredTensor, to_sparse_semi_structured
    SparseSemiStructuredTensor._FORCE_CUTLASS = False  # the cuSPARSELt backend
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"cuSPARSELt {torch.backends.cusparselt.version()}, {args.iters} iters x {args.reps} reps")
    print(f"{'model':6} {'layer':9} {'out':>5} {'in':>5} {'batch':>6} | {'bf16':>8} {'fp16':>8} "
          f"{'int8':>8} | {'24bf16':>8} {'24fp16':>8} {'24int8':>8} | notes")
    gen = torch.Generator(device="cuda").manual_seed(7)
    for model, layer, n, k in SHAPES:
        w = pruned(n, k, gen)
        wbf, wh = w.bfloat16(), w.half()
        wscale = 3.0 / math.sqrt(k) / 127.0
        wi8 = (w / wscale).round().clamp(-127, 127).to(torch.int8)
        for b in batches:
            notes = []
            x = torch.rand(b, k, generator=gen, device="cuda") * 2 - 1
            xbf, xh = x.bfloat16(), x.half()
            xi8 = (x * 127).round().clamp(-127, 127).to(torch.int8)
            t = {}
            t["bf16"] = attempt("bf16", lambda: (lambda: F.linear(xbf, wbf)), args.iters,
                                args.reps, notes)
            t["fp16"] = attempt("fp16", lambda: (lambda: F.linear(xh, wh)), args.iters, args.reps,
                                notes)
            wi8_t = wi8.t()
            t["int8"] = attempt("int8", lambda: (lambda: torch._int_mm(xi8, wi8_t)), args.iters,
                                args.reps, notes)

            def sparse_linear(xx, ww):
                ws = to_sparse_semi_structured(ww)
                return lambda: F.linear(xx, ws)
            t["sparse_bf16"] = attempt("2:4 bf16", lambda: sparse_linear(xbf, wbf), args.iters,
                                       args.reps, notes)
            t["sparse_fp16"] = attempt("2:4 fp16", lambda: sparse_linear(xh, wh), args.iters,
                                       args.reps, notes)

            def sparse_int8():
                comp = torch._cslt_compress(wi8)
                xt = xi8.t()  # [k, b]: W [n, k] @ X^T [k, b] -> [n, b]
                return lambda: torch._cslt_sparse_mm(comp, xt, out_dtype=torch.bfloat16)
            t["sparse_int8"] = attempt("2:4 int8", sparse_int8, args.iters, args.reps, notes)
            print(f"{model:6} {layer:9} {n:5d} {k:5d} {b:6d} | {t['bf16']:8.4f} {t['fp16']:8.4f} "
                  f"{t['int8']:8.4f} | {t['sparse_bf16']:8.4f} {t['sparse_fp16']:8.4f} "
                  f"{t['sparse_int8']:8.4f} | {'; '.join(notes)}", flush=True)
            print("RESULT " + json.dumps({"model": model, "layer": layer, "out": n, "in": k,
                                          "batch": b, "ms": {key: (None if math.isnan(v) else
                                                                   round(v, 5))
                                                             for key, v in t.items()},
                                          "notes": notes}), flush=True)
            del x, xbf, xh, xi8


if __name__ == "__main__":
    main()
