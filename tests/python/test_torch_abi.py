"""The C ABI of dlrec.torch (libdlrec_torch.so, src/python/torch_abi.h) through ctypes and
NumPy, without torch: lookups and fused sparse updates of a CPU collection against a NumPy
reference of the same math (sum/mean pooling of multi-hot bags, SGD and Adagrad on the rows of
the batch), hashed tables, and every error path. Skips visibly when the library was not built.
"""
import ctypes
import importlib.util
import json
import os

import numpy as np
import pytest

BIN_DIR = os.environ.get("DLREC_BIN_DIR", "")
LIB_PATH = os.path.normpath(os.path.join(BIN_DIR, "..", "python", "dlrec", "libdlrec_torch.so"))


@pytest.fixture(scope="module")
def lib():
    if not BIN_DIR or not os.path.exists(LIB_PATH):
        pytest.skip(f"{LIB_PATH} not built (target dlrec_torch; run through ctest)")
    # The package's own loader (python/dlrec/_torch_abi.py, torch-free), loaded from the built
    # package by path: importing the dlrec package would load its extension module too.
    spec = importlib.util.spec_from_file_location(
        "dlrec_torch_abi", os.path.join(os.path.dirname(LIB_PATH), "_torch_abi.py"))
    abi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(abi)
    lib = abi.load_library(LIB_PATH)
    assert lib.dlrec_emb_abi_version() == 1
    return lib


class Coll:
    """A collection handle with NumPy in and out."""

    def __init__(self, lib, config):
        self.lib = lib
        h = ctypes.c_void_p()
        rc = lib.dlrec_emb_create(json.dumps(config).encode(), ctypes.byref(h))
        if rc != 0:
            raise RuntimeError(lib.dlrec_emb_last_error().decode())
        self.h = h
        w = ctypes.c_int64()
        assert lib.dlrec_emb_width(h, ctypes.byref(w)) == 0
        self.width = w.value

    def close(self):
        self.lib.dlrec_emb_destroy(self.h)

    def err(self, rc):
        if rc != 0:
            raise RuntimeError(self.lib.dlrec_emb_last_error().decode())

    def forward(self, offsets, ids, training=True, nnz=None):
        offsets = np.ascontiguousarray(offsets, np.int64)
        ids = np.ascontiguousarray(ids, np.int64)
        B = (len(offsets) - 1) // self.tables
        out = np.full((B, self.width), np.nan, np.float32)
        self.err(self.lib.dlrec_emb_forward(self.h, offsets.ctypes.data, ids.ctypes.data, B,
                                            len(ids) if nnz is None else nnz, out.ctypes.data,
                                            0, None, int(training)))
        return out

    def backward(self, grad, lr):
        grad = np.ascontiguousarray(grad, np.float32)
        self.err(self.lib.dlrec_emb_backward(self.h, grad.ctypes.data, 0, grad.shape[1], lr,
                                             None))

    def table(self, t, which=0):
        r, c = ctypes.c_int64(), ctypes.c_int64()
        self.err(self.lib.dlrec_emb_table_size(self.h, t, which, ctypes.byref(r), ctypes.byref(c)))
        out = np.empty((r.value, c.value), np.float32)
        self.err(self.lib.dlrec_emb_read_table(self.h, t, which, out.ctypes.data, 0, None))
        return out

    def load(self, t, arr, which=0):
        arr = np.ascontiguousarray(arr, np.float32)
        self.err(self.lib.dlrec_emb_write_table(self.h, t, which, arr.ctypes.data, 0, None))


def make(lib, tables, optimizer=None):
    c = Coll(lib, {"tables": tables, "optimizer": optimizer or {"kind": "sgd"}})
    c.tables = len(tables)
    return c


def random_batch(rng, rows, B, max_len):
    """KeyedJaggedTensor form: table-major bags of 0..max_len ids (empty bags included)."""
    lengths = rng.integers(0, max_len + 1, size=len(rows) * B)
    ids = np.concatenate([rng.integers(0, rows[k // B], size=n) for k, n in enumerate(lengths)])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return offsets, ids.astype(np.int64)


def pool_ref(weights, poolings, offsets, ids, B):
    cols = []
    for t, w in enumerate(weights):
        out = np.zeros((B, w.shape[1]), np.float64)
        for b in range(B):
            s, e = offsets[t * B + b], offsets[t * B + b + 1]
            if e > s:
                out[b] = w[ids[s:e]].astype(np.float64).sum(0)
                if poolings[t] == "mean":
                    out[b] /= e - s
        cols.append(out)
    return np.concatenate(cols, axis=1)


def row_grads_ref(weights, poolings, offsets, ids, B, grad):
    """Per table: {row: summed gradient} of the batch."""
    res, col = [], 0
    for t, w in enumerate(weights):
        d = w.shape[1]
        g = {}
        for b in range(B):
            s, e = offsets[t * B + b], offsets[t * B + b + 1]
            scale = 1.0 / (e - s) if poolings[t] == "mean" and e > s else 1.0
            for p in range(s, e):
                g.setdefault(int(ids[p]), np.zeros(d))
                g[int(ids[p])] += grad[b, col:col + d] * scale
        res.append(g)
        col += d
    return res


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_lookup_and_update_match_reference(lib, kind):
    rng = np.random.default_rng(7)
    rows, dims, pools = [50, 7, 300], [4, 8, 4], ["sum", "mean", "sum"]
    tables = [{"name": f"t{i}", "rows": r, "dim": d, "pooling": p, "seed": 11 + i}
              for i, (r, d, p) in enumerate(zip(rows, dims, pools))]
    opt = {"kind": kind, "eps": 1e-6, "initial_accumulator": 0.1} if kind == "adagrad" else None
    c = make(lib, tables, opt)
    try:
        assert c.width == sum(dims)
        lr = 0.3
        acc = [np.full((r, d), 0.1, np.float64) for r, d in zip(rows, dims)]
        for step in range(3):
            w = [c.table(t).astype(np.float64) for t in range(3)]
            B = 9
            offsets, ids = random_batch(rng, rows, B, 4)
            out = c.forward(offsets, ids)
            np.testing.assert_allclose(out, pool_ref(w, pools, offsets, ids, B), rtol=1e-5,
                                       atol=1e-6)
            grad = rng.standard_normal((B, c.width)).astype(np.float32)
            c.backward(grad, lr)
            for t, g in enumerate(row_grads_ref(w, pools, offsets, ids, B, grad)):
                expect = w[t].copy()
                for r, gr in g.items():
                    if kind == "sgd":
                        expect[r] -= lr * gr
                    else:
                        acc[t][r] += gr * gr
                        expect[r] -= lr * gr / (np.sqrt(acc[t][r]) + 1e-6)
                np.testing.assert_allclose(c.table(t), expect, rtol=1e-5, atol=1e-6)
                if kind == "adagrad":
                    np.testing.assert_allclose(c.table(t, 1), acc[t], rtol=1e-5)
                untouched = [r for r in range(rows[t]) if r not in g]
                np.testing.assert_array_equal(c.table(t)[untouched],
                                              w[t][untouched].astype(np.float32))
    finally:
        c.close()


def test_initial_rows_and_load(lib):
    c = make(lib, [{"rows": 1000, "dim": 16, "seed": 3}])
    try:
        w = c.table(0)
        a = np.sqrt(1.0 / 1000)
        assert np.all(np.abs(w) <= a) and w.std() > a / 3  # uniform in +-sqrt(1 / rows)
        new = np.arange(16000, dtype=np.float32).reshape(1000, 16)
        c.load(0, new)
        np.testing.assert_array_equal(c.table(0), new)
        out = c.forward([0, 2], [5, 7], training=False)
        np.testing.assert_array_equal(out[0], new[5] + new[7])
    finally:
        c.close()
    # Same seed, same rows (reproducible initialisation).
    c1, c2 = make(lib, [{"rows": 64, "dim": 4, "seed": 9}]), make(lib, [{"rows": 64, "dim": 4,
                                                                         "seed": 9}])
    try:
        np.testing.assert_array_equal(c1.table(0), c2.table(0))
    finally:
        c1.close()
        c2.close()


def test_hashed_table(lib):
    c = make(lib, [{"name": "h", "dim": 8, "hashed": {"capacity": 4, "init_scale": 0.5}},
                   {"name": "f", "rows": 3, "dim": 8}])
    try:
        keys = [10 ** 12, -5, 77]
        # One key per sample; table f's bags are empty.
        offsets = [0, 1, 2, 3, 3, 3, 3]
        unseen = c.forward(offsets, keys, training=False)
        np.testing.assert_array_equal(unseen, 0)  # evaluation: unknown keys pool as zeros
        first = c.forward(offsets, keys)
        assert np.all(first[:, :8] != 0) and np.all(np.abs(first[:, :8]) <= 0.5)
        np.testing.assert_array_equal(first[:, 8:], 0)  # empty bags
        grad = np.ones((3, 16), np.float32)
        c.backward(grad, 0.25)
        after = c.forward(offsets, keys, training=False)
        np.testing.assert_allclose(after[:, :8], first[:, :8] - 0.25, rtol=1e-6)
        with pytest.raises(RuntimeError, match="'h' is hashed"):
            c.table(0)
    finally:
        c.close()


def test_errors(lib):
    c = make(lib, [{"name": "a", "rows": 5, "dim": 2}, {"name": "b", "rows": 3, "dim": 2}])
    try:
        with pytest.raises(RuntimeError, match=r"table 'b' \(table 1\).*id 3 of sample 1 is out "
                                               r"of range \[0, 3\)"):
            c.forward([0, 1, 2, 3, 4], [0, 1, 2, 3])
        with pytest.raises(RuntimeError,
                           match=r"table 'a': offsets decrease at sample 1 \(2 > 1\)"):
            c.forward([0, 2, 1, 3, 4], [0, 1, 2, 0])
        with pytest.raises(RuntimeError, match=r"offsets\[4\] - offsets\[0\] = 4 but 5 ids"):
            c.forward([0, 1, 2, 3, 4], [0, 1, 2, 0, 0])
        with pytest.raises(RuntimeError, match="no training forward"):
            c.forward([0, 1, 2, 3, 4], [0, 1, 2, 0], training=False)
            c.backward(np.zeros((2, 4), np.float32), 0.1)
        off, ids, out = (np.array(a, np.int64) for a in ([0, 1, 2], [0, 1], [0] * 4))
        with pytest.raises(RuntimeError, match="bfloat16 outputs are CUDA-only"):
            c.err(lib.dlrec_emb_forward(c.h, off.ctypes.data, ids.ctypes.data, 1, 2,
                                        out.ctypes.data, 1, None, 1))
        with pytest.raises(RuntimeError, match="bfloat16 gradients are CUDA-only"):
            c.forward([0, 1, 2], [0, 1])
            c.err(lib.dlrec_emb_backward(c.h, out.ctypes.data, 1, 4, 0.1, None))
        with pytest.raises(RuntimeError, match="optimizer keeps no state"):
            c.table(0, 1)
        with pytest.raises(RuntimeError, match="table 7 out of range"):
            c.table(7)
    finally:
        c.close()
    bad = [
        ({"tables": []}, "'tables' must be a non-empty list"),
        ({"tables": [{"rows": 3, "dim": 2, "dimm": 1}]},
         r"unknown config key 'tables\[0\].dimm' \(did you mean 'dim'\?\)"),
        ({"tables": [{"rows": 0, "dim": 2}]}, "rows"),
        ({"tables": [{"rows": 3, "dim": 2}], "optimizer": {"kind": "lamb"}}, "kind"),
        ({"tables": [{"rows": 3, "dim": 2}], "device": "tpu"}, "device"),
    ]
    for config, message in bad:
        with pytest.raises(RuntimeError, match=message):
            Coll(lib, config)
    h = ctypes.c_void_p()
    assert lib.dlrec_emb_create(b"{not json", ctypes.byref(h)) != 0
    assert "EmbeddingCollection config" in lib.dlrec_emb_last_error().decode()
    if lib.dlrec_emb_has_cuda() == 0:
        with pytest.raises(RuntimeError, match="built without CUDA"):
            Coll(lib, {"device": "cuda", "tables": [{"rows": 3, "dim": 2}]})
