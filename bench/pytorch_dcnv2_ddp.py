#!/usr/bin/env python3
"""Plain-PyTorch peer of dlrec's multi-GPU DCNv2 training (issue 19, item 2): the MLPerf
DLRM-DCNv2 model with multi-hot inputs across N processes, one per GPU, written as an expert
writes it without TorchRec (the sibling of bench/pytorch_dlrm_ddp.py, which has the DLRM v1):

- embeddings model-parallel, table-wise: each rank owns whole tables (greedy by bytes), held in
  ONE nn.EmbeddingBag per rank (its tables' rows concatenated, ids shifted by each table's row
  offset): one sum-pooled lookup of every (sample, table) bag and one sparse Adagrad update per
  step, like a fused table batch;
- multi-hot: table t has a fixed number h_t of ids per sample (the MLPerf sizes, 214 per row);
  a rank's ids for an owner are [B, sum of h_t over the owner's tables], sent by one all-to-all;
- pooled vectors back by all-to-all (torch.distributed.nn's differentiable all_to_all_single, so
  the backward sends the pooled gradients to the owners the same way);
- bottom MLP, 3 low-rank (512) cross layers and the top MLP data-parallel under
  DistributedDataParallel (bucketed all-reduce overlapped with the backward);
- Adagrad (lr 0.004, eps 1e-8; sparse for the tables), BCE with logits; --bf16 runs the dense
  part under bf16 autocast (tables fp32, as dlrec's).

Each rank holds a local batch (weak scaling: --local-batch rows per GPU) of dense features, ids
of every table (power-law: P(id) ~ 1/(id+1), as `dlrec bench train --dist zipf`) and labels,
pre-generated on its device and rotated. Timed with CUDA events after a warm-up; rank 0 prints
the global samples/s and every rank's peak memory.

  torchrun --nproc_per_node N bench/pytorch_dcnv2_ddp.py [--local-batch 13824] [--steps 30]
      [--warmup 5] [--bf16] [--max-rows R] [--device cuda|cpu]

--max-rows caps every table (the full tables, 105 GB plus as much Adagrad state, do not fit
table-wise on four 80 GB GPUs: two GPUs would hold two 40M-row tables, 82 GB with state).
--device cpu (gloo) runs the same code on the CPU with small tables, to check the script.
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_common import DCNV2 as CARDS
from torch_common import DCNV2_HOT as HOT
from torch_common import dense_step, init_ranks, mlp, place_tables, pooled_to_rows, time_steps


class ShardedTables(nn.Module):
    """This rank's tables as one EmbeddingBag; sum-pools the global batch's bags of its tables."""

    def __init__(self, cards, hot, mine, dim, device):
        super().__init__()
        self.mine = mine
        rows = [cards[t] for t in mine]
        base = [0]
        for r in rows[:-1]:
            base.append(base[-1] + r)
        # The row offset of every id column ([H_mine]: table t's base repeated h_t times).
        shift = [b for t, b in zip(mine, base) for _ in range(hot[t])]
        self.register_buffer("shift", torch.tensor(shift, dtype=torch.long, device=device))
        # Bag starts inside one sample's H_mine ids: the cumulative hotness of its tables.
        starts = [0]
        for t in mine[:-1]:
            starts.append(starts[-1] + hot[t])
        self.register_buffer("starts", torch.tensor(starts, dtype=torch.long, device=device))
        self.h_mine = sum(hot[t] for t in mine)
        self.bag = nn.EmbeddingBag(max(1, sum(rows)), dim, mode="sum", sparse=True,
                                   device=device)
        with torch.no_grad():  # each table uniform in +-sqrt(1/rows)
            for t, start in zip(mine, base):
                a = math.sqrt(1.0 / cards[t])
                self.bag.weight[start:start + cards[t]].uniform_(-a, a)

    def forward(self, ids):
        # ids [B_global, H_mine] -> pooled [B_global, T_mine, dim]
        b = ids.shape[0]
        flat = (ids + self.shift).reshape(-1)
        offsets = (torch.arange(b, device=ids.device).unsqueeze(1) * self.h_mine +
                   self.starts).reshape(-1)
        return self.bag(flat, offsets).view(b, len(self.mine), -1)


class LowRankCross(nn.Module):
    """DCNv2 cross layers: x_{l+1} = x0 * (U (V x_l) + b) + x_l, V: d -> r, U: r -> d."""

    def __init__(self, d, rank, layers):
        super().__init__()
        self.v = nn.ModuleList(nn.Linear(d, rank, bias=False) for _ in range(layers))
        self.u = nn.ModuleList(nn.Linear(rank, d) for _ in range(layers))

    def forward(self, x0):
        x = x0
        for v, u in zip(self.v, self.u):
            x = x0 * u(v(x)) + x
        return x


class Dense(nn.Module):
    """Bottom MLP, concat, 3 low-rank cross layers and the top MLP: the DDP part."""

    def __init__(self, n_tables, dim=128, bottom=(512, 256, 128), top=(1024, 1024, 512, 256, 1)):
        super().__init__()
        self.bottom = mlp([13] + list(bottom), True)
        d = dim + n_tables * dim
        self.cross = LowRankCross(d, 512, 3)
        self.top = mlp([d] + list(top), False)

    def forward(self, dense, pooled, bf16):
        with torch.autocast(dense.device.type, dtype=torch.bfloat16, enabled=bf16):
            x = self.bottom(dense)
            b = x.shape[0]
            x0 = torch.cat([x, pooled.reshape(b, -1).to(x.dtype)], dim=1)
            return self.top(self.cross(x0)).float().squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local-batch", type=int, default=13824)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.004)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--max-rows", type=int, default=0, help="cap every table (0: none)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    rank, world, local, dev = init_ranks(cuda)
    cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in CARDS]
    T, B, dim = len(cards), args.local_batch, 128
    owner, load = place_tables(cards, world)
    mine = [t for t in range(T) if owner[t] == rank]
    # Pooled vectors arrive ordered by owner, then table: the concat sees the tables in that
    # order on every rank (any fixed order gives the same model).
    order = [t for r in range(world) for t in range(T) if owner[t] == r]
    counts = [sum(1 for t in range(T) if owner[t] == r) for r in range(world)]
    hot_of = [sum(HOT[t] for t in range(T) if owner[t] == r) for r in range(world)]
    torch.manual_seed(1 + rank)
    t0 = time.time()
    tables = ShardedTables(cards, HOT, mine, dim, dev)
    torch.manual_seed(1)  # the same dense initialisation on every rank (DDP also broadcasts)
    dense_model = DDP(Dense(T).to(dev), device_ids=[local] if cuda else None,
                      gradient_as_bucket_view=True)
    if rank == 0:
        print(f"world {world}, tables per rank {counts}, ids per sample per rank {hot_of}, "
              f"rows per rank {load}, built in {time.time() - t0:.1f} s", flush=True)
    opt_dense = torch.optim.Adagrad(dense_model.parameters(), lr=args.lr, eps=1e-8)
    opt_sparse = torch.optim.Adagrad(tables.parameters(), lr=args.lr, eps=1e-8)
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    batches = []
    for _ in range(args.batches):
        dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev, generator=g)))
        cols = []
        for t in order:  # [B, h_t] power-law ids, grouped by owner (the all-to-all's order)
            u = torch.rand(B, HOT[t], device=dev, dtype=torch.float64, generator=g)
            ids = (torch.exp(u * math.log(cards[t] + 1.0)) - 1).long().clamp_(0, cards[t] - 1)
            cols.append(ids)
        by_owner = torch.cat(cols, dim=1)  # [B, 214]
        send = torch.cat([p.reshape(-1) for p in by_owner.split(hot_of, dim=1)])
        labels = (torch.rand(B, device=dev, generator=g) < 0.25).float()
        batches.append((dense, send.contiguous(), labels))
    h_mine = hot_of[rank]

    def step(i):
        dense, ids_send, labels = batches[i % len(batches)]
        # 1. ids to their owners: rank r receives [B, H_r] from every rank -> [world * B, H_r].
        recv = torch.empty(world * B * h_mine, dtype=ids_send.dtype, device=dev)
        dist.all_to_all_single(recv, ids_send, output_split_sizes=[B * h_mine] * world,
                               input_split_sizes=[B * h for h in hot_of])
        # 2. pooled vectors of the global batch for my tables, back to the rows' ranks.
        pooled = tables(recv.view(world * B, h_mine))  # [world * B, T_mine, d], rank order
        pooled_rows = pooled_to_rows(pooled.reshape(-1), B, T, dim, counts, len(mine), world, dev)
        return dense_step(dense_model, dense, pooled_rows, args.bf16, loss_fn, labels,
                          (opt_dense, opt_sparse))

    ms, loss = time_steps(step, args.warmup, args.steps, cuda)
    peak = torch.tensor([torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0], device=dev)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    if rank == 0:
        print(f"pytorch ddp train: mlperf-dcnv2 multi-hot max_rows={args.max_rows} "
              f"{'bf16-autocast' if args.bf16 else 'fp32'} adagrad world={world} "
              f"local_batch={B} steps={args.steps} ms/iter={ms:.3f} "
              f"samples/s={world * B / ms * 1e3:.0f} "
              f"samples/s/gpu={B / ms * 1e3:.0f} loss={loss.item():.4f} peak_mem_gb="
              + ",".join(f"{p.item():.2f}" for p in peaks), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
