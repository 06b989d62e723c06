#!/usr/bin/env python3
"""Times facebookresearch/dlrm's own Criteo preprocessing on a Criteo-layout TSV.

The peer is dlrm's NumPy pipeline, `data_utils.getCriteoAdData` (what `dlrm_s_pytorch.py
--data-set=kaggle --raw-data-file=...` runs before training): count the rows, split the file
into 7 "days", parse every line (label, 13 integers, 26 hex categories; empty -> 0), build one
dictionary per categorical column, map keys to dense ids (processCriteoAdData, negative
integers -> 0), and concatenate/shuffle the days into the final .npz (concatCriteoAdData).

Nothing of dlrm is copied here: pass the path of a dlrm checkout (or of its data_utils.py) and
this script imports it. dlrm keeps `int(key, 16)` in int32 arrays; with NumPy >= 2 a key of
2^31 or more raises OverflowError (NumPy 1.x wrapped it), so run this under NumPy < 2 for
8-hex-digit keys (bench/etl_compare.sh prepares such a virtual environment), or pass
--max-ind-range (dlrm's own option: key % range).

Usage: dlrm_numpy_peer.py --dlrm /path/to/dlrm --data logs.tsv [--work DIR] [--keep]
Prints one line: `dlrm numpy peer: input=...MB rows=... seconds=... MB/s=... rows/s=...`.
"""
import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import time


def load_data_utils(path):
    if os.path.isdir(path):
        path = os.path.join(path, "data_utils.py")
    if not os.path.isfile(path):
        sys.exit(f"dlrm_numpy_peer: no data_utils.py at '{path}' (pass a dlrm checkout)")
    spec = importlib.util.spec_from_file_location("dlrm_data_utils", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not hasattr(mod, "getCriteoAdData"):
        sys.exit(f"dlrm_numpy_peer: '{path}' has no getCriteoAdData")
    return mod


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dlrm", required=True, help="dlrm checkout (or its data_utils.py)")
    ap.add_argument("--data", required=True, help="Criteo-layout TSV (label, 13 ints, 26 hex)")
    ap.add_argument("--work", help="scratch directory (default: a temporary one, removed)")
    ap.add_argument("--days", type=int, default=7, help="dlrm's day split (Kaggle: 7)")
    ap.add_argument("--max-ind-range", type=int, default=-1, help="dlrm's --max-ind-range")
    ap.add_argument("--multiprocessing", action="store_true",
                    help="dlrm's --dataset-multiprocessing (one process per day)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    ap.add_argument("--verbose", action="store_true", help="show dlrm's own output")
    a = ap.parse_args()

    import numpy as np

    du = load_data_utils(a.dlrm)
    data = os.path.abspath(a.data)
    if not os.path.isfile(data):
        sys.exit(f"dlrm_numpy_peer: '{data}' does not exist")
    size = os.path.getsize(data)
    work = a.work or tempfile.mkdtemp(prefix="dlrm_peer_")
    os.makedirs(work, exist_ok=True)
    # getCriteoAdData writes its intermediate files next to the input: give it its own
    # directory, with the input linked in under dlrm's Kaggle name.
    raw = os.path.join(work, "train.txt")
    if os.path.lexists(raw):
        os.remove(raw)
    os.symlink(data, raw)
    np.random.seed(123)
    sink = sys.stdout if a.verbose else io.StringIO()
    t0 = time.time()
    try:
        with contextlib.redirect_stdout(sink if a.verbose else open(os.devnull, "w")):
            out = du.getCriteoAdData(
                raw,
                "kaggleAdDisplayChallenge_processed",  # dlrm adds the directory and .npz
                max_ind_range=a.max_ind_range,
                sub_sample_rate=0.0,
                days=a.days,
                data_split="train",
                randomize="total",
                criteo_kaggle=True,
                memory_map=False,
                dataset_multiprocessing=a.multiprocessing,
            )
        seconds = time.time() - t0
        with np.load(out) as f:
            rows = int(f["y"].shape[0])
            counts = [int(c) for c in f["counts"]]
    finally:
        if not a.keep and not a.work:
            shutil.rmtree(work, ignore_errors=True)
    mb = size / 1e6
    print(f"dlrm numpy peer: input={mb:.1f}MB rows={rows} seconds={seconds:.2f} "
          f"MB/s={mb / seconds:.2f} rows/s={rows / seconds:.0f} processes="
          f"{a.days if a.multiprocessing else 1} numpy={np.__version__} "
          f"max_vocab={max(counts)}")


if __name__ == "__main__":
    main()
