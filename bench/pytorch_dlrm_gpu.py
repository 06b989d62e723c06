#!/usr/bin/env python3
"""Plain-PyTorch peer of `dlrec bench train --device cuda`: the MLPerf DLRM v1 model on one GPU.

Same model as dlrec's (embedding dim 128, bottom 13-512-256-128, top 1024-1024-512-256-1, dot
interaction with the strict lower triangle, 26 Criteo Kaggle tables, one id per table), SGD with
sparse gradients for the tables (nn.EmbeddingBag(sparse=True)), BCE-with-logits. Batches are
pre-generated on the device (several distinct ones, rotated); warm-up excluded; timed with CUDA
events. fp32 by default (TF32 off); --bf16 runs the MLPs and the interaction under bf16 autocast.
--optimizer adam: torch.optim.SparseAdam for the tables and the fused torch.optim.Adam for the
dense layers (PyTorch's own pair for sparse embeddings; SparseAdam counts steps per table, dlrec's
Adam per row).

  python3 bench/pytorch_dlrm_gpu.py [--batch 32768,55296] [--steps 50] [--warmup 10] [--bf16]
      [--build-on cpu|cuda] [--optimizer sgd|adam]

--build-on cuda creates and initialises the 17 GB of tables on the GPU (seconds) instead of on
the CPU and copying them (about a minute on the lent H100 host); the timed steps are the same
(same shapes, same initial distributions, other random draws). The figures in bench/RESULTS.md
up to 2026-11-22 were taken with the default, cpu.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch_common import KAGGLE, mlp



class DLRM(nn.Module):
    def __init__(self, cards, dim=128, bottom=(512, 256, 128), top=(1024, 1024, 512, 256, 1)):
        super().__init__()
        self.embs = nn.ModuleList()
        for c in cards:
            e = nn.EmbeddingBag(c, dim, mode="sum", sparse=True)
            a = math.sqrt(1.0 / c)
            nn.init.uniform_(e.weight, -a, a)
            self.embs.append(e)
        self.bottom = mlp([13] + list(bottom), True)
        n = len(cards) + 1
        self.n = n
        inter = dim + n * (n - 1) // 2
        self.top = mlp([inter] + list(top), False)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, ids, offsets, bf16):
        # One id per table: ids [T, B], offsets [B] = arange(B).
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            x = self.bottom(dense)
        embs = [e(ids[t], offsets) for t, e in enumerate(self.embs)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            z = torch.stack([x.to(embs[0].dtype)] + embs, dim=1)  # [B, n, d]
            zz = torch.bmm(z, z.transpose(1, 2))
            tri = zz[:, self.li, self.lj]
            r = torch.cat([x.to(tri.dtype), tri], dim=1)
            return self.top(r).float().squeeze(1)


def build_model(cards, dev, build_on):
    """The DLRM on `dev`, its parameters created and initialised on the CPU or on `dev`."""
    if build_on == "cuda":
        with torch.device(dev):
            return DLRM(cards)
    return DLRM(cards).to(dev)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="32768,55296")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--max-rows", type=int, default=-1)
    ap.add_argument("--build-on", choices=["cpu", "cuda"], default="cpu",
                    help="where the model is created and initialised (cuda: much faster start)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in KAGGLE]
    torch.manual_seed(1)
    t0 = time.time()
    model = build_model(cards, dev, args.build_on)
    print(f"built in {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}", flush=True)
    if args.optimizer == "sgd":
        opts = [torch.optim.SGD(model.parameters(), lr=args.lr)]
    else:
        tables = [p for n, p in model.named_parameters() if n.startswith("embs.")]
        dense = [p for n, p in model.named_parameters() if not n.startswith("embs.")]
        opts = [torch.optim.SparseAdam(tables, lr=args.lr),
                torch.optim.Adam(dense, lr=args.lr, fused=True)]
    loss_fn = nn.BCEWithLogitsLoss()
    card_t = torch.tensor(cards, device=dev).unsqueeze(1)
    for B in [int(b) for b in args.batch.split(",")]:
        batches = []
        for _ in range(args.batches):
            dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev)))
            ids = (torch.rand(len(cards), B, device=dev, dtype=torch.float64) * card_t).long()
            ids = torch.minimum(ids, card_t - 1)
            labels = (torch.rand(B, device=dev) < 0.25).float()
            batches.append((dense, ids, labels))
        offsets = torch.arange(B, device=dev)

        def step(i):
            dense, ids, labels = batches[i % len(batches)]
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            logits = model(dense, ids, offsets, args.bf16)
            loss = loss_fn(logits, labels)
            loss.backward()
            for opt in opts:
                opt.step()
            return loss

        for i in range(args.warmup):
            step(i)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(args.steps):
            loss = step(i)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.steps
        print(f"pytorch gpu train: mlperf-dlrm {'bf16-autocast' if args.bf16 else 'fp32'} "
              f"{args.optimizer} "
              f"batch={B} steps={args.steps} ms/iter={ms:.3f} samples/s={B / ms * 1e3:.0f} "
              f"loss={loss.item():.4f} peak_mem={torch.cuda.max_memory_allocated() / 1e9:.2f} GB",
              flush=True)


if __name__ == "__main__":
    main()
