"""Shared by the plain-PyTorch peers (bench/pytorch_*.py): the DLRM reference MLP, the
table-wise placement of the multi-GPU peers, and their pooled-vector exchange, dense step and
timing loop. Imported from the scripts' own directory (python3 bench/<script>.py puts bench/ on
sys.path)."""
import math
import os
import time

import torch
import torch.nn as nn

# The MLPerf tables: the Criteo Kaggle cardinalities (33.8M rows), Criteo-1TB with max_ind_range
# 40M (187.8M rows; MLPerf DLRM v1), and MLPerf DLRM-DCNv2's (204M rows) with its ids per sample.
KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194,
          27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
TB = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
      2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]
DCNV2 = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
         2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]
DCNV2_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def mlp(sizes, relu_last):
    """Linear layers sizes[0] -> ... -> sizes[-1] with ReLU between them (and after the last
    when relu_last); DLRM reference initialisation (as dlrec): W ~ N(0, sqrt(2/(in+out))),
    b ~ N(0, sqrt(1/out))."""
    layers = []
    for i in range(len(sizes) - 1):
        lin = nn.Linear(sizes[i], sizes[i + 1])
        nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (sizes[i] + sizes[i + 1])))
        nn.init.normal_(lin.bias, 0.0, math.sqrt(1.0 / sizes[i + 1]))
        layers.append(lin)
        if i + 2 < len(sizes) or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def init_ranks(cuda):
    """The process group (NCCL on the GPUs, gloo on the CPU) and this process's GPU, its local
    rank (torchrun's LOCAL_RANK), TF32 off; returns rank, world size, local rank, device."""
    import torch.distributed as dist
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))  # set by torchrun
    if cuda:
        torch.cuda.set_device(local)
        torch.backends.cuda.matmul.allow_tf32 = False
    return rank, world, local, torch.device(f"cuda:{local}" if cuda else "cpu")


def place_tables(cards, world):
    """Table-wise plan: each table to the rank with the fewest rows so far (largest first)."""
    owner = [0] * len(cards)
    load = [0] * world
    for t in sorted(range(len(cards)), key=lambda t: -cards[t]):
        r = min(range(world), key=lambda r: load[r])
        owner[t] = r
        load[r] += cards[t]
    return owner, load


def pooled_to_rows(send, B, T, dim, counts, n_mine, world, dev):
    """This rank's pooled vectors of the global batch (`send`, flat, rows in rank order) back to
    the ranks of the rows by all-to-all (torch.distributed.nn's differentiable one, so the
    backward sends the pooled gradients to the owners the same way); returns [B, T, dim], the
    tables of rank 0's, then rank 1's, ... (counts[r] tables each)."""
    import torch.distributed.nn.functional as dnn
    got = dnn.all_to_all_single(torch.empty(B * T * dim, device=dev, dtype=send.dtype), send,
                                output_split_sizes=[B * c * dim for c in counts],
                                input_split_sizes=[B * n_mine * dim] * world)
    parts = [p.view(B, c, dim) for p, c in zip(got.split([B * c * dim for c in counts]), counts)]
    return torch.cat(parts, dim=1)


def dense_step(dense_model, dense, pooled, bf16, loss_fn, labels, optimizers):
    """The dense model's forward on the pooled vectors, the loss, its backward and every
    optimizer's step; returns the loss."""
    logits = dense_model(dense, pooled, bf16)
    loss = loss_fn(logits, labels)
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    loss.backward()
    for opt in optimizers:
        opt.step()
    return loss


def time_steps(step, warmup, steps, cuda):
    """step(i) for `warmup` untimed steps, then `steps` timed ones (CUDA events on the GPU, else
    wall time); returns (ms per step, the last step's result)."""
    for i in range(warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    wall = time.time()
    for i in range(steps):
        result = step(i)
    if cuda:
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / steps
    else:
        ms = (time.time() - wall) * 1e3 / steps
    return ms, result


def time_calls(call, warmup, iters):
    """call() `warmup` times untimed, then `iters` times, each on the host clock (a serving
    call: its own synchronisation inside); returns (p50, p90, p99 in µs (nearest rank),
    seconds of the timed calls)."""
    for _ in range(warmup):
        call()
    lat = []
    t_all = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        call()
        lat.append((time.perf_counter() - t) * 1e6)
    total = time.perf_counter() - t_all
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * (len(lat) - 1) + 0.5))]  # noqa: E731
    return q(0.5), q(0.9), q(0.99), total
