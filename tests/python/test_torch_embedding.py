"""dlrec.torch.EmbeddingCollection against nn.EmbeddingBag + torch.optim on random multi-hot
batches: pooled outputs, and the tables after a few steps of SGD or Adagrad (dlrec's fused
update in backward vs torch's sparse gradients + optimizer step), row-wise Adagrad and Adam
(against references written here: torch has neither with per-row state). CPU always, CUDA
when a GPU is present and the library was built with CUDA. Skipped visibly without torch (CI).

Also runs as a script (the GPU host has torch but no pytest build tree):
  python3 test_torch_embedding.py MODULE_PY LIBRARY_SO
"""
import importlib.util
import os
import sys
import types

try:
    import pytest
except ImportError:  # script mode on a host without pytest: the two helpers used here
    import contextlib
    import re
    import types

    @contextlib.contextmanager
    def _raises(exc, match):
        try:
            yield
        except exc as e:
            assert re.search(match, str(e)), f"{e!r} does not match {match!r}"
            return
        raise AssertionError(f"{exc.__name__} not raised")

    def _skip(reason):
        raise SystemExit(f"SKIPPED: {reason}")

    pytest = types.SimpleNamespace(raises=_raises, skip=_skip,
                                   importorskip=__import__,
                                   mark=types.SimpleNamespace(parametrize=lambda *a: lambda f: f))

torch = pytest.importorskip("torch")

SRC = os.environ.get("DLREC_SOURCE_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN_DIR = os.environ.get("DLREC_BIN_DIR", "")
PATHS = {"module": os.path.join(SRC, "python", "dlrec", "torch.py"),
         "library": os.path.join(BIN_DIR, "..", "python", "dlrec", "libdlrec_torch.so")}


def dlrec_torch():
    if not os.path.exists(PATHS["library"]):
        pytest.skip(f"{PATHS['library']} not built (target dlrec_torch)")
    # torch.py imports its sibling _torch_abi relatively: load it as a submodule of a package
    # of its folder (without the package's __init__, which needs the compiled extension).
    pkg = types.ModuleType("dlrec_under_test")
    pkg.__path__ = [os.path.dirname(os.path.abspath(PATHS["module"]))]
    sys.modules[pkg.__name__] = pkg
    spec = importlib.util.spec_from_file_location("dlrec_under_test.torch", PATHS["module"])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def devices(mod):
    out = ["cpu"]
    if torch.cuda.is_available() and mod.load_library(PATHS["library"]).dlrec_emb_has_cuda():
        out.append("cuda")
    return out


def batch(rows, B, max_len, dev, gen):
    lengths = torch.randint(0, max_len + 1, (len(rows) * B,), generator=gen)
    ids = torch.cat([torch.randint(0, rows[k // B], (int(n),), generator=gen)
                     for k, n in enumerate(lengths)])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    return ids.to(dev), offsets.to(dev), lengths.to(dev)


def run_case(mod, dev, kind, pooling):
    gen = torch.Generator().manual_seed(3)
    rows, dim, B, lr = [40, 9, 200], 8, 16, 0.2
    opt = {"kind": kind, "lr": lr}
    if kind in ("adagrad", "rowwise_adagrad"):
        opt.update(eps=1e-6, initial_accumulator=0.1)
    if kind == "adam":
        opt.update(eps=1e-6, beta1=0.8, beta2=0.99)
    coll = mod.EmbeddingCollection(
        tables=[{"name": f"t{i}", "rows": r, "dim": dim, "pooling": pooling} for i, r in
                enumerate(rows)], optimizer=opt, device=dev, library=PATHS["library"])
    bags = [torch.nn.EmbeddingBag(r, dim, mode=pooling, sparse=True).to(dev) for r in rows]
    for t, b in enumerate(bags):
        with torch.no_grad():
            b.weight.copy_(coll.table(t))
    params = [b.weight for b in bags]
    topt = (torch.optim.SGD(params, lr=lr) if kind == "sgd" else
            RowWiseAdagrad(params, lr=lr, eps=1e-6, initial=0.1) if kind == "rowwise_adagrad" else
            LazyAdam(params, lr=lr, b1=0.8, b2=0.99, eps=1e-6) if kind == "adam" else
            torch.optim.Adagrad(params, lr=lr, eps=1e-6, initial_accumulator_value=0.1))
    for step in range(3):
        ids, offsets, lengths = batch(rows, B, 3, dev, gen)
        out = coll(ids, offsets) if step != 1 else coll(ids, lengths=lengths)
        ref = torch.cat([bags[t](ids[offsets[t * B]:offsets[(t + 1) * B]],
                                 offsets[t * B:(t + 1) * B] - offsets[t * B])
                         for t in range(len(rows))], dim=1)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        g = torch.randn(B, coll.width, generator=gen).to(dev)
        topt.zero_grad()
        (ref * g).sum().backward()
        topt.step()
        (out * g).sum().backward()  # dlrec updates its tables here
        for t in range(len(rows)):
            torch.testing.assert_close(coll.table(t), bags[t].weight.detach(), rtol=1e-5,
                                       atol=1e-6)
            if kind == "rowwise_adagrad":  # one accumulator per row, [rows, 1]
                torch.testing.assert_close(coll.table(t, state=True), topt.state[t][:, None],
                                           rtol=1e-5, atol=1e-7)
            if kind == "adam":  # m, v and the row's step count, [rows, 2 * dim + 1]
                torch.testing.assert_close(coll.table(t, state=True), topt.state[t], rtol=1e-5,
                                           atol=1e-7)
    coll.eval()
    with torch.no_grad():
        ids = torch.tensor([[1, 2], [3, 4], [5, 6]], device=dev)
        torch.testing.assert_close(coll(ids)[:, :dim], bags[0].weight[[1, 2]].detach())


class SparseRowsReference:
    """A reference optimizer on nn.EmbeddingBag(sparse=True) gradients: update(w, s, rows, g)
    applies it to the rows present (their summed gradients g), s being the table's state."""

    def __init__(self, params, state):
        self.params, self.state = params, state

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, s in zip(self.params, self.state):
            if p.grad is not None:
                g = p.grad.coalesce()
                self.update(p, s, g.indices()[0], g.values())


class RowWiseAdagrad(SparseRowsReference):
    """Row-wise Adagrad (TorchRec's EXACT_ROWWISE_ADAGRAD): for each row present,
    a += mean(g^2) over the row, w -= lr * g / (sqrt(a) + eps)."""

    def __init__(self, params, lr, eps, initial):
        super().__init__(params, [torch.full((p.shape[0],), initial, device=p.device)
                                  for p in params])
        self.lr, self.eps = lr, eps

    def update(self, p, a, rows, vals):
        a[rows] += (vals.double() ** 2).mean(dim=1).float()
        p[rows] -= self.lr * vals / (a[rows].sqrt() + self.eps)[:, None]


class LazyAdam(SparseRowsReference):
    """dlrec's Adam on sparse rows (nn::Optimizer's "adam"): each row present in a step counts
    its own steps t; m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2,
    w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). State per row: m, v, t."""

    def __init__(self, params, lr, b1, b2, eps):
        super().__init__(params, [torch.zeros(p.shape[0], 2 * p.shape[1] + 1, device=p.device)
                                  for p in params])
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps

    def update(self, p, s, rows, x):
        d = p.shape[1]
        t = s[rows, 2 * d] + 1
        s[rows, 2 * d] = t
        m = self.b1 * s[rows, :d] + (1 - self.b1) * x
        v = self.b2 * s[rows, d:2 * d] + (1 - self.b2) * x * x
        s[rows, :d], s[rows, d:2 * d] = m, v
        c1 = (1 - self.b1 ** t.double()).float()
        c2 = (1 - self.b2 ** t.double()).float()
        p[rows] -= (self.lr / c1)[:, None] * m / (v.sqrt() / c2.sqrt()[:, None] + self.eps)


CASES = [("sgd", "sum"), ("sgd", "mean"), ("adagrad", "sum"), ("rowwise_adagrad", "sum"),
         ("rowwise_adagrad", "mean"), ("adam", "sum")]


@pytest.mark.parametrize("kind,pooling", CASES)
def test_matches_torch(kind, pooling):
    mod = dlrec_torch()
    for dev in devices(mod):
        run_case(mod, dev, kind, pooling)


def test_bf16_output():
    """CUDA: bf16 pooled rows are the float32 ones rounded; the update from a bf16 gradient
    equals the update from the same gradient in float32."""
    mod = dlrec_torch()
    if "cuda" not in devices(mod):
        pytest.skip("no CUDA device or a CPU-only library")
    tables = [{"rows": 30, "dim": 8}, {"rows": 20, "dim": 8}]
    a = mod.EmbeddingCollection(tables=tables, device="cuda", library=PATHS["library"])
    b = mod.EmbeddingCollection(tables=tables, device="cuda", dtype=torch.bfloat16,
                                library=PATHS["library"])
    gen = torch.Generator().manual_seed(5)
    ids, offsets, _ = batch([30, 20], 12, 3, "cuda", gen)
    oa, ob = a(ids, offsets), b(ids, offsets)
    assert ob.dtype == torch.bfloat16
    torch.testing.assert_close(ob, oa.to(torch.bfloat16), rtol=0, atol=0)
    g = torch.randn(12, 16, generator=gen).to("cuda").to(torch.bfloat16)
    (oa * g.float()).sum().backward()
    (ob.float() * g.float()).sum().backward()
    for t in range(2):
        torch.testing.assert_close(a.table(t), b.table(t), rtol=1e-6, atol=1e-7)


def test_errors():
    mod = dlrec_torch()
    for dev in devices(mod):
        coll = mod.EmbeddingCollection(tables=[{"name": "a", "rows": 5, "dim": 4}], device=dev,
                                       library=PATHS["library"])
        ids = torch.tensor([1, 7], device=dev)
        with pytest.raises(mod.Error, match="id 7 .*out of range"):
            coll(ids, torch.tensor([0, 1, 2], device=dev))
        with pytest.raises(TypeError, match="integer"):
            coll(ids.float(), torch.tensor([0, 1, 2], device=dev))
        with pytest.raises(ValueError, match="unknown keys"):
            mod.EmbeddingCollection(tables=[{"rows": 5, "dims": 4}], device=dev,
                                    library=PATHS["library"])
        # The collection goes on working after an error.
        out = coll(torch.tensor([1, 2], device=dev), torch.tensor([0, 1, 2], device=dev))
        torch.testing.assert_close(out, coll.table(0)[[1, 2]])
        # Row-wise Adagrad on CUDA holds a row in a warp: wider rows are a clear error there.
        wide = dict(tables=[{"rows": 5, "dim": 516}], device=dev, library=PATHS["library"],
                    optimizer={"kind": "rowwise_adagrad", "lr": 0.1})
        if dev == "cuda":
            with pytest.raises(mod.Error, match="'rowwise_adagrad' on CUDA takes dims up to 512"):
                mod.EmbeddingCollection(**wide)
        else:
            assert mod.EmbeddingCollection(**wide).table(0, state=True).shape == (5, 1)


if __name__ == "__main__":
    PATHS["module"], PATHS["library"] = sys.argv[1], sys.argv[2]
    for kind, pooling in CASES:
        test_matches_torch(kind, pooling)
        print(f"test_matches_torch[{kind}-{pooling}] passed on {devices(dlrec_torch())}")
    test_bf16_output()
    print("test_bf16_output passed")
    test_errors()
    print("test_errors passed")
