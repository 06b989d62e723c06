#!/usr/bin/env python3
"""PyTorch peer of `dlrec bench infer --config configs/mlperf_dcnv2_multihot.json --cardinalities
mlperf_dcnv2 --dist zipf --device cuda`: MLPerf DLRM-DCNv2 (multi-hot) inference from a CUDA graph.

The model of bench/pytorch_dcnv2_gpu.py (imported from it: 26 nn.EmbeddingBag tables of dim 128,
sum pooling, bottom 13-512-256-128, 3 low-rank cross layers of rank 512, top
3456-1024-1024-512-256-1) on the MLPerf DCNv2 tables (capped at --max-rows rows each) with their
fixed ids per row (3, 2, 1, ..., 100 for table 20: 214 a row), converted to bf16 as a whole
(--fp32 keeps fp32), in eval mode under torch.no_grad, captured once per batch size with
torch.cuda.CUDAGraph on static inputs. Ids as `dlrec bench infer --dist zipf` draws them
(id = floor(exp(u ln(rows + 1))) - 1: P(id) ~ 1 / (id + 1)). Each timed call does what the dlrec
engine's call does: copy the batch's dense values and ids from pinned host memory into the
static inputs (the offsets of fixed bag sizes stay on the device), replay, copy the
probabilities back, synchronize; latency per call on the host clock.

  python3 bench/pytorch_dcnv2_infer_gpu.py [--batch 1,2048,32768] [--iters 200] [--max-rows N]
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dcnv2_ddp import CARDS, HOT  # noqa: E402  (the MLPerf DCNv2 tables and ids per row)
from pytorch_dcnv2_gpu import DCNv2  # noqa: E402
from torch_common import time_calls  # noqa: E402


def forward(model, dense, ids, offsets):
    embs = [e(ids[t], offsets[t]) for t, e in enumerate(model.embs)]
    x = model.bottom(dense)
    x0 = torch.cat([x] + embs, dim=1)
    return torch.sigmoid(model.top(model.cross(x0)).float().squeeze(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,2048,32768")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--max-rows", type=int, default=-1)
    ap.add_argument("--fp32", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in CARDS]
    torch.manual_seed(1)
    t0 = time.time()
    with torch.device(dev):
        model = DCNv2(cards).eval()
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    model = model.to(dtype)
    print(f"built in {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}", flush=True)
    for B in [int(b) for b in args.batch.split(",")]:
        dense_h = torch.rand(B, 13).mul_(3.0).exp_().log1p_().to(dtype).pin_memory()
        ids_h = []
        for c, h in zip(cards, HOT):
            u = torch.rand(B * h, dtype=torch.float64)
            ids_h.append(torch.clamp(torch.exp(u * torch.log(torch.tensor(c + 1.0))).long() - 1,
                                     0, c - 1).pin_memory())
        out_h = torch.empty(B, dtype=torch.float32).pin_memory()
        dense = dense_h.to(dev)
        ids = [i.to(dev) for i in ids_h]
        offsets = [torch.arange(0, B * h, h, device=dev) for h in HOT]
        with torch.no_grad():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    out = forward(model, dense, ids, offsets)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                out = forward(model, dense, ids, offsets)

        def call():
            dense.copy_(dense_h, non_blocking=True)
            for d, h in zip(ids, ids_h):
                d.copy_(h, non_blocking=True)
            g.replay()
            out_h.copy_(out, non_blocking=True)
            torch.cuda.synchronize()

        p50, p90, p99, total = time_calls(call, args.warmup, args.iters)
        print(f"pytorch dcnv2 infer: {'fp32' if args.fp32 else 'bf16'} batch={B} iters={args.iters} "
              f"p50_us={p50:.1f} p90_us={p90:.1f} p99_us={p99:.1f} "
              f"samples/s={B * args.iters / total:.0f} checksum={out_h[0].item():.4f}", flush=True)


if __name__ == "__main__":
    main()
