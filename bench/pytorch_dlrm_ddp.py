#!/usr/bin/env python3
"""Plain-PyTorch peer of dlrec's multi-GPU training (issue 18): the MLPerf DLRM v1 model across N
processes, one per GPU, as an expert writes it without TorchRec:

- embeddings model-parallel, table-wise: each rank owns whole tables (greedy by bytes), held in
  ONE nn.EmbeddingBag per rank (its tables' rows concatenated, ids shifted by each table's row
  offset: one lookup kernel and one sparse SGD update per step, like a fused table batch);
- ids to their owners and pooled vectors back by all-to-all (torch.distributed.nn's
  differentiable all_to_all_single, so the backward sends the pooled gradients back the same way);
- bottom and top MLPs data-parallel under DistributedDataParallel (bucketed all-reduce overlapped
  with the backward);
- SGD (sparse for the tables), BCE with logits; --bf16 runs the MLPs and the interaction under
  bf16 autocast (tables fp32, as in bench/pytorch_dlrm_gpu.py).

Each rank holds a local batch (weak scaling: --local-batch rows per GPU) of dense features, ids of
every table and labels, pre-generated on its device and rotated. Timed with CUDA events after a
warm-up; rank 0 prints the global samples/s.

  torchrun --nproc_per_node N bench/pytorch_dlrm_ddp.py [--local-batch 55296] [--steps 50]
      [--warmup 10] [--bf16] [--cards kaggle|1tb|small] [--device cuda|cpu]

--device cpu (gloo) runs the same code on the CPU with small tables, to check the script.
"""
import argparse
import math
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch_common import (KAGGLE, TB, dense_step, init_ranks, mlp, place_tables,
                          pooled_to_rows, time_steps)

SMALL = [min(c, 1000) for c in KAGGLE]


class ShardedTables(nn.Module):
    """This rank's tables as one EmbeddingBag; lookup of the global batch's ids of its tables."""

    def __init__(self, cards, mine, dim, device):
        super().__init__()
        self.mine = mine
        rows = [cards[t] for t in mine]
        self.register_buffer("base", torch.tensor([0] + rows[:-1], device=device).cumsum(0))
        self.bag = nn.EmbeddingBag(max(1, sum(rows)), dim, mode="sum", sparse=True,
                                   device=device)
        with torch.no_grad():  # each table uniform in +-sqrt(1/rows), as the single-GPU peer
            for t, start in zip(mine, self.base.tolist()):
                a = math.sqrt(1.0 / cards[t])
                self.bag.weight[start:start + cards[t]].uniform_(-a, a)

    def forward(self, ids):
        # ids [T_mine, B_global] (one id per table and row) -> pooled [B_global, T_mine, dim]
        t, b = ids.shape
        flat = (ids + self.base.unsqueeze(1)).t().reshape(-1)  # row-major: sample, then table
        offsets = torch.arange(0, b * t, device=ids.device)
        return self.bag(flat, offsets).view(b, t, -1)


class Dense(nn.Module):
    """Bottom MLP, dot interaction (strict lower triangle) and top MLP: the DDP part."""

    def __init__(self, n_tables, dim=128, bottom=(512, 256, 128), top=(1024, 1024, 512, 256, 1)):
        super().__init__()
        self.bottom = mlp([13] + list(bottom), True)
        n = n_tables + 1
        self.top = mlp([dim + n * (n - 1) // 2] + list(top), False)
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)

    def forward(self, dense, pooled, bf16):
        dev = dense.device.type
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            x = self.bottom(dense)
            z = torch.cat([x.unsqueeze(1).to(pooled.dtype), pooled], dim=1)  # [B, n, d]
            zz = torch.bmm(z, z.transpose(1, 2))
            r = torch.cat([x.to(zz.dtype), zz[:, self.li, self.lj]], dim=1)
            return self.top(r).float().squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local-batch", type=int, default=55296)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--cards", choices=["kaggle", "1tb", "small"], default="kaggle")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    rank, world, local, dev = init_ranks(cuda)
    cards = {"kaggle": KAGGLE, "1tb": TB, "small": SMALL}[args.cards]
    T, B, dim = len(cards), args.local_batch, 128
    owner, load = place_tables(cards, world)
    mine = [t for t in range(T) if owner[t] == rank]
    # The pooled vectors a rank receives come ordered by owner, then by table: the interaction
    # sees the tables in that order on every rank (any fixed order gives the same model).
    order = [t for r in range(world) for t in range(T) if owner[t] == r]
    counts = [sum(1 for t in range(T) if owner[t] == r) for r in range(world)]
    torch.manual_seed(1 + rank)
    t0 = time.time()
    tables = ShardedTables(cards, mine, dim, dev)
    torch.manual_seed(1)  # the same dense initialisation on every rank (DDP also broadcasts)
    dense_model = DDP(Dense(T).to(dev), device_ids=[local] if cuda else None,
                      gradient_as_bucket_view=True)
    if rank == 0:
        print(f"world {world}, tables per rank {counts}, rows per rank {load}, built in "
              f"{time.time() - t0:.1f} s", flush=True)
    opt_dense = torch.optim.SGD(dense_model.parameters(), lr=args.lr)
    opt_sparse = torch.optim.SGD(tables.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    card_t = torch.tensor(cards, device=dev).unsqueeze(1)
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    batches = []
    for _ in range(args.batches):
        dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev, generator=g)))
        ids = (torch.rand(T, B, device=dev, dtype=torch.float64, generator=g) * card_t).long()
        ids = torch.minimum(ids, card_t - 1)
        labels = (torch.rand(B, device=dev, generator=g) < 0.25).float()
        # Ids grouped by owner (the all-to-all's send order): [T, B] rows in `order`.
        batches.append((dense, ids[order].contiguous(), labels))

    def step(i):
        dense, ids_by_owner, labels = batches[i % len(batches)]
        # 1. ids to their owners: rank r receives [T_r, B] from every rank -> [T_r, world * B].
        recv = torch.empty(world * len(mine) * B, dtype=ids_by_owner.dtype, device=dev)
        dist.all_to_all_single(recv, ids_by_owner.view(-1),
                               output_split_sizes=[len(mine) * B] * world,
                               input_split_sizes=[c * B for c in counts])
        my_ids = recv.view(world, len(mine), B).permute(1, 0, 2).reshape(len(mine), world * B)
        # 2. pooled vectors of the global batch for my tables, back to the rows' ranks.
        pooled = tables(my_ids)  # [world * B, T_mine, d], rows in rank order
        send = pooled.view(world, B, len(mine), dim).reshape(-1)
        pooled_rows = pooled_to_rows(send, B, T, dim, counts, len(mine), world, dev)
        return dense_step(dense_model, dense, pooled_rows, args.bf16, loss_fn, labels,
                          (opt_dense, opt_sparse))

    ms, loss = time_steps(step, args.warmup, args.steps, cuda)
    dist.barrier()
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    if rank == 0:
        print(f"pytorch ddp train: mlperf-dlrm cards={args.cards} "
              f"{'bf16-autocast' if args.bf16 else 'fp32'} sgd world={world} local_batch={B} "
              f"steps={args.steps} ms/iter={ms:.3f} samples/s={world * B / ms * 1e3:.0f} "
              f"loss={loss.item():.4f} peak_mem_rank0={peak:.2f} GB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
