#!/usr/bin/env python3
"""Runs facebookresearch/dlrm's own `dlrm_s_pytorch.py` (the reference the issue names) unmodified.

The dlrm checkout is not part of dlrec: pass its directory with --dlrm. The only help given is
a no-op stand-in for `torch.utils.tensorboard` when the `tensorboard` package is missing (the
reference imports SummaryWriter at start-up but this benchmark never logs to it). Every other
argument after `--` goes to dlrm_s_pytorch.py as is, e.g. the MLPerf DLRM v1 model on random data:

  python3 bench/dlrm_reference.py --dlrm /path/to/dlrm -- --use-gpu --print-time \
      --arch-sparse-feature-size=128 --arch-mlp-bot=13-512-256-128 \
      --arch-mlp-top=1024-1024-512-256-1 --arch-interaction-op=dot \
      --arch-embedding-size=1460-583-10131227-... --data-generation=random \
      --mini-batch-size=32768 --num-batches=40 --print-freq=10 --learning-rate=0.01
"""
import argparse
import os
import runpy
import sys
import types


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dlrm", required=True, help="directory holding dlrm_s_pytorch.py")
    ap.add_argument("rest", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    try:
        import torch.utils.tensorboard  # noqa: F401
    except Exception:
        stub = types.ModuleType("torch.utils.tensorboard")

        class SummaryWriter:  # accepts and ignores everything
            def __init__(self, *args, **kwargs):
                pass

            def __getattr__(self, name):
                return lambda *args, **kwargs: None

        stub.SummaryWriter = SummaryWriter
        sys.modules["torch.utils.tensorboard"] = stub
    script = os.path.join(a.dlrm, "dlrm_s_pytorch.py")
    sys.path.insert(0, a.dlrm)
    sys.argv = [script] + rest
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
