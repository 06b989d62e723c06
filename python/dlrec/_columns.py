"""Raw rows from NumPy arrays and pyarrow tables, checked against a schema (docs/PYTHON.md).

dlrec's reader form (io::RawChunk) holds the dense columns row-major and the categorical keys as
uint64 lists, so each column passes through one C++ pass that fills it: dense columns are
interleaved there (a copy), keys are copied into the chunk. What this module hands to that pass
is taken without a copy where the input already has the needed form: float32 dense arrays,
uint64 keys (int64 keys are viewed as uint64 when none is negative), pyarrow's string and list
buffers (viewed through NumPy). Other dtypes are converted once here.
"""
import json

import numpy as np

from . import _dlrec

_NUMERIC_KINDS = "biuf"


def _is_arrow(data):
    mod = type(data).__module__
    return mod.startswith("pyarrow") and hasattr(data, "column_names")


def _names(data):
    return list(data.column_names) if _is_arrow(data) else list(data.keys())


def _column(data, name, available):
    if name not in available:
        raise ValueError(f"missing column '{name}' (the schema needs it; the data has: "
                         f"{', '.join(available) or 'no columns'})")
    return data.column(name) if _is_arrow(data) else data[name]


def _check_rows(name, n, rows):
    if n != rows:
        raise ValueError(f"column '{name}' has {n} rows, the first column has {rows}")


def _float_column(name, col, rows, what):
    """A dense or label column as a float32 1-D array (NaN = missing)."""
    if _is_arrow_array(col):
        col = col.to_numpy(zero_copy_only=False)  # nulls become NaN (float) or None (object)
        if col.dtype == object:
            raise TypeError(f"{what} column '{name}' needs numbers, got non-numeric Arrow data")
    arr = np.asarray(col)
    if arr.dtype.kind not in _NUMERIC_KINDS:
        raise TypeError(f"{what} column '{name}' needs a numeric array, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{what} column '{name}' needs a 1-D array, got shape {arr.shape}")
    _check_rows(name, arr.shape[0], rows)
    return np.ascontiguousarray(arr, dtype=np.float32)


def _is_arrow_array(col):
    return type(col).__module__.startswith("pyarrow")


def _int_keys(name, values):
    """uint64 keys from an integer array; negative signed keys are missing values (as the
    server's INT64 inputs). Returns (values, valid mask or None)."""
    if values.dtype.kind == "u":
        return np.ascontiguousarray(values, dtype=np.uint64), None
    v = np.ascontiguousarray(values, dtype=np.int64)
    valid = v >= 0
    if valid.all():
        return v.view(np.uint64), None
    return v[valid].view(np.uint64), valid


def _offsets_from_valid(valid):
    offsets = np.zeros(valid.shape[0] + 1, dtype=np.int64)
    np.cumsum(valid, out=offsets[1:])
    return offsets


def _strings(name, arr):
    """(bytes uint8, offsets int64) of a NumPy array of str/bytes (None = empty = missing)."""
    items = []
    for x in arr.tolist():
        if x is None:
            items.append(b"")
        elif isinstance(x, str):
            items.append(x.encode())
        elif isinstance(x, (bytes, bytearray)):
            items.append(bytes(x))
        else:
            raise TypeError(f"categorical column '{name}' holds {type(x).__name__} values; "
                            "it needs str or bytes (or an integer array of keys)")
    lengths = np.fromiter((len(x) for x in items), dtype=np.int64, count=len(items))
    offsets = np.zeros(len(items) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8), offsets


def _numpy_cat(name, col, rows):
    """A categorical column from NumPy: an integer array (one key a row), a str/bytes array
    (fields as in the text logs), or a (offsets, keys) pair for multi-hot rows."""
    if isinstance(col, tuple):
        if len(col) != 2:
            raise ValueError(f"categorical column '{name}': a multi-hot column is a pair "
                             f"(offsets, keys), got a tuple of {len(col)}")
        offsets = np.asarray(col[0])
        keys = np.asarray(col[1])
        if offsets.dtype.kind not in "iu" or offsets.ndim != 1:
            raise TypeError(f"categorical column '{name}': offsets need a 1-D integer array, got "
                            f"dtype {offsets.dtype}, shape {offsets.shape}")
        _check_rows(name, offsets.shape[0] - 1, rows)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if keys.dtype.kind in "iu":
            values, valid = _int_keys(name, keys)
            if valid is not None:
                raise ValueError(f"categorical column '{name}': negative keys in a multi-hot "
                                 "list (leave a missing item out of its row's list)")
            return ("int", values, offsets)
        if keys.dtype.kind in "USO":
            data, soff = _strings(name, keys)
            return ("str", data, soff, offsets)
        raise TypeError(f"categorical column '{name}' needs integer or string keys, got dtype "
                        f"{keys.dtype}")
    arr = np.asarray(col)
    if arr.ndim != 1:
        raise ValueError(f"categorical column '{name}' needs a 1-D array, got shape {arr.shape}")
    _check_rows(name, arr.shape[0], rows)
    if arr.dtype.kind in "iu":
        values, valid = _int_keys(name, arr)
        return ("int", values, None if valid is None else _offsets_from_valid(valid))
    if arr.dtype.kind in "USO":
        data, offsets = _strings(name, arr)
        return ("str", data, offsets, None)
    raise TypeError(f"categorical column '{name}' needs integer keys or strings, got dtype "
                    f"{arr.dtype}")


def _arrow_cat(name, col, rows):
    """A categorical column from pyarrow: integers, strings, or lists of either (multi-hot);
    nulls are missing values. String and list buffers are viewed, not copied."""
    import pyarrow as pa

    _check_rows(name, len(col), rows)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.cast(t.value_type)
        t = arr.type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        offsets = np.asarray(arr.offsets, dtype=np.int64)
        values = arr.values
        base = int(offsets[0])
        offsets = offsets - base
        values = values.slice(base, int(offsets[-1]))
        if arr.null_count:  # a null row is missing, even where its offsets span items
            valid = np.asarray(arr.is_valid())
            lengths = np.diff(offsets)
            if np.any(lengths[~valid]):  # drop those items (a copy, only in this case)
                values = values.filter(pa.array(np.repeat(valid, lengths)))
                offsets = np.concatenate([[0], np.cumsum(np.where(valid, lengths, 0))])
        if values.null_count:
            raise ValueError(f"categorical column '{name}': null items inside a list (leave a "
                             "missing item out of its row's list)")
        if pa.types.is_integer(values.type):
            keys, valid = _int_keys(name, values.to_numpy())
            if valid is not None:
                raise ValueError(f"categorical column '{name}': negative keys in a list")
            return ("int", keys, offsets)
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or \
                pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            data, soff = _arrow_string_buffers(values)
            return ("str", data, soff, offsets)
        raise TypeError(f"categorical column '{name}' is a list of {values.type}; dlrec needs "
                        "integers or strings")
    if pa.types.is_integer(t):
        valid = None if arr.null_count == 0 else np.asarray(arr.is_valid())
        v = arr.fill_null(0).to_numpy() if valid is not None else arr.to_numpy()
        keys, neg = _int_keys(name, v if valid is None else v[valid])
        if neg is not None:
            raise ValueError(f"categorical column '{name}': negative keys (use nulls for missing "
                             "values in Arrow data)")
        return ("int", keys, None if valid is None else _offsets_from_valid(valid))
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or \
            pa.types.is_large_binary(t):
        data, soff = _arrow_string_buffers(arr)
        return ("str", data, soff, None)  # a null has an empty string: missing
    raise TypeError(f"categorical column '{name}' has Arrow type {t}; dlrec needs integers, "
                    "strings or lists of them")


def _arrow_string_buffers(arr):
    """(bytes, offsets int64) of an Arrow string/binary array, viewed from its buffers."""
    import pyarrow as pa

    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, off_buf, data_buf = arr.buffers()
    odt = np.int64 if large else np.int32
    offsets = np.frombuffer(off_buf, dtype=odt, count=len(arr) + 1, offset=arr.offset *
                            np.dtype(odt).itemsize)
    start, end = int(offsets[0]), int(offsets[-1])
    data = (np.frombuffer(data_buf, dtype=np.uint8)[start:end] if data_buf is not None
            else np.zeros(0, np.uint8))
    offsets = offsets.astype(np.int64) - start  # n + 1 offsets: the one small copy
    if arr.null_count:  # a null's offsets may span bytes: make it empty (missing)
        valid = np.asarray(arr.is_valid())
        lengths = np.where(valid, np.diff(offsets), 0)
        keep = np.repeat(valid, np.diff(offsets))
        data = data[keep]
        offsets = np.zeros(len(arr) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
    return np.ascontiguousarray(data), np.ascontiguousarray(offsets, dtype=np.int64)


def raw_rows(data, schema, need_label):
    """dlrec's raw rows (_dlrec.RawRows) from a dict of NumPy arrays or a pyarrow Table, with
    the schema's columns (extra columns are ignored)."""
    if not (_is_arrow(data) or isinstance(data, dict)):
        raise TypeError("rows must be a dict of NumPy arrays, a pyarrow Table or a list of file "
                        f"paths, got {type(data).__name__}")
    available = _names(data)
    if not available:
        raise ValueError("rows hold no columns")
    arrow = _is_arrow(data)
    rows = data.num_rows if arrow else None
    label = None
    dense, cats = [], []
    for spec in schema["columns"]:
        kind, name = spec.get("kind", "skip"), spec["name"]
        if kind == "skip" or (kind == "label" and not need_label and name not in available):
            continue
        col = _column(data, name, available)
        if rows is None:
            rows = len(col[0]) - 1 if isinstance(col, tuple) and len(col) == 2 else len(col)
        if kind == "label":
            label = _float_column(name, col, rows, "label")
        elif kind == "dense":
            dense.append(_float_column(name, col, rows, "dense"))
        else:
            cats.append(_arrow_cat(name, col, rows) if arrow else _numpy_cat(name, col, rows))
    return _dlrec.make_rows(json.dumps(schema), rows, label, dense, cats)
