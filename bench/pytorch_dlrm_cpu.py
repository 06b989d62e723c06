#!/usr/bin/env python3
"""PyTorch CPU peer of `dlrec bench train --device cpu`: the same DLRM (configs/dlrm_criteo.json sizes), batch,
optimizer and thread count, on in-memory random batches. Prints samples/s.

    python3 bench/pytorch_dlrm_cpu.py --threads 16 --batch 4096 --steps 50
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch_common import KAGGLE as CRITEO_KAGGLE
from torch_common import mlp


class DLRM(nn.Module):
    def __init__(self, num_dense, cards, dim, bottom, top):
        super().__init__()
        self.bottom = mlp([num_dense] + bottom, relu_last=True)
        self.embs = nn.ModuleList()
        for c in cards:
            e = nn.EmbeddingBag(c, dim, mode="sum", sparse=True)
            bound = math.sqrt(1.0 / c)
            nn.init.uniform_(e.weight, -bound, bound)
            self.embs.append(e)
        n = 1 + len(cards)
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)
        self.top = mlp([dim + n * (n - 1) // 2] + top, relu_last=False)

    def forward(self, dense, indices, offsets):
        x = self.bottom(dense)
        ly = [e(indices[t], offsets) for t, e in enumerate(self.embs)]
        z = torch.stack([x] + ly, dim=1)              # [B, n, d]
        zz = torch.bmm(z, z.transpose(1, 2))          # [B, n, n]
        inter = zz[:, self.li, self.lj]               # strictly-lower triangle, row-major
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-rows", type=int, default=1000000)
    ap.add_argument("--optimizer", choices=["sgd", "adagrad"], default="adagrad")
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--dist", choices=["zipf", "uniform"], default="zipf")
    ap.add_argument("--dim", type=int, default=16)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    cards = [max(1, min(c, args.max_rows)) for c in CRITEO_KAGGLE]
    model = DLRM(13, cards, args.dim, [512, 256, 64, 16], [512, 256, 1])
    emb_params = [p for e in model.embs for p in e.parameters()]
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    if args.optimizer == "sgd":
        opts = [torch.optim.SGD(emb_params, lr=args.lr), torch.optim.SGD(dense_params, lr=args.lr)]
    else:
        opts = [torch.optim.Adagrad(emb_params, lr=args.lr, eps=1e-8),
                torch.optim.Adagrad(dense_params, lr=args.lr, eps=1e-8)]
    loss_fn = nn.BCEWithLogitsLoss()

    B = args.batch
    batches = []
    for _ in range(32):  # distinct batches, as `dlrec bench train --batches 32` (no memorisation)
        dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13)))
        labels = (torch.rand(B) < 0.25).float()
        idx = []
        for c in cards:
            if args.dist == "zipf":  # log-uniform ids: P(id) ~ 1/id, like `dlrec bench train --dist zipf`
                i = (torch.exp(torch.rand(B, dtype=torch.float64) * math.log(c + 1)) - 1).long()
            else:
                i = torch.randint(0, c, (B,))
            idx.append(i.clamp_(0, c - 1))
        batches.append((dense, idx, torch.arange(B), labels))

    def step(i):
        dense, idx, offsets, labels = batches[i % len(batches)]
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, idx, offsets), labels)
        loss.backward()
        for o in opts:
            o.step()
        return loss

    for i in range(args.warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    s = time.perf_counter() - t0
    print(f"pytorch {torch.__version__} cpu train: optimizer={args.optimizer} threads={args.threads} "
          f"batch={B} steps={args.steps} dist={args.dist} time={s:.3f} s "
          f"step={1e3 * s / args.steps:.2f} ms loss={loss.item():.4f}")
    print(f"samples/s: {B * args.steps / s:.0f}")


if __name__ == "__main__":
    main()
