"""The Polars peer of the Criteo ETL (bench/polars_criteo_etl.py) computes what `dlrec etl` does.

Both run on the same generated Criteo-layout TSV (configs/etl_criteo.json, valid ratio 0.1);
bench/polars_compare.py then checks the same rows, labels, categorical ids and dense values.
The comparison is also shown to notice a changed id and a changed dense value. Skips visibly
without polars (pinned in bench/requirements-polars.txt, not part of CI's install), pyarrow or
the built dlrec.
"""
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

pl = pytest.importorskip("polars", reason="polars is not installed (bench/requirements-polars.txt)")
pytest.importorskip("pyarrow")
np = pytest.importorskip("numpy")

ROOT = os.path.join(os.path.dirname(__file__), "../..")
BIN_DIR = os.environ.get("DLREC_BIN_DIR", os.path.join(ROOT, "build/bin"))
DLREC = os.path.join(BIN_DIR, "dlrec")
sys.path.insert(0, os.path.join(ROOT, "bench"))
import polars_compare  # noqa: E402


@pytest.fixture(scope="module")
def outputs():
    if not os.path.exists(DLREC):
        pytest.skip(f"{DLREC} is not built")
    with tempfile.TemporaryDirectory(prefix="dlrec_polars_peer_") as tmp:  # removed afterwards
        yield run_both(pathlib.Path(tmp))


def run_both(d):
    data = str(d / "c.tsv")
    subprocess.run([DLREC, "datagen", "--rows", "60000", "--seed", "3", "--out", data],
                   check=True, capture_output=True)
    subprocess.run([DLREC, "etl", "--input", data, "--workflow",
                    os.path.join(ROOT, "configs/etl_criteo.json"), "--valid-ratio", "0.1",
                    "--out", str(d / "dlrec")], check=True, capture_output=True)
    p = subprocess.run([sys.executable, os.path.join(ROOT, "bench/polars_criteo_etl.py"),
                        "--data", data, "--out", str(d / "polars"), "--valid-ratio", "0.1"],
                       check=True, capture_output=True, text=True)
    assert "polars etl: input=" in p.stdout
    return str(d / "dlrec"), str(d / "polars")


def test_same_ids_and_dense_values(outputs):
    dlrec_out, polars_out = outputs
    assert polars_compare.compare(dlrec_out, polars_out) is None
    # The data is not trivial: rare keys (id 1) and a vocabulary in every column.
    labels, dense, ids, layout = polars_compare.read_split(dlrec_out, "train")
    assert len(labels) == 54000
    assert (ids == 1).any() and (ids >= 2).any() and (ids == 0).any()
    assert min(layout["cardinalities"]) > 2
    assert (dense > 0).any()


def test_comparison_notices_differences(outputs):
    import pyarrow as pa
    import pyarrow.parquet as pq

    dlrec_out, polars_out = outputs
    for column, change in (("C5", lambda a: a + 1), ("I3", lambda a: a * 1.001 + 1e-3)):
        bad = pathlib.Path(polars_out).parent / f"bad_{column}"
        bad.mkdir()
        for split in ("train", "valid"):
            t = pq.read_table(os.path.join(polars_out, f"{split}.parquet"))
            if split == "valid":
                i = t.schema.get_field_index(column)
                arr = t.column(column).to_numpy().copy()
                arr[7] = change(arr[7])
                t = t.set_column(i, column, pa.array(arr))
            pq.write_table(t, bad / f"{split}.parquet")
        diff = polars_compare.compare(dlrec_out, str(bad))
        assert diff is not None and diff.startswith(f"valid row 7 {column}"), diff
