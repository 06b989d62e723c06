"""`dlrec serve` against the unmodified tritonclient package (HTTP and gRPC).

Builds a small model repository with the CLI (datagen -> etl -> train -> export), starts the
server on free loopback ports and exercises every endpoint: health, metadata, inference with
JSON and binary tensors (raw and encoded inputs, compared with `dlrec predict`), repository
index/load/unload, statistics, metrics, bad requests, and a version swap under load.
"""
import http.client
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("tritonclient")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

BIN_DIR = os.environ.get("DLREC_BIN_DIR", "")
DLREC = os.path.join(BIN_DIR, "dlrec")
ROWS = 64
MAX_BODY = 4 << 20

pytestmark = pytest.mark.skipif(not os.path.exists(DLREC), reason="dlrec binary not built")


def run(*args):
    r = subprocess.run([DLREC, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"dlrec {' '.join(map(str, args))}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="module")
def server(work):
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    log = open(work["dir"] / "server.log", "w")
    proc = subprocess.Popen(
        [DLREC, "serve", "--model-repository", str(work["repo"]), "--http-port", str(ports["http"]),
         "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]),
         "--max-request-bytes", str(MAX_BODY), "--access-log"],
        stdout=log, stderr=subprocess.STDOUT)
    url = f"127.0.0.1:{ports['http']}"
    deadline = time.time() + 60
    while True:
        assert proc.poll() is None, (work["dir"] / "server.log").read_text()
        try:
            if httpclient.InferenceServerClient(url).is_server_ready():
                break
        except Exception:
            pass
        assert time.time() < deadline, "server did not start"
        time.sleep(0.2)
    info = {"proc": proc, "http": url, "grpc": f"127.0.0.1:{ports['grpc']}",
            "metrics": ports["metrics"], "port": ports["http"]}
    yield info
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    log.close()
    text = (work["dir"] / "server.log").read_text()
    assert "stopped" in text
    assert '"proto":"http"' in text and '"proto":"grpc"' in text  # access log


@pytest.fixture
def hc(server):
    return httpclient.InferenceServerClient(server["http"])


@pytest.fixture
def gc(server):
    return grpcclient.InferenceServerClient(server["grpc"])


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


def metadata_inputs(hc):
    return hc.get_model_metadata("m")["inputs"]


# --- health and metadata -------------------------------------------------------------------

def test_health_and_metadata_http(hc):
    assert hc.is_server_live()
    assert hc.is_server_ready()
    md = hc.get_server_metadata()
    assert md["name"] == "dlrec"
    assert {"binary_tensor_data", "statistics", "model_repository"} <= set(md["extensions"])
    assert hc.is_model_ready("m")
    assert hc.is_model_ready("m", "1")
    assert not hc.is_model_ready("m", "9")
    assert not hc.is_model_ready("nope")
    mm = hc.get_model_metadata("m")
    assert mm["name"] == "m" and mm["versions"] == ["1"] and mm["platform"] == "dlrec"
    assert len(mm["inputs"]) == 39
    assert mm["outputs"] == [{"name": "probability", "datatype": "FP32", "shape": [-1, 1]}]
    assert hc.get_model_metadata("m", "1")["name"] == "m"


def test_grpc_port_in_use_is_a_clear_error(work, server):
    """A second server on the gRPC port of the running one fails to start (gRPC's default
    SO_REUSEPORT would let it bind and share the port's connections)."""
    grpc_port = server["grpc"].rsplit(":", 1)[1]
    r = subprocess.run([DLREC, "serve", "--model-repository", str(work["repo"]), "--http-port",
                        "-1", "--metrics-port", "-1", "--grpc-port", grpc_port],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"gRPC: cannot bind 127.0.0.1:{grpc_port}" in r.stderr, r.stderr[-2000:]
    assert grpcclient.InferenceServerClient(server["grpc"]).is_server_live()


def test_health_and_metadata_grpc(gc):
    assert gc.is_server_live()
    assert gc.is_server_ready()
    md = gc.get_server_metadata()
    assert md.name == "dlrec" and "statistics" in md.extensions
    assert gc.is_model_ready("m")
    assert gc.is_model_ready("m", "1")
    assert not gc.is_model_ready("nope")
    mm = gc.get_model_metadata("m")
    assert mm.name == "m" and list(mm.versions) == ["1"]
    assert len(mm.inputs) == 39 and mm.outputs[0].name == "probability"
    assert list(mm.outputs[0].shape) == [-1, 1]


# --- inference -----------------------------------------------------------------------------

@pytest.mark.parametrize("binary", [False, True])
def test_infer_raw_http_matches_predict(work, hc, binary):
    cols = raw_columns(work, metadata_inputs(hc))
    inputs = make_inputs(httpclient, cols, binary=binary)
    outputs = [httpclient.InferRequestedOutput("probability", binary_data=binary)]
    if not binary:
        # NaN cannot travel as JSON; send those inputs in binary form instead (mixed request).
        for x, (name, arr) in zip(inputs, cols.items()):
            if arr.dtype == np.float32 and np.isnan(arr).any():
                x.set_data_from_numpy(arr, binary_data=True)
    res = hc.infer("m", inputs, outputs=outputs, request_id="r1")
    p = res.as_numpy("probability")
    assert p.shape == (ROWS, 1) and p.dtype == np.float32
    assert np.max(np.abs(p[:, 0] - work["expected"])) <= 1e-6
    assert res.get_response()["model_version"] == "1"
    assert res.get_response()["id"] == "r1"


def test_infer_raw_grpc_matches_predict(work, hc, gc):
    cols = raw_columns(work, metadata_inputs(hc))
    res = gc.infer("m", make_inputs(grpcclient, cols), model_version="1",
                   outputs=[grpcclient.InferRequestedOutput("probability")])
    p = res.as_numpy("probability")
    assert p.shape == (ROWS, 1)
    assert np.max(np.abs(p[:, 0] - work["expected"])) <= 1e-6


def encoded_columns(work, rows=16, seed=3):
    rng = np.random.default_rng(seed)
    lay = work["layout"]
    cols = {"dense": rng.normal(size=(rows, lay["num_dense"])).astype(np.float32)}
    for t, card in enumerate(lay["cardinalities"]):
        cols[f"cat_{t}"] = rng.integers(0, card, size=(rows, 1)).astype(np.int64)
    return cols


def test_infer_encoded_json_binary_grpc_agree(work, hc, gc):
    cols = encoded_columns(work)
    p_json = hc.infer("m", make_inputs(httpclient, cols, binary=False),
                      outputs=[httpclient.InferRequestedOutput("probability", binary_data=False)]
                      ).as_numpy("probability")
    p_bin = hc.infer("m", make_inputs(httpclient, cols, binary=True)).as_numpy("probability")
    p_grpc = gc.infer("m", make_inputs(grpcclient, cols)).as_numpy("probability")
    assert p_json.shape == (16, 1)
    assert np.max(np.abs(p_json - p_bin)) <= 1e-6
    assert np.max(np.abs(p_grpc - p_bin)) <= 1e-6
    assert np.all((p_bin > 0) & (p_bin < 1))


def test_encoded_matches_raw_when_ids_match(work, hc):
    # Rows whose categorical values are all missing encode to id 0 everywhere; dense values
    # go through the workflow, so compare a raw request of such rows with itself batched
    # differently (batch composition must not change results).
    cols = raw_columns(work, metadata_inputs(hc))
    full = hc.infer("m", make_inputs(httpclient, cols)).as_numpy("probability")[:, 0]
    half = {k: v[: ROWS // 2] for k, v in cols.items()}
    part = hc.infer("m", make_inputs(httpclient, half)).as_numpy("probability")[:, 0]
    assert np.max(np.abs(full[: ROWS // 2] - part)) <= 1e-6


# --- repository ----------------------------------------------------------------------------

def test_repository_index_load_unload_http(work, hc):
    idx = {(e["name"], e.get("version", "")): e for e in hc.get_model_repository_index()}
    assert idx[("m", "1")]["state"] == "READY"
    assert idx[("m2", "1")]["state"] == "READY"
    hc.unload_model("m2")
    assert not hc.is_model_ready("m2")
    idx = {e["name"]: e for e in hc.get_model_repository_index()}
    assert idx["m2"]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException):
        hc.infer("m2", make_inputs(httpclient, encoded_columns(work, 2)))
    hc.load_model("m2")
    assert hc.is_model_ready("m2", "1")
    with pytest.raises(InferenceServerException):
        hc.load_model("does-not-exist")
    with pytest.raises(InferenceServerException):
        hc.load_model("..")


def test_repository_index_load_unload_grpc(work, gc):
    idx = gc.get_model_repository_index()
    names = {(m.name, m.version, m.state) for m in idx.models}
    assert ("m", "1", "READY") in names
    gc.unload_model("m2")
    assert not gc.is_model_ready("m2")
    gc.load_model("m2")
    assert gc.is_model_ready("m2")
    with pytest.raises(InferenceServerException):
        gc.load_model("does-not-exist")


def test_version_swap_under_load_drops_nothing(work, hc, server):
    """A new version loads while clients keep sending; every request succeeds."""
    cols = encoded_columns(work, 4)
    errors, done = [], []
    stop = threading.Event()

    def client(i):
        c = grpcclient.InferenceServerClient(server["grpc"]) if i % 2 else \
            httpclient.InferenceServerClient(server["http"])
        mod = grpcclient if i % 2 else httpclient
        n = 0
        while not stop.is_set():
            try:
                p = c.infer("m2", make_inputs(mod, cols)).as_numpy("probability")
                assert p.shape == (4, 1)
                n += 1
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
        done.append(n)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    shutil.copytree(work["repo"] / "m2" / "1", work["repo"] / "m2" / "2")
    hc.load_model("m2")  # latest 1: version 2 replaces 1
    time.sleep(0.5)
    hc.load_model("m2")  # reload the same version while serving
    time.sleep(0.5)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert sum(done) > 0
    assert hc.is_model_ready("m2", "2")
    assert not hc.is_model_ready("m2", "1")
    assert hc.get_model_metadata("m2")["versions"] == ["2"]


# --- statistics and metrics ----------------------------------------------------------------

def metric(server, name, model, version):
    conn = http.client.HTTPConnection("127.0.0.1", server["metrics"], timeout=10)
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    assert r.status == 200
    text = r.read().decode()
    for line in text.splitlines():
        if line.startswith(f'{name}{{model="{model}",version="{version}"}} '):
            return int(line.split()[-1])
    raise AssertionError(f"{name} for {model}/{version} not in metrics:\n{text[:2000]}")


def test_statistics_and_metrics(work, hc, gc, server):
    before = hc.get_inference_statistics("m", "1")["model_stats"][0]
    cols = encoded_columns(work, 8)
    for _ in range(3):
        hc.infer("m", make_inputs(httpclient, cols))
    gc.infer("m", make_inputs(grpcclient, cols))
    st = hc.get_inference_statistics("m", "1")["model_stats"][0]
    assert st["name"] == "m" and st["version"] == "1"
    succ = st["inference_stats"]["success"]["count"]
    assert succ - before["inference_stats"]["success"]["count"] == 4
    assert st["inference_count"] - before["inference_count"] == 32
    assert st["execution_count"] >= before["execution_count"] + 1
    assert st["inference_stats"]["queue"]["count"] == succ
    assert st["last_inference"] > 0
    all_stats = hc.get_inference_statistics()["model_stats"]
    assert any(s["name"] == "m" for s in all_stats)
    gs = gc.get_inference_statistics("m", "1").model_stats[0]
    assert gs.inference_stats.success.count == succ
    assert gs.inference_count == st["inference_count"]
    with pytest.raises(InferenceServerException):
        hc.get_inference_statistics("nope")
    # Prometheus endpoint, Triton's names.
    assert metric(server, "nv_inference_request_success", "m", "1") == succ
    assert metric(server, "nv_inference_count", "m", "1") == st["inference_count"]
    assert metric(server, "nv_inference_exec_count", "m", "1") == st["execution_count"]
    assert metric(server, "nv_inference_request_failure", "m", "1") == \
        st["inference_stats"]["fail"]["count"]
    for n in ("nv_inference_request_duration_us", "nv_inference_queue_duration_us",
              "nv_inference_compute_infer_duration_us"):
        assert metric(server, n, "m", "1") >= 0


# --- bad requests --------------------------------------------------------------------------

def post(server, path, body, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server["port"], timeout=30)
    conn.request("POST", path, body=body, headers=headers or {})
    r = conn.getresponse()
    data = r.read()
    return r.status, data


def assert_error(status, data, codes):
    assert status in codes, (status, data[:300])
    msg = json.loads(data)["error"]
    assert isinstance(msg, str) and msg
    return msg


def test_bad_http_requests_get_4xx_and_server_keeps_serving(work, hc, server):
    good = {"inputs": [{"name": "dense", "datatype": "FP32", "shape": [1, work["layout"]["num_dense"]],
                        "data": [0.0] * work["layout"]["num_dense"]}] +
           [{"name": f"cat_{t}", "datatype": "INT64", "shape": [1, 1], "data": [0]}
            for t in range(len(work["layout"]["cardinalities"]))]}
    s, d = post(server, "/v2/models/m/infer", json.dumps(good))
    assert s == 200, d
    # Malformed JSON.
    assert_error(*post(server, "/v2/models/m/infer", b"{\"inputs\": [", None), {400})
    # Wrong shape.
    bad = json.loads(json.dumps(good))
    bad["inputs"][0]["shape"] = [1, 3]
    bad["inputs"][0]["data"] = [0.0] * 3
    assert "shape" in assert_error(*post(server, "/v2/models/m/infer", json.dumps(bad)), {400})
    # Data count not matching the shape.
    bad = json.loads(json.dumps(good))
    bad["inputs"][1]["shape"] = [2, 1]
    assert_error(*post(server, "/v2/models/m/infer", json.dumps(bad)), {400})
    # Wrong datatype.
    bad = json.loads(json.dumps(good))
    bad["inputs"][1]["datatype"] = "FP32"
    bad["inputs"][1]["data"] = [0.5]
    assert "datatype" in assert_error(*post(server, "/v2/models/m/infer", json.dumps(bad)), {400})
    # Id out of range.
    bad = json.loads(json.dumps(good))
    bad["inputs"][1]["data"] = [10 ** 12]
    assert_error(*post(server, "/v2/models/m/infer", json.dumps(bad)), {400})
    # Binary size mismatch (claims 8 bytes, sends 4).
    head = {"inputs": [{"name": "cat_0", "datatype": "INT64", "shape": [1, 1],
                        "parameters": {"binary_data_size": 8}}]}
    hb = json.dumps(head).encode()
    assert_error(*post(server, "/v2/models/m/infer", hb + b"\0" * 4,
                       {"Inference-Header-Content-Length": str(len(hb))}), {400})
    head["inputs"][0]["parameters"]["binary_data_size"] = 4
    hb = json.dumps(head).encode()
    assert_error(*post(server, "/v2/models/m/infer", hb + b"\0" * 4,
                       {"Inference-Header-Content-Length": str(len(hb))}), {400})
    assert_error(*post(server, "/v2/models/m/infer", hb,
                       {"Inference-Header-Content-Length": "abc"}), {400})
    # Unknown model / version.
    assert_error(*post(server, "/v2/models/nope/infer", json.dumps(good)), {404})
    assert_error(*post(server, "/v2/models/m/versions/7/infer", json.dumps(good)), {404})
    assert_error(*post(server, "/v2/models/m/versions/x1/infer", json.dumps(good)), {400})
    # Model names with '..' or '/'.
    assert_error(*post(server, "/v2/models/../infer", json.dumps(good)), {400, 404})
    assert_error(*post(server, "/v2/models/..%2F..%2Fetc/infer", json.dumps(good)), {400, 404})
    assert_error(*post(server, "/v2/repository/models/../load", b""), {400, 404})
    assert_error(*post(server, "/v2/repository/models/%2E%2E/load", b""), {400})
    # Oversized body.
    assert_error(*post(server, "/v2/models/m/infer", b"x" * (MAX_BODY + 1024)), {413})
    # Unknown endpoint.
    assert_error(*post(server, "/v2/nothing", b"{}"), {404})
    # tritonclient surfaces the messages as exceptions.
    with pytest.raises(InferenceServerException, match="not loaded"):
        hc.infer("nope", make_inputs(httpclient, encoded_columns(work, 1)))
    x = httpclient.InferInput("cat_0", [1, 1], "INT64")
    x.set_data_from_numpy(np.zeros((1, 1), np.int64))
    with pytest.raises(InferenceServerException, match="missing"):
        hc.infer("m", [x])
    # Still serving.
    assert hc.is_server_live() and hc.is_model_ready("m")
    s, d = post(server, "/v2/models/m/infer", json.dumps(good))
    assert s == 200, d


def test_bad_grpc_requests_get_status_codes(work, gc):
    import grpc

    def code_of(fn):
        with pytest.raises(InferenceServerException) as e:
            fn()
        return e.value.status()

    cols = encoded_columns(work, 2)
    assert "NOT_FOUND" in code_of(lambda: gc.infer("nope", make_inputs(grpcclient, cols)))
    assert "NOT_FOUND" in code_of(
        lambda: gc.infer("m", make_inputs(grpcclient, cols), model_version="5"))
    assert "INVALID_ARGUMENT" in code_of(lambda: gc.infer("..", make_inputs(grpcclient, cols)))
    assert "INVALID_ARGUMENT" in code_of(lambda: gc.infer("a/b", make_inputs(grpcclient, cols)))
    bad = dict(cols)
    bad["dense"] = bad["dense"][:, :3].copy()
    assert "INVALID_ARGUMENT" in code_of(lambda: gc.infer("m", make_inputs(grpcclient, bad)))
    bad = dict(cols)
    bad["cat_0"] = bad["cat_0"].astype(np.float32)
    assert "INVALID_ARGUMENT" in code_of(lambda: gc.infer("m", make_inputs(grpcclient, bad)))
    # A message above the size limit.
    big = {"dense": np.zeros((MAX_BODY // 4 + 16, 1), np.float32)}
    assert "RESOURCE_EXHAUSTED" in code_of(lambda: gc.infer("m", make_inputs(grpcclient, big)))
    assert grpc is not None
    assert gc.is_server_live()
    assert gc.infer("m", make_inputs(grpcclient, cols)).as_numpy("probability").shape == (2, 1)



# --- ModelInfer as raw bytes: the server's own wire reader and its protobuf fallback ----------

def raw_model_infer(server):
    import grpc
    ch = grpc.insecure_channel(server["grpc"] if isinstance(server, dict) else server)
    # No serializers: bytes in, bytes out.
    return ch, ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")


def infer_request_pb(cols, typed=False, parameters=False, model="m"):
    import tritonclient.grpc.service_pb2 as pb
    q = pb.ModelInferRequest(model_name=model, id="raw-bytes")
    for name, arr in cols.items():
        t = q.inputs.add(name=name, datatype="FP32" if arr.dtype == np.float32 else "INT64",
                         shape=list(arr.shape))
        if typed:
            if arr.dtype == np.float32:
                t.contents.fp32_contents.extend(arr.ravel().tolist())
            else:
                t.contents.int64_contents.extend(arr.ravel().tolist())
        else:
            q.raw_input_contents.append(arr.tobytes())
        if parameters:
            t.parameters["note"].string_param = "x"
    out = q.outputs.add(name="probability")
    if parameters:
        q.parameters["priority"].int64_param = 1
        out.parameters["binary_data"].bool_param = True
    return q


def probabilities(reply, model="m"):
    import tritonclient.grpc.service_pb2 as pb
    r = pb.ModelInferResponse.FromString(reply)
    assert r.model_name == model and r.model_version == "1" and r.id == "raw-bytes"
    assert [o.name for o in r.outputs] == ["probability"] and r.outputs[0].datatype == "FP32"
    rows = r.outputs[0].shape[0]
    assert list(r.outputs[0].shape) == [rows, 1]
    return np.frombuffer(r.raw_output_contents[0], np.float32).reshape(rows, 1)


def test_grpc_wire_reader_and_protobuf_fallback_agree(work, hc, server):
    """Plain messages (read from the received bytes), typed contents and parameters (left to
    protobuf) give the HTTP answer; rows vary from call to call, and a raw-contract request
    comes in between, so that reused per-call buffers grow, shrink and change contract."""
    ch, infer = raw_model_infer(server)
    raw_cols = raw_columns(work, metadata_inputs(hc))
    raw_expected = hc.infer("m", make_inputs(httpclient, raw_cols)).as_numpy("probability")
    for k, rows in enumerate([1, 7, 3, 16, 2, 64, 5, 1, 33, 8] * 4):
        cols = encoded_columns(work, rows, seed=100 + k)
        expected = hc.infer("m", make_inputs(httpclient, cols)).as_numpy("probability")
        got = probabilities(infer(infer_request_pb(cols).SerializeToString(), timeout=30))
        assert np.max(np.abs(got - expected)) <= 1e-6, (k, rows)
        if k % 3 == 0:
            typed = infer_request_pb(cols, typed=True, parameters=k % 2 == 0)
            got = probabilities(infer(typed.SerializeToString(), timeout=30))
            assert np.max(np.abs(got - expected)) <= 1e-6, ("typed", k, rows)
        if k % 7 == 0:
            q = infer_request_pb({}, parameters=True)
            del q.inputs[:]
            for name, arr in raw_cols.items():
                dt = "BYTES" if arr.dtype == np.object_ else "FP32"
                q.inputs.add(name=name, datatype=dt, shape=list(arr.shape))
                if dt == "FP32":
                    q.raw_input_contents.append(arr.tobytes())
                else:
                    q.raw_input_contents.append(b"".join(
                        len(v).to_bytes(4, "little") + v for v in arr.ravel()))
            got = probabilities(infer(q.SerializeToString(), timeout=30))
            assert np.max(np.abs(got - raw_expected)) <= 1e-6, ("raw contract", k)
    ch.close()



@pytest.mark.parametrize("parse_threads", [None, 0])
def test_grpc_big_requests_across_transport_slices(work, hc, server, tmp_path, parse_threads):
    """Requests of ~0.3-1 MB arrive in several transport slices; tensors that span them are
    gathered into the model's input buffers. Every answer must equal HTTP's, and a bad id in
    such a tensor must be reported (and leave the next call intact). None: the module's server
    (defaults: big requests read on the parse threads); 0: a server reading them on its
    polling thread (--grpc-parse-threads 0)."""
    import grpc
    if parse_threads is None:
        ch, infer = raw_model_infer(server)
    else:
        proc, ports, log, _ = start_slow_server(
            work, tmp_path, max_queue_size=4096, delay_s=0, max_batch=8192,
            args=("--grpc-parse-threads", str(parse_threads)))
        ch, infer0 = raw_model_infer(f"127.0.0.1:{ports['grpc']}")

        def infer(body, timeout):  # the same request, for the model of that server
            import tritonclient.grpc.service_pb2 as pb
            q = pb.ModelInferRequest.FromString(body)
            q.model_name = "slow"
            r = pb.ModelInferResponse.FromString(infer0(q.SerializeToString(), timeout=timeout))
            r.model_name = "m"
            return r.SerializeToString()
    for k, rows in enumerate([3000, 1200, 4000, 7, 3000]):
        cols = encoded_columns(work, rows, seed=200 + k)
        expected = hc.infer("m", make_inputs(httpclient, cols)).as_numpy("probability")
        got = probabilities(infer(infer_request_pb(cols).SerializeToString(), timeout=60))
        assert np.max(np.abs(got - expected)) <= 1e-6, (k, rows)
    cols = encoded_columns(work, 3000, seed=300)
    card = work["layout"]["cardinalities"][20]
    cols["cat_20"] = cols["cat_20"].copy()
    cols["cat_20"][2500, 0] = card
    with pytest.raises(grpc.RpcError) as e:
        infer(infer_request_pb(cols).SerializeToString(), timeout=60)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "cat_20" in e.value.details() and "row 2500" in e.value.details(), e.value.details()
    cols["dense"] = cols["dense"].copy()
    cols["cat_20"][2500, 0] = 0
    cols["dense"][1999, 1] = np.inf
    with pytest.raises(grpc.RpcError) as e:
        infer(infer_request_pb(cols).SerializeToString(), timeout=60)
    assert "dense" in e.value.details() and "row 1999" in e.value.details(), e.value.details()
    cols["dense"][1999, 1] = 0.5
    expected = hc.infer("m", make_inputs(httpclient, cols)).as_numpy("probability")
    got = probabilities(infer(infer_request_pb(cols).SerializeToString(), timeout=60))
    assert np.max(np.abs(got - expected)) <= 1e-6
    ch.close()
    if parse_threads is not None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()

def test_grpc_malformed_model_infer_bytes_are_invalid_argument(work, server, gc):
    import grpc
    ch, infer = raw_model_infer(server)
    good = infer_request_pb(encoded_columns(work, 4)).SerializeToString()
    cases = {
        "truncated in a tensor": good[:-5],
        "truncated in a tag": good[: good.index(b"dense") - 1],
        "garbage": b"\xff\xff\xff\xff",
        "length past the end": b"\x0a\x7fm",
        "invalid UTF-8 model name": b"\x0a\x02\xc3\x28",
    }
    for what, body in cases.items():
        with pytest.raises(grpc.RpcError) as e:
            infer(body, timeout=30)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (what, e.value.details())
        assert "not a valid inference.ModelInferRequest" in e.value.details(), what
    # A prefix that ends on a field boundary is a valid (smaller) message: protobuf's answer.
    with pytest.raises(grpc.RpcError) as e:
        infer(good[: good.index(b"dense") - 4], timeout=30)  # model name and id only
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
    assert "no inputs" in e.value.details()
    # The empty message: no model name.
    with pytest.raises(grpc.RpcError) as e:
        infer(b"", timeout=30)
    assert e.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND)
    assert gc.is_server_live()
    assert probabilities(infer(good, timeout=30)).shape == (4, 1)
    ch.close()

# --- protocol definition -------------------------------------------------------------------

_DUMP = r'''
import sys, json, importlib
if sys.argv[1] == "mine":
    sys.path.insert(0, sys.argv[2]); m = importlib.import_module("grpc_service_pb2")
else:
    import tritonclient.grpc.service_pb2 as m
def walk(d, prefix=""):
    out = {}
    for f in d.fields:
        out[prefix + d.name + "." + f.name] = [f.number, f.type, f.is_repeated if hasattr(f, "is_repeated") else f.label == 3,
                                               f.message_type.full_name if f.message_type else None]
    for n in d.nested_types:
        out.update(walk(n, prefix + d.name + "."))
    return out
res = {}
for md in m.DESCRIPTOR.message_types_by_name.values():
    res.update(walk(md))
for x in m.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
    res["rpc." + x.name] = [x.input_type.full_name, x.output_type.full_name]
print(json.dumps(res))
'''


def test_proto_matches_tritonclient_wire_format(tmp_path):
    """Every message, field number and type and every RPC of our .proto is as tritonclient has it."""
    protoc = shutil.which("protoc")
    if not protoc:
        pytest.skip("protoc not installed")
    src = Path(os.environ.get("DLREC_SOURCE_DIR", Path(__file__).resolve().parents[2]))
    subprocess.run([protoc, f"--proto_path={src / 'src/serve/proto'}", f"--python_out={tmp_path}",
                    "grpc_service.proto"], check=True)
    import sys
    dumps = []
    for which in ("mine", "theirs"):
        r = subprocess.run([sys.executable, "-c", _DUMP, which, str(tmp_path)], capture_output=True,
                           text=True)
        if r.returncode != 0 and which == "mine" and "protobuf" in r.stderr.lower():
            pytest.skip("generated Python code does not match the installed protobuf runtime")
        assert r.returncode == 0, r.stderr
        dumps.append(json.loads(r.stdout))
    mine, theirs = dumps
    assert len(mine) > 100
    assert {k: v for k, v in mine.items() if theirs.get(k) != v} == {}


# --- blocked calls, overload and graceful shutdown over gRPC -----------------------------------
# A model whose requests wait in the queue for SLOW_S (long delay, preferred batch never
# reached, max_queue_size 1), served with one gRPC completion-queue thread: a call blocked in
# the batcher must not hold up the calls behind it.

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


def infer_in_thread(url, cols, out):
    def go():
        t0 = time.time()
        try:
            p = grpcclient.InferenceServerClient(url).infer("slow", make_inputs(grpcclient, cols))
            out["probability"] = p.as_numpy("probability")
        except Exception as e:  # noqa: BLE001
            out["error"] = repr(e)
        out["seconds"] = time.time() - t0
    t = threading.Thread(target=go)
    t.start()
    return t


def let_it_queue():
    """Time for the call started in a thread to reach the server's queue (a loopback call takes
    milliseconds). Were it late, the tests fail (the order of the calls is asserted), never pass
    by accident."""
    time.sleep(0.5)


def test_grpc_overload_while_a_call_blocks(work, tmp_path):
    """With the one queue slot taken by a waiting call, the next inference is rejected with
    RESOURCE_EXHAUSTED at once and other RPCs are answered: the thread blocked in the first
    call does not stall them. The blocked call then succeeds."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path)
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        cols = encoded_columns(work, 2)
        first = {}
        t = infer_in_thread(url, cols, first)
        let_it_queue()
        gc = grpcclient.InferenceServerClient(url)
        t0 = time.time()
        assert gc.is_server_live()
        with pytest.raises(InferenceServerException) as e:
            gc.infer("slow", make_inputs(grpcclient, cols))
        assert "RESOURCE_EXHAUSTED" in e.value.status(), str(e.value)
        assert "max_queue_size" in e.value.message()
        assert time.time() - t0 < SLOW_S / 2, "the rejection waited for the blocked call"
        t.join(timeout=30)
        assert "error" not in first, first
        assert first["probability"].shape == (2, 1)
        assert first["seconds"] >= SLOW_S * 0.8  # it did wait in the queue
        st = gc.get_inference_statistics("slow")  # protobuf message
        stats = st.model_stats[0].inference_stats
        assert stats.success.count == 1 and stats.fail.count == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()


def test_grpc_graceful_shutdown_finishes_calls_in_flight(work, tmp_path):
    """SIGTERM while a call waits in the queue: the call completes with its result, the server
    then exits 0."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path)
    url = f"127.0.0.1:{ports['grpc']}"
    cols = encoded_columns(work, 3)
    out = {}
    t = infer_in_thread(url, cols, out)
    let_it_queue()
    proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    assert proc.wait(timeout=60) == 0
    log.close()
    assert "error" not in out, out
    assert out["probability"].shape == (3, 1)
    text = log_path.read_text()
    assert "finishing requests in flight" in text and "stopped" in text


# --- many calls in flight: ModelInfer never holds the completion-queue thread ---------------
# Calls wait in the batcher (the slow model's queue delay) without a server thread each: the
# one completion-queue thread parses and submits them, a batcher worker answers them. More
# calls are in flight than the server arms call slots for at start (8 per queue; it arms more
# on demand).

def server_threads(proc):
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def async_calls(url, calls):
    """Starts `calls` (a list of (model, inputs)) at once on one connection; returns the client
    and a function waiting for their outcomes: (result array or None, status or None)."""
    c = grpcclient.InferenceServerClient(url)
    out = [None] * len(calls)
    left = threading.Semaphore(0)

    def callback(i, result, error):
        if error is not None:
            out[i] = (None, error.status(), error.message())
        else:
            out[i] = (result.as_numpy("probability"), None, None)
        left.release()

    for i, (model, inputs) in enumerate(calls):
        c.async_infer(model, inputs, lambda result, error, i=i: callback(i, result, error))

    def wait(timeout=60):
        for _ in calls:
            assert left.acquire(timeout=timeout), "a call got no answer"
        return out
    return c, wait


def roll_cols(cols, k):
    return {n: np.roll(a, k, axis=0) for n, a in cols.items()}


@pytest.mark.parametrize("parse_bytes", [65536, 0])
def test_grpc_many_calls_in_flight_each_get_their_answer(work, tmp_path, parse_bytes):
    """300 concurrent calls (valid ones with rows rolled by i, every third one malformed) wait
    together in the batcher: each gets its own rows back or its INVALID_ARGUMENT, they are
    merged into few executions, and the server does not grow a thread per waiting call (also
    with every request read on the parse threads: --grpc-parse-bytes 0)."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path, max_queue_size=4096,
                                                   delay_s=0.5,
                                                   args=("--grpc-parse-bytes", str(parse_bytes)))
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        cols = encoded_columns(work, 3, seed=11)
        gc = grpcclient.InferenceServerClient(url)
        base = gc.infer("slow", make_inputs(grpcclient, cols)).as_numpy("probability")[:, 0]
        threads_before = server_threads(proc)
        n = 300
        calls = []
        for i in range(n):
            c = roll_cols(cols, i)
            if i % 3 == 2:
                c["cat_0"] = c["cat_0"].astype(np.float32)  # wrong datatype
            calls.append(("slow", make_inputs(grpcclient, c)))
        t0 = time.time()
        _, wait = async_calls(url, calls)
        time.sleep(0.25)  # all are queued now (the queue delay is 0.5 s)
        threads_during = server_threads(proc)
        t_live = time.time()
        assert gc.is_server_live()
        live_s = time.time() - t_live
        out = wait()
        seconds = time.time() - t0
        for i, (p, status, msg) in enumerate(out):
            if i % 3 == 2:
                assert p is None and "INVALID_ARGUMENT" in status, (i, status, msg)
                assert "cat_0" in msg, msg
            else:
                assert status is None, (i, status, msg)
                np.testing.assert_allclose(p[:, 0], np.roll(base, i), rtol=1e-6, atol=1e-7)
        assert threads_during <= threads_before + 4, (threads_before, threads_during)
        assert live_s < 0.3, f"ServerLive waited behind the queued calls ({live_s:.2f} s)"
        assert seconds < 10, seconds
        st = gc.get_inference_statistics("slow").model_stats[0]
        assert st.inference_stats.success.count == 1 + 200
        assert st.inference_stats.fail.count == 100
        assert st.execution_count <= 1 + 10, st.execution_count  # merged, not one by one
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()


def test_grpc_overload_of_many_calls_in_flight(work, tmp_path):
    """40 concurrent calls into a queue of 8: 8 wait and succeed, the rest are answered at once
    with RESOURCE_EXHAUSTED; the statistics count both."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path, max_queue_size=8, delay_s=1.0)
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        cols = encoded_columns(work, 2)
        _, wait = async_calls(url, [("slow", make_inputs(grpcclient, cols))] * 40)
        out = wait()
        ok = [o for o in out if o[1] is None]
        rejected = [o for o in out if o[1] is not None]
        assert len(ok) == 8, [o[1:] for o in out]
        assert all("RESOURCE_EXHAUSTED" in o[1] and "max_queue_size" in o[2] for o in rejected)
        assert all(o[0].shape == (2, 1) for o in ok)
        st = grpcclient.InferenceServerClient(url).get_inference_statistics("slow").model_stats[0]
        assert st.inference_stats.success.count == 8 and st.inference_stats.fail.count == 32
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()


def test_grpc_unload_while_calls_wait(work, tmp_path):
    """The model is unloaded (over gRPC) while 50 calls wait in its queue: they all finish on
    the version they started with; later calls get NOT_FOUND until it is loaded again."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path, max_queue_size=4096,
                                                   delay_s=1.0)
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        cols = encoded_columns(work, 2)
        _, wait = async_calls(url, [("slow", make_inputs(grpcclient, cols))] * 50)
        let_it_queue()
        gc = grpcclient.InferenceServerClient(url)
        gc.unload_model("slow")
        assert not gc.is_model_ready("slow")
        with pytest.raises(InferenceServerException) as e:
            gc.infer("slow", make_inputs(grpcclient, cols))
        assert "NOT_FOUND" in e.value.status(), str(e.value)
        out = wait()
        assert all(o[1] is None and o[0].shape == (2, 1) for o in out), [o[1:] for o in out]
        gc.load_model("slow")
        assert gc.infer("slow", make_inputs(grpcclient, cols)).as_numpy("probability").shape == \
            (2, 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()


@pytest.mark.parametrize("spin_us,parse_bytes", [(0, 65536), (200, 65536), (0, 0)])
def test_grpc_shutdown_answers_every_call_in_flight(work, tmp_path, spin_us, parse_bytes):
    """SIGTERM while 100 calls wait in the batcher: every call gets its result, the server
    exits 0 (also with the polling thread spinning between events, and with every request
    read on the parse threads: --grpc-parse-bytes 0)."""
    proc, ports, log, log_path = start_slow_server(
        work, tmp_path, max_queue_size=4096,
        args=("--grpc-spin-us", str(spin_us), "--grpc-parse-bytes", str(parse_bytes)))
    url = f"127.0.0.1:{ports['grpc']}"
    cols = encoded_columns(work, 2)
    _, wait = async_calls(url, [("slow", make_inputs(grpcclient, cols))] * 100)
    let_it_queue()
    proc.send_signal(signal.SIGTERM)
    out = wait()
    assert proc.wait(timeout=60) == 0
    log.close()
    assert all(o[1] is None and o[0].shape == (2, 1) for o in out), \
        [(i, o[1:]) for i, o in enumerate(out) if o[1] is not None or o[0] is None][:5]
    text = log_path.read_text()
    assert "finishing requests in flight" in text and "stopped" in text


class StallingProxy:
    """A TCP proxy in front of the server's gRPC port. It forwards both ways until stall();
    from then on what the server sends waits, unread, in the proxy's socket (as with a client
    too busy to read) until resume(). The client's bytes keep flowing to the server."""

    def __init__(self, port):
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.flowing = threading.Event()
        self.flowing.set()
        self.forwarded_after_stall = 0  # server bytes passed on while stalled: must stay 0
        self.stalled = False
        threading.Thread(target=self._accept, daemon=True).start()

    def stall(self):
        self.stalled = True
        self.flowing.clear()

    def resume(self):
        self.stalled = False
        self.flowing.set()

    def close(self):
        self.listener.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src, dst, gated):
        try:
            while True:
                if not select.select([src], [], [], 0.05)[0]:
                    continue
                if gated:
                    self.flowing.wait()  # checked after select: nothing is read while stalled
                data = src.recv(1 << 16)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if gated and self.stalled:
                    self.forwarded_after_stall += len(data)
                dst.sendall(data)
        except OSError:
            for sock in (src, dst):
                sock.close()


def wait_until(cond, timeout=60):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_grpc_shutdown_closes_no_connection_before_its_answers_are_read(work, tmp_path):
    """SIGTERM while 100 calls wait in the batcher, their client reading nothing of what the
    server sends (a proxy holds it) by the time they are answered: the server must not close
    the connection, nor exit, before the client has read the answers. It did: it closed the
    connection right after writing them to the socket, and under load (the client slow to
    read) the client got a TCP reset instead of its answers (UNAVAILABLE "Stream removed ...
    Connection reset by peer"). Now the answers go out before the GOAWAY and PING of the
    shutdown, and the connection closes once the client has acknowledged the PING."""
    proc, ports, log, log_path = start_slow_server(
        work, tmp_path, max_queue_size=4096, delay_s=3.0, args=("--access-log",))
    proxy = StallingProxy(ports["grpc"])
    try:
        cols = encoded_columns(work, 2)
        _, wait = async_calls(f"127.0.0.1:{proxy.port}",
                              [("slow", make_inputs(grpcclient, cols))] * 100)
        let_it_queue()
        proc.send_signal(signal.SIGTERM)
        let_it_queue()  # a shutdown that starts with GOAWAY and PING has them answered by now
        proxy.stall()

        def answered():
            lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
            return sum(x["path"].endswith("/ModelInfer") and x["status"] == 0 for x in lines)
        wait_until(lambda: answered() == 100)  # 3 s after they were queued
        # The answers wait in the proxy: the server must keep the connection (and run) until
        # the client has read them. (Before, it exited within milliseconds here.)
        for _ in range(20):
            assert proc.poll() is None, "the server closed before the client read its answers"
            time.sleep(0.1)
        assert proxy.forwarded_after_stall == 0
        proxy.resume()
        out = wait()
        assert proc.wait(timeout=60) == 0
        assert all(o[1] is None and o[0].shape == (2, 1) for o in out), \
            [(i, o[1:]) for i, o in enumerate(out) if o[1] is not None or o[0] is None][:5]
    finally:
        proxy.close()
        if proc.poll() is None:
            proc.kill()
        log.close()


def test_grpc_shutdown_refuses_new_inferences_while_it_drains(work, tmp_path):
    """After SIGTERM, while a call waits in the batcher, a new inference is refused at once with
    UNAVAILABLE (the server is shutting down); liveness and readiness are still answered (not
    ready). The waiting call then completes and the server exits 0."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path, delay_s=3.0)
    url = f"127.0.0.1:{ports['grpc']}"
    cols = encoded_columns(work, 2)
    gc = grpcclient.InferenceServerClient(url)
    assert gc.is_server_live()  # connected before the shutdown
    first = {}
    t = infer_in_thread(url, cols, first)
    let_it_queue()
    proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "finishing requests in flight" in log_path.read_text())
    wait_until(lambda: not gc.is_server_ready())
    t0 = time.time()
    with pytest.raises(InferenceServerException) as e:
        gc.infer("slow", make_inputs(grpcclient, cols))
    assert "UNAVAILABLE" in e.value.status(), str(e.value)
    assert "shutting down" in e.value.message()
    assert time.time() - t0 < 1.5, "the refusal waited for the call in flight"
    assert gc.is_server_live()
    t.join(timeout=60)
    assert proc.wait(timeout=60) == 0
    log.close()
    assert "error" not in first, first
    assert first["probability"].shape == (2, 1)


def test_grpc_client_gone_before_the_answer(work, tmp_path):
    """20 calls time out on the client (0.3 s) while they wait in the batcher (1 s): their
    answers, sent later from the worker, go nowhere; the server keeps serving and counts them
    as scored."""
    proc, ports, log, log_path = start_slow_server(work, tmp_path, max_queue_size=4096,
                                                   delay_s=1.0)
    url = f"127.0.0.1:{ports['grpc']}"
    try:
        cols = encoded_columns(work, 2)
        c = grpcclient.InferenceServerClient(url)
        errors = []
        left = threading.Semaphore(0)

        def callback(result, error):
            errors.append(None if error is None else error.status())
            left.release()

        for _ in range(20):
            c.async_infer("slow", make_inputs(grpcclient, cols), callback, client_timeout=0.3)
        for _ in range(20):
            assert left.acquire(timeout=30)
        assert all(e is not None and "DEADLINE_EXCEEDED" in e for e in errors), errors
        time.sleep(1.5)  # the worker answers the abandoned calls
        assert c.is_server_live()
        p = c.infer("slow", make_inputs(grpcclient, cols)).as_numpy("probability")
        assert p.shape == (2, 1)
        st = c.get_inference_statistics("slow").model_stats[0].inference_stats
        assert st.success.count == 21, st
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log.close()
