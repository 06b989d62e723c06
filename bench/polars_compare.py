#!/usr/bin/env python3
"""Compares the Polars peer's output (bench/polars_criteo_etl.py) with `dlrec etl`'s.

  python3 bench/polars_compare.py DLREC_OUT POLARS_OUT

DLREC_OUT holds dlrec's train_*.shard / valid_*.shard (read here after docs/FORMATS.md, one-hot
features only, as the Criteo workflow makes), POLARS_OUT the peer's train.parquet and
valid.parquet. Per split: the same rows in the same order, the same labels, the same ids in every
categorical column, dense values equal within float32 rounding of log1p (relative 1e-6), and each
column's largest id below dlrec's cardinality. Exits 1 with the first difference.
"""
import glob
import json
import os
import struct
import sys

import numpy as np

ID_TYPES = [(1 << 8, np.uint8), (1 << 16, np.uint16), (1 << 31, np.int32)]


def id_type(cardinality, version):
    if version == 1:
        return np.int32 if cardinality <= 1 << 31 else np.int64
    for most, t in ID_TYPES:
        if cardinality <= most:
            return t
    return np.int64


def read_shard(path):
    """labels (n,), dense (n, d), ids (n, t) and the header's layout of one shard file."""
    data = open(path, "rb").read()
    if data[:8] != b"DLRSHARD" or data[-8:] != b"DLRSEND\0":
        raise ValueError(f"{path}: not a complete dlrec shard")
    version, jlen = struct.unpack_from("<II", data, 8)
    layout = json.loads(data[16:16 + jlen])["layout"]
    if any(layout["multi_hot"]):
        raise ValueError(f"{path}: multi-hot features are not read here")
    nd, cards = layout["num_dense"], layout["cardinalities"]
    (footer,) = struct.unpack_from("<Q", data, len(data) - 24)
    nblocks, total = struct.unpack_from("<QQ", data, footer)
    offsets = [struct.unpack_from("<QQ", data, footer + 16 + 16 * b)[1] for b in range(nblocks)]
    labels, dense, ids = [], [], []
    for off in offsets:
        n, _payload = struct.unpack_from("<QQ", data, off)
        at = off + 24
        labels.append(np.frombuffer(data, np.float32, n, at))
        at += 4 * n
        dense.append(np.frombuffer(data, np.float32, n * nd, at).reshape(n, nd))
        at += 4 * n * nd
        cols = []
        for card in cards:
            t = id_type(card, version)
            cols.append(np.frombuffer(data, t, n, at).astype(np.int64))
            at += np.dtype(t).itemsize * n
        ids.append(np.stack(cols, axis=1) if cols else np.zeros((n, 0), np.int64))
    out = (np.concatenate(labels), np.concatenate(dense), np.concatenate(ids), layout)
    if len(out[0]) != total:
        raise ValueError(f"{path}: {len(out[0])} rows read, the footer says {total}")
    return out


def read_split(folder, split):
    parts = [read_shard(p) for p in sorted(glob.glob(os.path.join(folder, f"{split}_*.shard")))]
    if not parts:
        raise ValueError(f"no {split}_*.shard in {folder}")
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]), parts[0][3])


def compare(dlrec_out, polars_out):
    """None when the outputs agree, else the first difference found."""
    import pyarrow.parquet as pq

    names = json.load(open(os.path.join(dlrec_out, "workflow.json")))["output"]
    dense_names, cat_names = names["dense_names"], names["cat_names"]
    for split in ("train", "valid"):
        labels, dense, ids, layout = read_split(dlrec_out, split)
        t = pq.read_table(os.path.join(polars_out, f"{split}.parquet"))
        if t.num_rows != len(labels):
            return f"{split}: {len(labels)} rows from dlrec, {t.num_rows} from Polars"
        if not np.array_equal(t.column("label").to_numpy(), labels):
            return f"{split}: labels differ"
        for j, name in enumerate(dense_names):
            p = t.column(name).to_numpy()
            bad = ~np.isclose(p, dense[:, j], rtol=1e-6, atol=0)
            if bad.any():
                r = int(np.argmax(bad))
                return f"{split} row {r} {name}: dlrec {dense[r, j]!r}, Polars {p[r]!r}"
        for j, name in enumerate(cat_names):
            p = t.column(name).to_numpy().astype(np.int64)
            if not np.array_equal(p, ids[:, j]):
                r = int(np.argmax(p != ids[:, j]))
                return f"{split} row {r} {name}: dlrec id {ids[r, j]}, Polars id {p[r]}"
            if len(p) and p.max() >= layout["cardinalities"][j]:
                return f"{split} {name}: Polars id {p.max()} >= cardinality"
    return None


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().split("\n\n")[1])
    diff = compare(sys.argv[1], sys.argv[2])
    if diff:
        print(f"polars_compare: outputs differ: {diff}")
        sys.exit(1)
    print("polars_compare: same rows, labels, ids and dense values (rtol 1e-6)")


if __name__ == "__main__":
    main()
