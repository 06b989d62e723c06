#!/usr/bin/env python3
"""A PyTorch DLRM training loop with dlrec's EmbeddingCollection against the same loop with
nn.EmbeddingBag(sparse=True) + SGD (issue 23 item 2; docs/PYTHON.md, "dlrec.torch").

Model: the MLPerf DLRM v1 sizes of configs/mlperf_dlrm.json (embedding dim 128, bottom
13-512-256-128, top 1024-1024-512-256-1, dot interaction, strict lower triangle), the 26 Criteo
Kaggle tables (bench/pytorch_dlrm_gpu.py's cardinalities), one id per table, BCE-with-logits,
SGD (lr 0.01) for the dense part in both loops. The only difference between the loops is the
embedding layer: 26 nn.EmbeddingBag(sparse=True) updated by torch.optim.SGD, or one
dlrec.torch.EmbeddingCollection updated inside dlrec during backward. Both start from the same
weights (dlrec's tables are loaded from the torch model's) and see the same batches.

  (a) parity: fp32 (TF32 off), --parity-steps steps at --parity-batch: the largest |loss
      difference| over the steps (target <= 1e-4).
  (b) speed: bf16 autocast for the MLPs and the interaction, ms/step at each --batch (CUDA
      events, warm-up excluded), dlrec with check_ids on (a stream wait per step for the id
      check) and off, and with dtype=torch.bfloat16 (bf16 pooled rows and gradients).
  --breakdown: the embedding layers alone and the dense part alone, per batch size.

  python3 bench/pytorch_dlrec_embedding.py [--device cuda] [--library PATH]
"""
import argparse
import copy
import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch_common import mlp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
DIM = 128


class Dense(nn.Module):
    """Bottom MLP, dot interaction and top MLP over the pooled embeddings [B, T, DIM]."""

    def __init__(self, tables):
        super().__init__()
        self.bottom = mlp([13, 512, 256, DIM], True)
        n = tables + 1
        self.top = mlp([DIM + n * (n - 1) // 2, 1024, 1024, 512, 256, 1], False)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, pooled, bf16):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            x = self.bottom(dense)
            z = torch.cat([x.to(pooled.dtype).unsqueeze(1), pooled], dim=1)
            zz = torch.bmm(z, z.transpose(1, 2))
            tri = zz[:, self.li, self.lj]
            r = torch.cat([x.to(tri.dtype), tri], dim=1)
            return self.top(r).float().squeeze(1)


class TorchDLRM(nn.Module):
    def __init__(self, cards, dense):
        super().__init__()
        self.embs = nn.ModuleList()
        for c in cards:
            e = nn.EmbeddingBag(c, DIM, mode="sum", sparse=True)
            a = math.sqrt(1.0 / c)
            nn.init.uniform_(e.weight, -a, a)
            self.embs.append(e)
        self.dense = dense

    def forward(self, dense, ids, bf16):  # ids [T, B]
        B = ids.shape[1]
        offsets = torch.arange(B, device=ids.device)
        pooled = torch.stack([e(ids[t], offsets) for t, e in enumerate(self.embs)], dim=1)
        return self.dense(dense, pooled, bf16)


class DlrecDLRM(nn.Module):
    def __init__(self, torch_model, lr, device, library, check_ids):
        super().__init__()
        from dlrec.torch import EmbeddingCollection
        cards = [e.num_embeddings for e in torch_model.embs]
        self.embs = EmbeddingCollection(
            tables=[{"name": f"C{t + 1}", "rows": c, "dim": DIM} for t, c in enumerate(cards)],
            optimizer={"kind": "sgd", "lr": lr}, device=device, check_ids=check_ids,
            library=library)
        for t, e in enumerate(torch_model.embs):
            self.embs.load_table(t, e.weight.detach())
        self.dense = copy.deepcopy(torch_model.dense)

    def forward(self, dense, ids, bf16):
        T, B = ids.shape
        pooled = self.embs(ids.reshape(-1), self.offsets(T, B, ids.device)).view(B, T, DIM)
        return self.dense(dense, pooled, bf16)

    def offsets(self, T, B, dev):
        key = (T, B)
        if getattr(self, "_off_key", None) != key:
            self._off = torch.arange(T * B + 1, device=dev)
            self._off_key = key
        return self._off


def make_batches(cards, B, n, dev, seed):
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    card_t = torch.tensor(cards, device=dev).unsqueeze(1)
    out = []
    for _ in range(n):
        dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev, generator=g)))
        ids = (torch.rand(len(cards), B, device=dev, dtype=torch.float64, generator=g)
               * card_t).long()
        ids = torch.minimum(ids, card_t - 1)
        # Labels that depend on the inputs, so that the loss moves.
        labels = (torch.rand(B, device=dev, generator=g) < 0.25).float()
        out.append((dense, ids, labels))
    return out


def trainer(model, lr, bf16):
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=lr)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(batch):
        dense, ids, labels = batch
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(dense, ids, bf16), labels)
        loss.backward()
        opt.step()
        return loss
    return step


def parity(args, cards, dev):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    with torch.device(dev):
        tm = TorchDLRM(cards, Dense(len(cards)))
    dm = DlrecDLRM(tm, args.lr, dev, args.library, True)
    batches = make_batches(cards, args.parity_batch, 16, dev, 5)
    ts, ds = trainer(tm, args.lr, False), trainer(dm, args.lr, False)
    worst, first, last = 0.0, None, None
    for i in range(args.parity_steps):
        b = batches[i % len(batches)]
        lt, ld = ts(b).item(), ds(b).item()
        worst = max(worst, abs(lt - ld))
        first = first or (lt, ld)
        last = (lt, ld)
    print(f"parity fp32 batch={args.parity_batch} steps={args.parity_steps}: "
          f"max |loss_torch - loss_dlrec| = {worst:.3e} (first {first[0]:.6f} vs {first[1]:.6f}, "
          f"last {last[0]:.6f} vs {last[1]:.6f})", flush=True)
    del tm, dm
    torch.cuda.empty_cache()
    return worst


def timed(step, batches, warmup, steps):
    for i in range(warmup):
        step(batches[i % len(batches)])
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for i in range(steps):
        loss = step(batches[i % len(batches)])
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / steps, loss.item()


def speed(args, cards, dev):
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.manual_seed(2)
    with torch.device(dev):
        tm = TorchDLRM(cards, Dense(len(cards)))
    dm = DlrecDLRM(tm, args.lr, dev, args.library, True)
    for B in [int(b) for b in args.batch.split(",")]:
        batches = make_batches(cards, B, 8, dev, 9)
        ms_t, loss_t = timed(trainer(tm, args.lr, True), batches, args.warmup, args.steps)
        dm.embs.check_ids = True
        ms_d, loss_d = timed(trainer(dm, args.lr, True), batches, args.warmup, args.steps)
        dm.embs.check_ids = False
        ms_n, loss_n = timed(trainer(dm, args.lr, True), batches, args.warmup, args.steps)
        dm.embs.dtype = torch.bfloat16  # bf16 pooled rows and gradients (no casts around it)
        ms_b, loss_b = timed(trainer(dm, args.lr, True), batches, args.warmup, args.steps)
        dm.embs.dtype, dm.embs.check_ids = torch.float32, True
        print(f"bf16 batch={B} steps={args.steps}: torch EmbeddingBag(sparse)+SGD "
              f"{ms_t:.3f} ms/step; dlrec EmbeddingCollection {ms_d:.3f} ms/step "
              f"(check_ids on, {ms_t / ms_d:.2f}x), {ms_n:.3f} ms/step (check_ids off, "
              f"{ms_t / ms_n:.2f}x), {ms_b:.3f} ms/step (check_ids off, dtype bf16, "
              f"{ms_t / ms_b:.2f}x); last losses {loss_t:.4f} / {loss_d:.4f} / {loss_n:.4f} / "
              f"{loss_b:.4f}", flush=True)


def breakdown(args, cards, dev):
    """Where a bf16 step's time goes: the embedding layer alone (lookup, backward and sparse
    update, dL/dpooled given) for each implementation, and the dense part alone (the same in
    both loops, fed fixed pooled rows)."""
    torch.manual_seed(3)
    with torch.device(dev):
        tm = TorchDLRM(cards, Dense(len(cards)))
    dm = DlrecDLRM(tm, args.lr, dev, args.library, False)
    T = len(cards)
    for B in [int(b) for b in args.batch.split(",")]:
        batches = make_batches(cards, B, 8, dev, 11)
        g = torch.randn(B, T, DIM, device=dev) * 1e-3
        emb_opt = torch.optim.SGD([e.weight for e in tm.embs], lr=args.lr)
        offsets = torch.arange(B, device=dev)

        def torch_emb(batch):
            emb_opt.zero_grad(set_to_none=True)
            pooled = torch.stack([e(batch[1][t], offsets) for t, e in enumerate(tm.embs)], 1)
            pooled.backward(g)
            emb_opt.step()
            return pooled.sum()

        def dlrec_emb(batch):
            ids = batch[1]
            pooled = dm.embs(ids.reshape(-1), dm.offsets(T, B, dev)).view(B, T, DIM)
            pooled.backward(g)
            return pooled.sum()

        fixed = torch.randn(B, T, DIM, device=dev) * 0.05
        dense_opt = torch.optim.SGD(tm.dense.parameters(), lr=args.lr)
        loss_fn = nn.BCEWithLogitsLoss()

        def dense_only(batch):
            dense_opt.zero_grad(set_to_none=True)
            loss = loss_fn(tm.dense(batch[0], fixed, True), batch[2])
            loss.backward()
            dense_opt.step()
            return loss
        ms_te, _ = timed(torch_emb, batches, args.warmup, args.steps)
        ms_de, _ = timed(dlrec_emb, batches, args.warmup, args.steps)
        ms_dense, _ = timed(dense_only, batches, args.warmup, args.steps)
        print(f"breakdown batch={B}: embedding layer alone (forward + backward + update): torch "
              f"{ms_te:.3f} ms, dlrec {ms_de:.3f} ms ({ms_te / ms_de:.2f}x); dense part alone "
              f"(bf16 MLPs + interaction + SGD, both loops) {ms_dense:.3f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--library", default=None, help="libdlrec_torch.so (default: the package's)")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--parity-batch", type=int, default=4096)
    ap.add_argument("--parity-steps", type=int, default=200)
    ap.add_argument("--batch", default="32768")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--max-rows", type=int, default=-1, help="cap the cardinalities (smoke runs)")
    ap.add_argument("--skip", choices=["none", "parity", "speed"], default="none")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time the embedding layers alone and the dense part alone")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in KAGGLE]
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(dev)}; tables: "
          f"{len(cards)} Kaggle ({sum(cards)} rows x {DIM})", flush=True)
    t0 = time.time()
    worst = parity(args, cards, dev) if args.skip != "parity" else None
    if args.skip != "speed":
        speed(args, cards, dev)
    if args.breakdown:
        breakdown(args, cards, dev)
    print(f"total {time.time() - t0:.1f} s", flush=True)
    if worst is not None and worst > 1e-4:
        print(f"FAIL: losses differ by {worst:.3e} > 1e-4", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
