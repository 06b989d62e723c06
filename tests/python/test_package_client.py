"""dlrec.Client (the package's KServe v2 HTTP client, standard library only) against `dlrec
serve`: health, metadata, raw rows as JSON and as binary tensors equal to dlrec.Predictor's,
and the server's errors as ServerError with the HTTP status."""
import json
import subprocess
import time

import pytest

from package_common import DLREC, TRAIN_CONFIG, WORKFLOW, cli, free_port, import_dlrec

np = pytest.importorskip("numpy")
dlrec = import_dlrec()
from dlrec.client import ServerError  # noqa: E402

ROWS = 32


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    if subprocess.run([DLREC, "serve", "--help"], capture_output=True).returncode != 0:
        pytest.skip("this dlrec was built without the server (cmake/Server.cmake)")
    d = tmp_path_factory.mktemp("client")
    cli("datagen", "--out", d / "raw.tsv", "--rows", 1500, "--seed", 4)
    (d / "wf.json").write_text(json.dumps(WORKFLOW))
    dlrec.etl(d / "raw.tsv", d / "data", workflow=d / "wf.json")
    dlrec.train(TRAIN_CONFIG, d / "data", d / "run", max_steps=5)
    dlrec.export(d / "run", d / "repo" / "m" / "1")
    port = free_port()
    log = open(d / "server.log", "w")
    proc = subprocess.Popen([DLREC, "serve", "--model-repository", d / "repo", "--http-port",
                             str(port), "--grpc-port", str(free_port()), "--metrics-port",
                             str(free_port())], stdout=log, stderr=subprocess.STDOUT)
    client = dlrec.Client(f"127.0.0.1:{port}", timeout=30)
    try:
        deadline = time.monotonic() + 60
        while not _ready(client):
            assert proc.poll() is None, (d / "server.log").read_text()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        lines = (d / "raw.tsv").read_text().splitlines()[:ROWS]
        yield {"client": client, "lines": lines, "model_dir": d / "repo" / "m" / "1",
               "expected": dlrec.Predictor(d / "repo" / "m" / "1").predict(lines)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


def _ready(client):
    try:
        return client.ready()
    except OSError:
        return False


def raw_inputs(lines, meta):
    fields = [line.split("\t") for line in lines]
    out = {}
    for i, t in enumerate(meta["inputs"]):
        vals = [f[i + 1] for f in fields]
        out[t["name"]] = (np.array([float(v) if v else np.nan for v in vals], np.float32)
                          if t["datatype"] == "FP32" else vals)
    return out


def test_health_and_metadata(served):
    c = served["client"]
    assert c.live() and c.ready() and c.model_ready("m") and c.model_ready("m", 1)
    assert not c.model_ready("nope")
    assert "binary_tensor_data" in c.metadata()["extensions"]
    meta = c.model_metadata("m")
    assert meta["name"] == "m" and len(meta["inputs"]) == 39


@pytest.mark.parametrize("binary", [False, True])
def test_infer_matches_predictor(served, binary):
    c = served["client"]
    inputs = raw_inputs(served["lines"], c.model_metadata("m"))
    got = c.infer("m", inputs, binary=binary, request_id="r1")
    assert got.dtype == np.float32 and got.shape == (ROWS,)
    np.testing.assert_allclose(got, served["expected"], rtol=0, atol=1e-6)


def test_server_errors(served):
    c = served["client"]
    inputs = raw_inputs(served["lines"], c.model_metadata("m"))
    with pytest.raises(ServerError) as e:
        c.infer("nope", inputs)
    assert e.value.status == 404 and "nope" in e.value.message
    del inputs["C1"]
    with pytest.raises(ServerError) as e:
        c.infer("m", inputs)
    assert e.value.status == 400 and "C1" in e.value.message
    with pytest.raises(TypeError, match="dtype complex128"):
        c.infer("m", {"I1": np.zeros(2, np.complex128)})
    with pytest.raises(TypeError, match="non-empty dict"):
        c.infer("m", {})
    with pytest.raises(TypeError, match="input 'C1': element 1 is int"):  # never 5 zero bytes
        c.infer("m", {"C1": np.array(["a", 5], dtype=object)})
    with pytest.raises(TimeoutError):
        dlrec.Client(f"127.0.0.1:{free_port()}").wait_ready(timeout=0.3)


def test_infer_all_json_matches_predictor(served):
    """No NaN: every tensor goes as JSON data; compared with the Predictor on the same columns."""
    c = served["client"]
    inputs = raw_inputs(served["lines"], c.model_metadata("m"))
    inputs = {k: (np.nan_to_num(v, nan=1.0) if isinstance(v, np.ndarray) else v)
              for k, v in inputs.items()}
    hexes = {k: np.array([int(x, 16) if x else -1 for x in v], np.int64)
             for k, v in inputs.items() if not isinstance(v, np.ndarray)}
    dense = {k: v for k, v in inputs.items() if isinstance(v, np.ndarray)}
    model = served["model_dir"]
    want = dlrec.Predictor(model).predict({**dense, **hexes})
    np.testing.assert_allclose(c.infer("m", inputs), want, rtol=0, atol=1e-6)
