"""Shared by the tritonclient tests of `dlrec serve` (test_serve_tritonclient.py and
test_serve_tritonclient_calls.py): the dlrec binary, a small model repository built with the CLI
(datagen -> etl -> train -> export; the `work` fixture), the request columns, and a second
server of a slow model (start_slow_server)."""
import json
import shutil
import subprocess
import time

import pytest

from package_common import DLREC, cli as run, free_port, needs_dlrec as pytestmark  # noqa: F401

np = pytest.importorskip("numpy")
pytest.importorskip("tritonclient")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

ROWS = 64
MAX_BODY = 4 << 20


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    run("datagen", "--out", d / "raw.tsv", "--rows", 20000, "--seed", 7)
    run("etl", "--input", d / "raw.tsv", "--out", d / "data")
    cfg = {
        "model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1],
                  "interaction": "dot", "pooling": "sum"},
        "optimizer": {"type": "adagrad", "lr": 0.02},
        "train": {"batch_size": 256, "epochs": 1, "max_steps": 50, "eval_every": 0,
                  "log_every": 100, "checkpoint_every": 0, "seed": 1, "device": "cpu"},
    }
    (d / "cfg.json").write_text(json.dumps(cfg))
    run("train", "--config", d / "cfg.json", "--data", d / "data", "--run", d / "run",
        "--max-steps", 50)
    repo = d / "repo"
    repo.mkdir()
    run("export", "--run", d / "run", "--out", repo / "m" / "1")
    shutil.copytree(repo / "m" / "1", repo / "m2" / "1")
    (repo / "m2" / "config.json").write_text(json.dumps(
        {"version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 1024,
         "dynamic_batching": {"max_queue_delay_microseconds": 200, "max_queue_size": 4096}}))
    lines = (d / "raw.tsv").read_text().splitlines()[:ROWS]
    (d / "rows.tsv").write_text("\n".join(lines) + "\n")
    expected = np.array([float(x) for x in run("predict", "--model", repo / "m" / "1", "--input",
                                                d / "rows.tsv").split()], dtype=np.float64)
    assert expected.shape == (ROWS,)
    layout = json.loads((repo / "m" / "1" / "model.json").read_text())["layout"]
    return {"dir": d, "repo": repo, "lines": lines, "expected": expected, "layout": layout}


def raw_columns(work, meta_inputs):
    """The rows as per-column arrays (schema order = TSV order after the label)."""
    fields = [line.split("\t") for line in work["lines"]]
    cols = {}
    for i, t in enumerate(meta_inputs):
        vals = [f[i + 1] for f in fields]
        if t["datatype"] == "FP32":
            cols[t["name"]] = np.array([[float(v) if v else np.nan] for v in vals], np.float32)
        else:
            cols[t["name"]] = np.array([[v.encode()] for v in vals], dtype=np.object_)
    return cols


def make_inputs(mod, cols, binary=True):
    out = []
    for name, arr in cols.items():
        dt = "BYTES" if arr.dtype == np.object_ else ("FP32" if arr.dtype == np.float32 else "INT64")
        x = mod.InferInput(name, list(arr.shape), dt)
        if mod is httpclient:
            x.set_data_from_numpy(arr, binary_data=binary)
        else:
            x.set_data_from_numpy(arr)
        out.append(x)
    return out


def encoded_columns(work, rows=16, seed=3):
    rng = np.random.default_rng(seed)
    lay = work["layout"]
    cols = {"dense": rng.normal(size=(rows, lay["num_dense"])).astype(np.float32)}
    for t, card in enumerate(lay["cardinalities"]):
        cols[f"cat_{t}"] = rng.integers(0, card, size=(rows, 1)).astype(np.int64)
    return cols


SLOW_S = 1.5


def start_slow_server(work, tmp_path, max_queue_size=1, delay_s=SLOW_S, args=(),
                      max_batch=1024):
    repo = tmp_path / "repo"
    shutil.copytree(work["repo"] / "m" / "1", repo / "slow" / "1")
    (repo / "slow" / "config.json").write_text(json.dumps(
        {"max_batch_size": max_batch,
         "dynamic_batching": {"preferred_batch_size": [max_batch],
                              "max_queue_delay_microseconds": int(delay_s * 1e6),
                              "max_queue_size": max_queue_size}}))
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    log_path = tmp_path / "slow_server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [DLREC, "serve", "--model-repository", str(repo), "--http-port", str(ports["http"]),
         "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
         "--grpc-threads", "1", *args], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while True:
        assert proc.poll() is None, log_path.read_text()
        try:
            if grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}").is_server_ready():
                break
        except Exception:  # noqa: BLE001
            pass
        assert time.time() < deadline, "server did not start"
        time.sleep(0.2)
    return proc, ports, log, log_path
