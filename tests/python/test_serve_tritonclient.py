"""`dlrec serve` against the unmodified tritonclient package (HTTP and gRPC).

Builds a small model repository with the CLI (datagen -> etl -> train -> export), starts the
server on free loopback ports and exercises every endpoint: health, metadata, inference with
JSON and binary tensors (raw and encoded inputs, compared with `dlrec predict`), repository
index/load/unload, statistics, metrics, bad requests, and a version swap under load.
"""
import http.client
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tritonclient_common import (  # noqa: F401 (work, pytestmark: fixture, marks)
    DLREC, MAX_BODY, ROWS, encoded_columns, free_port, grpcclient, httpclient, make_inputs, np, pytestmark, raw_columns, start_slow_server, work)
from tritonclient.utils import InferenceServerException  # noqa: E402

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


