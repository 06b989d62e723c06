"""The CPU peer of bench_int8_cpu: ONNX Runtime (requirements-test.txt's pinned onnxruntime) on the
same Linear shapes (y = relu(x W^T + b)), fp32 and INT8 the way an ORT user quantizes a model:
`onnxruntime.quantization.quantize_dynamic` (per-channel int8 weights, uint8 activations
quantized per call; ORT fuses it into its DynamicQuantizeMatMul kernel, MLAS with VNNI where the
CPU has it).

    python3 bench/ort_int8_cpu.py [--batches 256,2048,8192] [--threads 2] [--model all]

Each time is the median over --reps of the mean of enough calls to fill ~0.2 s, as
bench_int8_cpu. Prints one line per shape and batch, and `RESULT {json}` lines.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

SHAPES = [  # bench_int8_cpu.cc's list: (model, layer, out, in)
    ("dlrm", "bottom.1", 256, 512), ("dlrm", "bottom.2", 128, 256),
    ("dlrm", "top.0", 1024, 479), ("dlrm", "top.1", 1024, 1024),
    ("dlrm", "top.2", 512, 1024), ("dlrm", "top.3", 256, 512),
    ("dcnv2", "cross.v", 512, 3456), ("dcnv2", "cross.u", 3456, 512),
    ("dcnv2", "top.0", 1024, 3456), ("dcnv2", "top.1", 1024, 1024),
    ("dcnv2", "top.2", 512, 1024), ("dcnv2", "top.3", 256, 512),
]


def linear_model(path, out, inp, rng):
    w = (rng.standard_normal((inp, out)) * np.sqrt(2.0 / (inp + out))).astype(np.float32)
    b = (rng.standard_normal(out) * np.sqrt(1.0 / out)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]),
         helper.make_node("Add", ["xw", "b"], ["z"]),
         helper.make_node("Relu", ["z"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", out])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, path)


def time_ms(fn, reps):
    fn()
    t = time.perf_counter()
    fn()
    once = time.perf_counter() - t
    iters = max(1, int(0.2 / max(once, 1e-6)))
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        ms.append((time.perf_counter() - t) * 1e3 / iters)
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="256,2048,8192")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model", default="all", choices=["all", "dlrm", "dcnv2"])
    a = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    opts.inter_op_num_threads = 1
    print(f"onnxruntime {ort.__version__}, threads {a.threads}")
    rng = np.random.default_rng(7)
    with tempfile.TemporaryDirectory() as tmp:
        for model, layer, out, inp in SHAPES:
            if a.model not in ("all", model):
                continue
            f32, i8 = os.path.join(tmp, "f32.onnx"), os.path.join(tmp, "i8.onnx")
            linear_model(f32, out, inp, rng)
            quantize_dynamic(f32, i8, per_channel=True, weight_type=QuantType.QInt8)
            s32 = ort.InferenceSession(f32, opts, providers=["CPUExecutionProvider"])
            s8 = ort.InferenceSession(i8, opts, providers=["CPUExecutionProvider"])
            for batch in (int(b) for b in a.batches.split(",")):
                x = rng.standard_normal((batch, inp)).astype(np.float32)
                t32 = time_ms(lambda: s32.run(None, {"x": x}), a.reps)
                t8 = time_ms(lambda: s8.run(None, {"x": x}), a.reps)
                print(f"{model:6s} {layer:9s} out {out:5d} in {inp:5d} batch {batch:6d}: "
                      f"ort fp32 {t32:8.3f} ms  ort int8 {t8:8.3f} ms ({t32 / t8:.2f}x fp32)")
                print("RESULT " + json.dumps({"model": model, "layer": layer, "out": out,
                                              "in": inp, "batch": batch, "ort_fp32_ms": t32,
                                              "ort_int8_ms": t8}), flush=True)


if __name__ == "__main__":
    main()
