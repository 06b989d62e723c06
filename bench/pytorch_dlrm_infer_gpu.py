#!/usr/bin/env python3
"""PyTorch peer of `dlrec bench infer --device cuda`: MLPerf DLRM inference replayed from a CUDA graph.

The model of bench/pytorch_dlrm_gpu.py (imported from it), converted to bf16 as a whole (tables,
MLPs and interaction; --fp32 keeps fp32), in eval mode under torch.no_grad, captured once per
batch size with torch.cuda.CUDAGraph on static input tensors. Each timed call does what the dlrec
engine's call does: copy the batch from pinned host memory into the static inputs, replay the
graph, copy the probabilities back to host memory, synchronize. Latency per call (host clock)
gives p50/p90/p99; --no-copies replays the graph alone (inputs already on the device).

  python3 bench/pytorch_dlrm_infer_gpu.py [--batch 1,2048,32768] [--iters 200] [--fp32]
      [--build-on cpu|cuda]     (cuda: the model made on the GPU, a faster start; see
                                 pytorch_dlrm_gpu.py)
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_dlrm_gpu import KAGGLE, build_model  # noqa: E402
from torch_common import time_calls  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", default="1,2048,32768")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--fp32", action="store_true")
    ap.add_argument("--no-copies", action="store_true")
    ap.add_argument("--build-on", choices=["cpu", "cuda"], default="cpu",
                    help="where the model is created and initialised (cuda: much faster start)")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    torch.manual_seed(1)
    t0 = time.time()
    model = build_model(KAGGLE, dev, args.build_on).eval()
    dtype = torch.float32 if args.fp32 else torch.bfloat16
    model = model.to(dtype)
    print(f"built in {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}", flush=True)
    card_t = torch.tensor(KAGGLE).unsqueeze(1)
    for B in [int(b) for b in args.batch.split(",")]:
        dense_h = torch.rand(B, 13).mul_(3.0).exp_().log1p_().to(dtype).pin_memory()
        ids_h = torch.minimum((torch.rand(len(KAGGLE), B, dtype=torch.float64) * card_t).long(),
                              card_t - 1).pin_memory()
        out_h = torch.empty(B, dtype=torch.float32).pin_memory()
        dense = dense_h.to(dev)
        ids = ids_h.to(dev)
        offsets = torch.arange(B, device=dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):  # warm up before capture
                model(dense, ids, offsets, False)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            probs = torch.sigmoid(model(dense, ids, offsets, False).float())

        def call():
            if not args.no_copies:
                dense.copy_(dense_h, non_blocking=True)
                ids.copy_(ids_h, non_blocking=True)
            g.replay()
            if not args.no_copies:
                out_h.copy_(probs, non_blocking=True)
            torch.cuda.synchronize()

        p50, p90, p99, total = time_calls(call, args.warmup, args.iters)
        print(f"pytorch infer: {'fp32' if args.fp32 else 'bf16'} cuda-graph "
              f"{'no-copies' if args.no_copies else 'with-copies'} batch={B} iters={args.iters} "
              f"p50_us={p50:.1f} p90_us={p90:.1f} p99_us={p99:.1f} "
              f"samples/s={B * args.iters / total:.0f}", flush=True)


if __name__ == "__main__":
    main()
