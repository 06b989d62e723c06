"""dlrec.torch: dlrec's embedding engine as a torch.nn.Module (docs/PYTHON.md, "dlrec.torch").

    from dlrec.torch import EmbeddingCollection
    emb = EmbeddingCollection(tables=[{"name": "C1", "rows": 1460, "dim": 128}, ...],
                              optimizer={"kind": "sgd", "lr": 0.01}, device="cuda")
    pooled = emb(values, offsets)    # KeyedJaggedTensor's values/offsets -> [B, sum of dims]
    loss.backward()                  # the tables are updated inside dlrec here

The tables live in dlrec (CPU: nn::EmbeddingBag / HashedEmbedding; CUDA: the fused lookup and
de-duplicated sparse update kernels of the CUDA engine), not in torch parameters: the backward
of the lookup hands dL/dpooled to dlrec, which applies the sparse optimizer at once, and returns
no gradient for the tables (none is ever formed). Tensors are exchanged through their data
pointers on the current CUDA stream (no copies). The engine is a C ABI library
(libdlrec_torch.so, beside this file) loaded with ctypes, so this module works with any Python
version and does not import dlrec's extension module. Single process: sharding the tables over
ranks is not part of this slice.
"""
import ctypes
import json

import torch

__all__ = ["EmbeddingCollection", "load_library"]

from ._torch_abi import load_library


class Error(RuntimeError):
    """An error of dlrec's engine (bad id, bad offsets, bad configuration), with its message."""


def _call(lib, rc):
    if rc != 0:
        raise Error(lib.dlrec_emb_last_error().decode("utf-8", "replace"))


_OPT_KEYS = {"kind", "lr", "eps", "initial_accumulator", "beta1", "beta2"}
_TABLE_KEYS = {"name", "rows", "dim", "pooling", "seed", "hashed"}


class _Lookup(torch.autograd.Function):
    """The pooled lookup; its backward is dlrec's fused sparse update (no table gradient)."""

    @staticmethod
    def forward(ctx, anchor, coll, values, offsets, batch):
        out = coll._forward(values, offsets, batch, training=True)
        ctx.coll = coll
        return out

    @staticmethod
    def backward(ctx, grad):
        ctx.coll._backward(grad)
        return None, None, None, None, None


class EmbeddingCollection(torch.nn.Module):
    """Pooled embedding tables held and trained by dlrec.

    tables: a list of dicts, one per table (in input order): "rows" (vocabulary; ids in
        [0, rows)), "dim", optional "name", "pooling" ("sum" | "mean"), "seed" (default: the
        table's index; rows start uniform in +-sqrt(1 / rows) as dlrec's own tables), and for a
        hashed table "hashed": {"capacity": rows held, "init_scale": ...} instead of "rows"
        (ids are then any int64 keys; CPU only so far).
    optimizer: {"kind": "sgd" | "adagrad" | "rowwise_adagrad" (CUDA: dims up to 512, 128 when
        not a multiple of 4) | "adam", "lr", "eps", "initial_accumulator", "beta1", "beta2"}:
        applied to the rows of each batch during backward; row-wise Adagrad keeps one
        accumulator per row (state [rows, 1]), Adam m, v and the row's own step count (state
        [rows, 2 * dim + 1]). `lr` may be changed later (the attribute `lr`).
    device: "cpu" or a CUDA device ("cuda", "cuda:1", torch.device). On CUDA every table has
        the same dim and pooling.
    check_ids: CUDA only: after each forward, wait for the stream and raise on a bad id or
        offset (the CPU always checks). False skips that wait; a bad id is then looked up as
        row 0 of its table and reported by the next check() call.
    dtype: of the pooled output, torch.float32 or (CUDA only) torch.bfloat16: the pooled sums
        are taken in float and rounded once, and the backward reads the bf16 gradient as it is
        (for bf16 models: no casts around the layer).
    library: the path of libdlrec_torch.so (default: beside this file).
    """

    def __init__(self, tables, optimizer=None, device="cpu", check_ids=True, dtype=torch.float32,
                 library=None):
        super().__init__()
        if dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"dtype must be torch.float32 or torch.bfloat16, got {dtype}")
        if not isinstance(tables, (list, tuple)) or not tables:
            raise ValueError("tables must be a non-empty list of table dicts")
        optimizer = dict(optimizer or {"kind": "sgd", "lr": 0.01})
        unknown = set(optimizer) - _OPT_KEYS
        if unknown:
            raise ValueError(f"optimizer: unknown keys {sorted(unknown)} (known: "
                             f"{sorted(_OPT_KEYS)})")
        self.lr = float(optimizer.pop("lr", 0.01))
        if self.lr < 0:
            raise ValueError(f"optimizer lr must be >= 0, got {self.lr}")
        specs = []
        for i, t in enumerate(tables):
            if not isinstance(t, dict):
                raise TypeError(f"tables[{i}] must be a dict, got {type(t).__name__}")
            unknown = set(t) - _TABLE_KEYS
            if unknown:
                raise ValueError(f"tables[{i}]: unknown keys {sorted(unknown)} (known: "
                                 f"{sorted(_TABLE_KEYS)})")
            specs.append(dict(t))
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {device!r}")
        self.check_ids = bool(check_ids)
        if dtype == torch.bfloat16 and self.device.type != "cuda":
            raise ValueError("dtype torch.bfloat16 is CUDA-only; a CPU collection is float32")
        self.dtype = dtype
        self.table_names = [t.get("name", f"table{i}") for i, t in enumerate(specs)]
        self.dims = [int(t["dim"]) if "dim" in t else 0 for t in specs]
        self._lib = load_library(library)
        cfg = {"device": self.device.type, "device_index": self.device.index or 0,
               "optimizer": optimizer, "tables": specs}
        handle = ctypes.c_void_p()
        _call(self._lib, self._lib.dlrec_emb_create(json.dumps(cfg).encode(),
                                                    ctypes.byref(handle)))
        self._handle = handle
        w = ctypes.c_int64()
        _call(self._lib, self._lib.dlrec_emb_width(handle, ctypes.byref(w)))
        self.width = w.value
        # Makes the lookup's output require a gradient (so backward reaches dlrec) without a
        # parameter: dense optimizers over parameters() never see the tables.
        self._anchor = torch.empty(0, device=self.device, requires_grad=True)

    def __del__(self):
        h = getattr(self, "_handle", None)
        if h is not None and h.value:
            self._lib.dlrec_emb_destroy(h)
            self._handle = None

    def extra_repr(self):
        return f"tables={self.table_names}, width={self.width}, device={self.device}, lr={self.lr}"

    def _stream(self):
        if self.device.type != "cuda":
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)

    def _ids(self, t, what):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 1:
            raise ValueError(f"{what} must be 1-D, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{what} must be an integer tensor (int64 or int32), got {t.dtype}")
        if t.device != self.device:
            raise ValueError(f"{what} is on {t.device}, the collection on {self.device}")
        return t.to(torch.int64).contiguous()

    def forward(self, values, offsets=None, lengths=None):
        """Pooled rows [B, width] (self.dtype) of a batch in KeyedJaggedTensor form: `values`
        (ids of every table, table-major) with `offsets` [T * B + 1] or `lengths` [T * B]; or
        an object with .values() and .offsets() (a torchrec KeyedJaggedTensor, its keys in the
        tables' order); or ids [T, B] (one id per sample and table)."""
        if not isinstance(values, torch.Tensor) and hasattr(values, "offsets"):
            values, offsets = values.values(), values.offsets()
        T = len(self.table_names)
        if offsets is None and lengths is None:
            if not isinstance(values, torch.Tensor) or values.dim() != 2 or values.shape[0] != T:
                raise ValueError(f"without offsets or lengths, values must be ids [T={T}, B]")
            B = values.shape[1]
            values = values.reshape(-1)
            offsets = torch.arange(T * B + 1, device=values.device, dtype=torch.int64)
        elif offsets is not None and lengths is not None:
            raise ValueError("give offsets or lengths, not both")
        elif lengths is not None:
            lengths = self._ids(lengths, "lengths")
            offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=self.device)
            torch.cumsum(lengths, 0, out=offsets[1:])
        values = self._ids(values, "values")
        offsets = self._ids(offsets, "offsets")
        if (offsets.numel() - 1) % T != 0:
            raise ValueError(f"offsets has {offsets.numel()} entries; it needs T * B + 1 "
                             f"(T = {T} tables)")
        B = (offsets.numel() - 1) // T
        if self.training and torch.is_grad_enabled():
            return _Lookup.apply(self._anchor, self, values, offsets, B)
        return self._forward(values, offsets, B, training=False)

    def _forward(self, values, offsets, batch, training):
        out = torch.empty(batch, self.width, dtype=self.dtype, device=self.device)
        stream = self._stream()
        _call(self._lib, self._lib.dlrec_emb_forward(
            self._handle, ctypes.c_void_p(offsets.data_ptr()),
            ctypes.c_void_p(values.data_ptr()), batch, values.numel(),
            ctypes.c_void_p(out.data_ptr()), int(self.dtype == torch.bfloat16), stream,
            int(training)))
        if self.check_ids and self.device.type == "cuda":
            _call(self._lib, self._lib.dlrec_emb_check(self._handle, stream))
        return out

    def _backward(self, grad):
        grad = grad.to(self.dtype)  # no copy when it has the output's type already
        if grad.stride(1) != 1 or grad.stride(0) < self.width:
            grad = grad.contiguous()
        _call(self._lib, self._lib.dlrec_emb_backward(
            self._handle, ctypes.c_void_p(grad.data_ptr()), int(self.dtype == torch.bfloat16),
            grad.stride(0), self.lr, self._stream()))

    def check(self):
        """CUDA: waits for the stream and raises on the first bad id or offset seen since the
        last check (forward does this itself unless check_ids=False)."""
        _call(self._lib, self._lib.dlrec_emb_check(self._handle, self._stream()))

    def _table(self, t):
        if isinstance(t, str):
            if t not in self.table_names:
                raise KeyError(f"no table {t!r} (tables: {self.table_names})")
            t = self.table_names.index(t)
        return int(t)

    def _size(self, t, which):
        rows, cols = ctypes.c_int64(), ctypes.c_int64()
        _call(self._lib, self._lib.dlrec_emb_table_size(self._handle, t, which,
                                                        ctypes.byref(rows), ctypes.byref(cols)))
        return rows.value, cols.value

    def table(self, t, state=False):
        """A copy of table t's weights (or its optimizer state) [rows, dim] on the device."""
        t, which = self._table(t), int(bool(state))
        out = torch.empty(self._size(t, which), dtype=torch.float32, device=self.device)
        _call(self._lib, self._lib.dlrec_emb_read_table(
            self._handle, t, which, ctypes.c_void_p(out.data_ptr()),
            int(self.device.type == "cuda"), self._stream()))
        return out

    def load_table(self, t, weights, state=False):
        """Overwrites table t's weights (or optimizer state) with `weights` [rows, dim]."""
        t, which = self._table(t), int(bool(state))
        shape = self._size(t, which)
        if tuple(weights.shape) != shape:
            raise ValueError(f"table {self.table_names[t]!r}: shape {tuple(weights.shape)}, "
                             f"expected {shape}")
        src = weights.detach().to(device=self.device, dtype=torch.float32).contiguous()
        _call(self._lib, self._lib.dlrec_emb_write_table(
            self._handle, t, which, ctypes.c_void_p(src.data_ptr()),
            int(self.device.type == "cuda"), self._stream()))
