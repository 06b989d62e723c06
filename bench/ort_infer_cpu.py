"""The end-to-end CPU peer of `dlrec bench infer --device cpu`: ONNX Runtime (the pinned
onnxruntime of requirements-test.txt) on the same model, exported by `dlrec export --onnx`, in
fp32 and quantized the way an ORT user does it (`onnxruntime.quantization.quantize_dynamic`:
per-channel int8 weights, activations quantized per call).

    python3 bench/ort_infer_cpu.py --model DIR [--batch 1,256,2048] [--iters 50] [--threads 2]

DIR holds model.onnx and model.json (the tables' cardinalities, for valid ids). Prints, per
variant and batch, the median latency and samples/s over --iters calls after 5 warm-up calls,
on --batches distinct random batches rotated (as dlrec bench infer).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,256,2048")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--batches", type=int, default=8)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    layout = json.load(open(os.path.join(a.model, "model.json")))["layout"]
    cards, nd = layout["cardinalities"], layout["num_dense"]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    rng = np.random.default_rng(1)
    print(f"onnxruntime {ort.__version__}, threads {a.threads}")
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(a.model, "model.onnx")
        i8 = os.path.join(tmp, "model_int8.onnx")
        quantize_dynamic(f32, i8, per_channel=True, weight_type=QuantType.QInt8)
        for name, path in (("fp32", f32), ("int8 dynamic", i8)):
            s = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            for batch in (int(b) for b in a.batch.split(",")):
                feeds = [{"dense": rng.standard_normal((batch, nd)).astype(np.float32),
                          "cat": np.stack([rng.integers(0, c, batch) for c in cards],
                                          axis=1).astype(np.int64)}
                         for _ in range(a.batches)]
                for i in range(5):
                    s.run(["probability"], feeds[i % len(feeds)])
                us = []
                for i in range(a.iters):
                    t = time.perf_counter()
                    s.run(["probability"], feeds[i % len(feeds)])
                    us.append((time.perf_counter() - t) * 1e6)
                p50 = statistics.median(us)
                print(f"ort {name}: batch={batch} iters={a.iters} p50_us={p50:.1f} "
                      f"samples/s={batch / (statistics.mean(us) / 1e6):.0f}", flush=True)


if __name__ == "__main__":
    main()
