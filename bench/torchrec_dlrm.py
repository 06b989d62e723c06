#!/usr/bin/env python3
"""TorchRec peer of `dlrec bench train`: the MLPerf DLRM v1 model (dim 128, bottom
13-512-256-128, top 1024-1024-512-256-1, dot interaction; 26 tables of the Criteo Kaggle or
Criteo-1TB cardinalities, one id per table), or with --model dcnv2 the MLPerf DLRM-DCNv2 model
(TorchRec's DLRM_DCN: 3 cross layers of low rank 512, top 1024-1024-512-256-1; the MLPerf DCNv2
tables capped at --max-rows rows, 214 ids per row, power-law ids P(id) ~ 1/(id+1) as `dlrec
bench train --dist zipf`), trained with TorchRec as its documentation and examples set it up:

- torchrec.models.dlrm.DLRM / DLRMTrain, its EmbeddingBagCollection built on the meta device and
  sharded by DistributedModelParallel under the plan of TorchRec's EmbeddingShardingPlanner (one
  process per GPU; on one GPU the plan holds every table there);
- the tables' optimizer fused into the backward (apply_optimizer_in_backward: FBGEMM's table
  batched embedding kernels update the rows in the backward pass), --emb-opt sgd, adagrad
  (torch.optim.Adagrad: FBGEMM's EXACT_ADAGRAD, a state value per element, as dlrec's Adagrad)
  or rowwise_adagrad (TorchRec's RowWiseAdagrad: EXACT_ROWWISE_ADAGRAD, one state value per row,
  what TorchRec's examples use); Adagrad's eps 1e-8 as dlrec's; or adam (torch.optim.Adam:
  FBGEMM's ADAM, m and v per element, bias-corrected by the table's step count);
- the dense layers' SGD (--dense-opt adam: torch.optim.Adam, fused) through CombinedOptimizer
  with the fused one; --bf16: the forward under
  bf16 autocast (tables fp32, as dlrec's bf16 runs and bench/pytorch_dlrm_gpu.py);
- input: KeyedJaggedTensor batches (one id per table and row, uniform ids, as `dlrec bench
  train --dist uniform`), pre-generated on the device and rotated; a warm-up, then the timed
  steps with CUDA events, as bench/torch_common.time_steps does.

  torchrun --nproc_per_node N bench/torchrec_dlrm.py [--local-batch 55296] [--steps 50]
      [--warmup 10] [--bf16] [--emb-opt sgd|adagrad|rowwise_adagrad|adam]
      [--dense-opt sgd|adam] [--cards kaggle|1tb]
      [--model dlrm|dcnv2]
      [--max-rows N]

Needs torchrec and fbgemm-gpu (PyPI: torchrec==1.6.1, fbgemm-gpu==1.6.0 for torch 2.11 with
CUDA 13; tensordict==0.15.3, iopath==0.1.9). Carrying fbgemm-gpu to the lent GPU hosts:
bench/torchrec_carry.md.
"""
import argparse
import math
import os
import time

import torch
import torch.distributed as dist

from torch_common import DCNV2, DCNV2_HOT, KAGGLE, TB, time_steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--local-batch", type=int, default=55296)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--emb-opt", choices=["sgd", "adagrad", "rowwise_adagrad", "adam"],
                    default="sgd")
    ap.add_argument("--dense-opt", choices=["sgd", "adam"], default="sgd")
    ap.add_argument("--cards", choices=["kaggle", "1tb"], default="kaggle")
    ap.add_argument("--model", choices=["dlrm", "dcnv2"], default="dlrm")
    ap.add_argument("--max-rows", type=int, default=0, help="cap on each table's rows (dcnv2)")
    args = ap.parse_args()
    dcn = args.model == "dcnv2"

    from fbgemm_gpu.split_embedding_configs import EmbOptimType  # noqa: F401 (fbgemm loads)
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.model_parallel import DistributedModelParallel, get_default_sharders
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device(f"cuda:{local}")
    cards = KAGGLE if args.cards == "kaggle" else TB
    hot = [1] * len(cards)
    if dcn:
        cards = [min(c, args.max_rows) if args.max_rows > 0 else c for c in DCNV2]
        hot = DCNV2_HOT
    T, B, dim = len(cards), args.local_batch, 128
    keys = [f"f{t}" for t in range(T)]

    t0 = time.time()
    tables = [EmbeddingBagConfig(name=f"t{t}", embedding_dim=dim, num_embeddings=c,
                                 feature_names=[keys[t]]) for t, c in enumerate(cards)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    if dcn:
        model = DLRMTrain(DLRM_DCN(
            embedding_bag_collection=ebc, dense_in_features=13,
            dense_arch_layer_sizes=[512, 256, 128], over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
            dcn_num_layers=3, dcn_low_rank_dim=512, dense_device=dev))
    else:
        model = DLRMTrain(DLRM(
            embedding_bag_collection=ebc, dense_in_features=13,
            dense_arch_layer_sizes=[512, 256, 128], over_arch_layer_sizes=[1024, 1024, 512, 256, 1],
            dense_device=dev))
    if args.emb_opt == "rowwise_adagrad":
        from torchrec.optim import RowWiseAdagrad
        apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(),
                                    {"lr": args.lr, "eps": 1e-8})
    elif args.emb_opt == "adam":
        apply_optimizer_in_backward(torch.optim.Adam, model.model.sparse_arch.parameters(),
                                    {"lr": args.lr, "eps": 1e-8})
    elif args.emb_opt == "adagrad":
        apply_optimizer_in_backward(torch.optim.Adagrad, model.model.sparse_arch.parameters(),
                                    {"lr": args.lr, "eps": 1e-8})
    else:
        apply_optimizer_in_backward(torch.optim.SGD, model.model.sparse_arch.parameters(),
                                    {"lr": args.lr})
    planner = EmbeddingShardingPlanner(
        topology=Topology(local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                          world_size=world, compute_device="cuda",
                          hbm_cap=torch.cuda.get_device_properties(dev).total_memory),
        batch_size=B)
    plan = planner.collective_plan(model, get_default_sharders(), dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(module=model, device=dev, plan=plan)
    if args.dense_opt == "adam":
        def make_dense(params):
            return torch.optim.Adam(params, lr=args.lr, fused=True)
    else:
        def make_dense(params):
            return torch.optim.SGD(params, lr=args.lr)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      make_dense)
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])
    if rank == 0:
        kinds = {}
        for _, mod_plan in plan.plan.items():
            for _, ps in mod_plan.items():
                k = f"{ps.sharding_type}/{ps.compute_kernel}"
                kinds[k] = kinds.get(k, 0) + 1
        print(f"torchrec: world {world}, plan sharding types {kinds}, built in "
              f"{time.time() - t0:.1f} s", flush=True)

    card_t = torch.tensor(cards, device=dev).unsqueeze(1)
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    batches = []
    for _ in range(args.batches):
        dense = torch.log1p(torch.exp(3.0 * torch.rand(B, 13, device=dev, generator=g)))
        if dcn:  # hot[t] ids of table t per row, log-uniform: P(id) ~ 1/(id + 1)
            values = []
            for t in range(T):
                u = torch.rand(B * hot[t], device=dev, dtype=torch.float64, generator=g)
                values.append((torch.exp(u * math.log(cards[t] + 1.0)) - 1).long()
                              .clamp_(0, cards[t] - 1))
            values = torch.cat(values)
        else:
            ids = (torch.rand(T, B, device=dev, dtype=torch.float64, generator=g) * card_t).long()
            values = torch.minimum(ids, card_t - 1).reshape(-1)  # [T, B]: key by key
        labels = (torch.rand(B, device=dev, generator=g) < 0.25).float()
        lengths = torch.tensor(hot, dtype=torch.int32, device=dev).repeat_interleave(B)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
        batches.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.bf16):
            loss, _ = dmp(batches[i % len(batches)])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    ms, loss = time_steps(step, args.warmup, args.steps, True)
    dist.barrier()
    peak = torch.cuda.max_memory_allocated() / 1e9
    if rank == 0:
        what = (f"mlperf-dcnv2 max_rows={args.max_rows}" if dcn
                else f"mlperf-dlrm cards={args.cards}")
        print(f"torchrec train: {what} {'bf16-autocast' if args.bf16 else 'fp32'} "
              f"emb-opt={args.emb_opt} dense-opt={args.dense_opt} world={world} local_batch={B} "
              f"steps={args.steps} ms/iter={ms:.3f} samples/s={world * B / ms * 1e3:.0f} "
              f"loss={loss.item():.4f} peak_mem_rank0={peak:.2f} GB", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
