#!/usr/bin/env python3
"""NCCL all-to-all and all-reduce bandwidth on this host's GPUs, through torch.distributed (issue
18's "achieved all-to-all bandwidth next to the NCCL all-reduce bus bandwidth").

  python3 -m torch.distributed.run --nproc_per_node N bench/nccl_bandwidth.py [--mb 64,256]

Per message size (MB per rank) it times --iters calls after --warmup (CUDA events, rank 0
prints): algorithm bandwidth = bytes per rank / time; bus bandwidth as nccl-tests defines it:
all-reduce x 2(N-1)/N, all-to-all x (N-1)/N (the part that crosses GPUs).
"""
import argparse

import torch
import torch.distributed as dist

from torch_common import init_ranks


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dist.barrier()
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1e3 / iters  # seconds per call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="16,64,256")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    rank, n, _, _ = init_ranks(cuda=True)
    for mb in [int(x) for x in a.mb.split(",")]:
        elems = (mb << 20) // 2 // n * n  # bf16, divisible by the ranks
        x = torch.ones(elems, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        t_a2a = timed(lambda: dist.all_to_all_single(y, x), a.iters, a.warmup)
        t_ar = timed(lambda: dist.all_reduce(x), a.iters, a.warmup)
        nbytes = elems * 2
        if rank == 0:
            print(f"nccl bandwidth: ranks={n} MB_per_rank={nbytes / 2**20:.0f} "
                  f"all_to_all {t_a2a * 1e3:.3f} ms algbw={nbytes / t_a2a / 1e9:.1f} GB/s "
                  f"busbw={nbytes / t_a2a / 1e9 * (n - 1) / n:.1f} GB/s | "
                  f"all_reduce {t_ar * 1e3:.3f} ms algbw={nbytes / t_ar / 1e9:.1f} GB/s "
                  f"busbw={nbytes / t_ar / 1e9 * 2 * (n - 1) / n:.1f} GB/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
