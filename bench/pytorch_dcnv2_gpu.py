#!/usr/bin/env python3
"""Plain-PyTorch peer of `dlrec bench train --config configs/dcnv2.json --device cuda`.

The MLPerf DLRM-DCNv2 model at configs/dcnv2.json's sizes: 26 Criteo Kaggle tables of dim 128
(nn.EmbeddingBag, sum, one id per table, sparse gradients), bottom MLP 13-512-256-128 (ReLU
after every layer), x0 = [bottom, 26 embeddings] (3456 wide), 3 low-rank (512) cross layers
x_{l+1} = x0 * (U_l (V_l x_l) + b_l) + x_l, top MLP 3456-1024-1024-512-256-1, BCE with logits.
Optimizer: Adagrad (lr 0.004, eps 1e-8; the tables through a second Adagrad on their sparse
gradients) or SGD (--optimizer sgd, sparse table gradients too). Batches are generated on the
device beforehand (several, rotated); warm-up steps excluded; timed with CUDA events.
fp32 by default (TF32 off); --bf16 runs the MLPs and the cross network under bf16 autocast
(x0 cast to bf16, so the cross network's element-wise work is bf16 as well); --tf32 allows TF32.

  python3 bench/pytorch_dcnv2_gpu.py [--batch 55296] [--steps 30] [--warmup 5] [--bf16]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
from torch_common import KAGGLE


def linear(n_in, n_out, bias=True):
    layer = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(layer.weight, 0.0, math.sqrt(2.0 / (n_in + n_out)))
    if bias:
        nn.init.zeros_(layer.bias)
    return layer


def mlp(sizes, relu_last):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes) or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class LowRankCross(nn.Module):
    def __init__(self, width, layers, rank):
        super().__init__()
        self.v = nn.ModuleList(linear(width, rank, bias=False) for _ in range(layers))
        self.u = nn.ModuleList(linear(rank, width) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for v, u in zip(self.v, self.u):
            x = x0 * u(v(x)) + x
        return x


class DCNv2(nn.Module):
    def __init__(self, cards, dim=128, bottom=(512, 256, 128), cross_layers=3, rank=512,
                 top=(1024, 1024, 512, 256, 1)):
        super().__init__()
        self.embs = nn.ModuleList()
        for c in cards:
            e = nn.EmbeddingBag(c, dim, mode="sum", sparse=True)
            a = math.sqrt(1.0 / c)
            nn.init.uniform_(e.weight, -a, a)
            self.embs.append(e)
        self.bottom = mlp([13] + list(bottom), True)
        width = bottom[-1] + dim * len(cards)
        self.cross = LowRankCross(width, cross_layers, rank)
        self.top = mlp([width] + list(top), False)

    def forward(self, dense, ids, offsets, bf16):
        embs = [e(ids[t], offsets) for t, e in enumerate(self.embs)]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            x = self.bottom(dense)
            dt = torch.bfloat16 if bf16 else torch.float32
            x0 = torch.cat([x.to(dt)] + [e.to(dt) for e in embs], dim=1)
            return self.top(self.cross(x0)).float().squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="55296")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--tf32", action="store_true")
    ap.add_argument("--max-rows", type=int, default=-1)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    dev = torch.device("cuda")
    cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in KAGGLE]
    torch.manual_seed(1)
    t0 = time.time()
    with torch.device(dev):  # parameters created and initialised on the GPU
        model = DCNv2(cards)
    print(f"built in {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}", flush=True)
    sparse = [p for e in model.embs for p in e.parameters()]
    dense = [p for n, p in model.named_parameters() if not n.startswith("embs.")]
    if args.optimizer == "adagrad":
        opts = [torch.optim.Adagrad(dense, lr=args.lr, eps=1e-8),
                torch.optim.Adagrad(sparse, lr=args.lr, eps=1e-8)]
    else:
        opts = [torch.optim.SGD(dense, lr=args.lr), torch.optim.SGD(sparse, lr=args.lr)]
    loss_fn = nn.BCEWithLogitsLoss()
    card_t = torch.tensor(cards, device=dev).unsqueeze(1)
    precision = "bf16-autocast" if args.bf16 else ("tf32" if args.tf32 else "fp32")
    for B in [int(b) for b in args.batch.split(",")]:
        batches = []
        for _ in range(args.batches):
            dense_x = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev)))
            ids = (torch.rand(len(cards), B, device=dev, dtype=torch.float64) * card_t).long()
            ids = torch.minimum(ids, card_t - 1)
            labels = (torch.rand(B, device=dev) < 0.25).float()
            batches.append((dense_x, ids, labels))
        offsets = torch.arange(B, device=dev)

        def step(i):
            dense_x, ids, labels = batches[i % len(batches)]
            for o in opts:
                o.zero_grad(set_to_none=True)
            loss = loss_fn(model(dense_x, ids, offsets, args.bf16), labels)
            loss.backward()
            for o in opts:
                o.step()
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
        print(f"pytorch gpu train: dcnv2 {precision} {args.optimizer} batch={B} "
              f"steps={args.steps} ms/iter={ms:.3f} samples/s={B / ms * 1e3:.0f} "
              f"loss={loss.item():.4f} peak_mem={torch.cuda.max_memory_allocated() / 1e9:.2f} GB",
              flush=True)


if __name__ == "__main__":
    main()
