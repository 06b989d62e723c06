"""`dlrec serve` under the hostile requests of issue 25, against a real model.

Builds a small model repository with the CLI (datagen -> etl -> train -> export), starts the
server, sends each hostile request and then checks that the process is alive and still answers
health checks and a valid inference. Python standard library only (raw sockets, http.client);
the gRPC memory case needs tritonclient and skips visibly without it.
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

from package_common import DLREC, cli as run, free_port, needs_dlrec as pytestmark  # noqa: F401

ROWS = 4
MB = 1 << 20


def build_repository(d: Path):
    run("datagen", "--out", d / "raw.tsv", "--rows", 4000, "--seed", 3)
    run("etl", "--input", d / "raw.tsv", "--out", d / "data")
    cfg = {
        "model": {"arch": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1],
                  "interaction": "dot", "pooling": "sum"},
        "optimizer": {"type": "adagrad", "lr": 0.02},
        "train": {"batch_size": 256, "epochs": 1, "max_steps": 5, "eval_every": 0,
                  "log_every": 100, "checkpoint_every": 0, "seed": 1, "device": "cpu"},
    }
    (d / "cfg.json").write_text(json.dumps(cfg))
    run("train", "--config", d / "cfg.json", "--data", d / "data", "--run", d / "run",
        "--max-steps", 5)
    repo = d / "repo"
    run("export", "--run", d / "run", "--out", repo / "m" / "1")
    # "slow": every request waits 3 s in the batcher (a request in flight to unload under).
    shutil.copytree(repo / "m" / "1", repo / "slow" / "1")
    (repo / "slow" / "config.json").write_text(json.dumps(
        {"max_batch_size": 4096,
         "dynamic_batching": {"max_queue_delay_microseconds": 3000000, "max_queue_size": 64}}))
    return repo


def start_server(d: Path, repo: Path, *extra):
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    log = open(d / f"server{ports['http']}.log", "w")
    proc = subprocess.Popen(
        [DLREC, "serve", "--model-repository", str(repo), "--http-port", str(ports["http"]),
         "--grpc-port", str(ports["grpc"]), "--metrics-port", str(ports["metrics"]), *extra],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while True:
        assert proc.poll() is None, Path(log.name).read_text()
        try:
            if http_request(ports["http"], "GET", "/v2/health/ready")[0] == 200:
                break
        except OSError:
            pass
        assert time.time() < deadline, "server did not start"
        time.sleep(0.2)
    return {"proc": proc, "log": log, **ports}


def http_request(port, method, path, body=None, headers=None, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def raw_exchange(port, data: bytes, timeout=10.0):
    """Sends raw bytes on a new connection; returns (status or 0, whole answer bytes)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        buf = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                head, _, body = buf.partition(b"\r\n\r\n")
                n = [int(x.split(b":")[1]) for x in head.split(b"\r\n")
                     if x.lower().startswith(b"content-length:")]
                if n and len(body) >= n[0]:
                    break
        status = int(buf[9:12]) if buf.startswith(b"HTTP/1.") else 0
        return status, buf
    finally:
        s.close()


def proc_status(pid, key):
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    repo = build_repository(d)
    lines = (d / "raw.tsv").read_text().splitlines()
    yield {"dir": d, "repo": repo, "lines": lines}
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def server(work):
    s = start_server(work["dir"], work["repo"], "--http-header-timeout-ms", "2000",
                     "--http-body-timeout-ms", "5000")
    meta = json.loads(http_request(s["http"], "GET", "/v2/models/m")[1])
    s["inputs"] = meta["inputs"]
    yield s
    s["proc"].send_signal(signal.SIGTERM)
    assert s["proc"].wait(timeout=60) == 0
    s["log"].close()


def infer_body(work, inputs, rows=ROWS, offset=0):
    fields = [line.split("\t") for line in work["lines"][offset:offset + rows]]
    ins = []
    for i, t in enumerate(inputs):
        col = [f[i + 1] for f in fields]
        if t["datatype"] == "FP32":
            data = [float(v) if v else 0.0 for v in col]
        else:
            data = col
        ins.append({"name": t["name"], "datatype": t["datatype"], "shape": [rows, 1], "data": data})
    return json.dumps({"inputs": ins}).encode()


def assert_alive(server, work):
    """The process runs, health answers fast, and a valid inference is scored."""
    assert server["proc"].poll() is None, "the server died"
    t0 = time.time()
    assert http_request(server["http"], "GET", "/v2/health/live")[0] == 200
    assert time.time() - t0 < 2.0
    status, body = http_request(server["http"], "POST", "/v2/models/m/infer",
                                body=infer_body(work, server["inputs"]))
    assert status == 200, body[:300]
    out = json.loads(body)["outputs"][0]
    assert out["shape"] == [ROWS, 1] and len(out["data"]) == ROWS


def test_invalid_utf8_path_is_400(server, work):
    request = b"GET /%ff HTTP/1.1\r\nHost:x\r\n\r\n"  # the 29 bytes
    assert len(request) == 29
    status, answer = raw_exchange(server["http"], request)
    assert status == 400, answer[:200]
    status, _ = raw_exchange(server["http"], b"POST /v2/models/\xff/infer HTTP/1.1\r\n\r\n")
    assert status == 400
    assert_alive(server, work)


def test_invalid_utf8_in_infer_body_is_400(server, work):
    body = infer_body(work, server["inputs"]).replace(b'"name": "C1"', b'"name": "C\xff"', 1)
    status, answer = http_request(server["http"], "POST", "/v2/models/m/infer", body=body)
    assert status == 400, answer[:200]
    json.loads(answer)  # a valid JSON error body
    assert_alive(server, work)


def test_deeply_nested_infer_body_is_400(server, work):
    """~10,000 nested objects in an input's data (the issue's crash), then arrays, then objects
    elsewhere in the body: each a 400, and the server keeps serving."""
    port = server["http"]
    answers = []
    for depth in (10000, 100000):
        objs = '{"a":' * depth + "1" + "}" * depth
        arrays = "[" * depth + "1" + "]" * depth
        for body in ('{"inputs": [{"name": "I1", "datatype": "FP32", "shape": [1, 1], "data": [%s]}]}'
                     % objs,
                     '{"inputs": [{"name": "I1", "datatype": "FP32", "shape": [1, 1], "data": %s}]}'
                     % arrays,
                     '{"parameters": %s, "inputs": []}' % objs):
            try:
                status, answer = http_request(port, "POST", "/v2/models/m/infer", body=body)
            except OSError as e:
                status, answer = 0, repr(e).encode()
            assert server["proc"].poll() is None, f"the server died (depth {depth})"
            assert status == 400, answer[:200]
            answers.append(answer)
    for answer in answers:
        assert b"nested deeper than 64" in answer or b"holds an object" in answer, answer[:200]
    assert_alive(server, work)


def test_chunked_body_counts_against_the_limit(server, work):
    """200 MB offered chunked under the default 64 MB limit: the 413 comes once the limit is
    passed, while the client is still sending, and the server does not keep the bytes."""
    pid = server["proc"].pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = proc_status(pid, "VmRSS")
    s = socket.create_connection(("127.0.0.1", server["http"]), timeout=20)
    s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"100000\r\n" + b" " * MB + b"\r\n"
    sent = 0
    answer = b""
    try:
        for _ in range(200):
            readable, _, _ = select.select([s], [], [], 0 if sent < 60 * MB else 0.02)
            if readable:
                break
            s.sendall(chunk)
            sent += MB
        while b"\r\n\r\n" not in answer:
            part = s.recv(65536)
            if not part:
                break
            answer += part
    except OSError:
        pass
    s.close()
    growth = proc_status(pid, "VmHWM") - before
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 200 * MB, "no answer before the whole 200 MB chunked body was sent"
    assert growth < 200 * MB, f"RSS grew by {growth / MB:.0f} MB"
    assert_alive(server, work)


def test_declared_oversized_body_is_413_at_once(server, work):
    t0 = time.time()
    status, _ = raw_exchange(server["http"], b"POST /v2/models/m/infer HTTP/1.1\r\n"
                                             b"Content-Length: 209715200\r\n\r\n")
    assert status == 413 and time.time() - t0 < 2.0
    assert_alive(server, work)


def big_json_body(work, inputs, target_bytes):
    """A valid-looking infer body of about target_bytes (raw inputs, many rows)."""
    one = infer_body(work, inputs, rows=256)
    rows = 256 * max(1, target_bytes // len(one))
    fields = [line.split("\t") for line in work["lines"][:256]]
    parts = []
    for i, t in enumerate(inputs):
        col = [f[i + 1] for f in fields]
        if t["datatype"] == "FP32":
            col = [float(v) if v else 0.0 for v in col]
        data = json.dumps(col * (rows // 256))
        parts.append('{"name": "%s", "datatype": "%s", "shape": [%d, 1], "data": %s}'
                     % (t["name"], t["datatype"], rows, data))
    return ('{"inputs": [' + ", ".join(parts) + "]}").encode(), rows


def test_concurrent_big_json_bodies_stay_within_a_small_multiple(server, work):
    """Four concurrent ~60 MB JSON bodies: the peak RSS growth stays within 3x their total
    (it was 5.5 GB, ~22x)."""
    pid = server["proc"].pid
    body, rows = big_json_body(work, server["inputs"], 60 * MB)
    assert 50 * MB < len(body) < 64 * MB
    # The peak since now (writing 5 to clear_refs resets VmHWM).
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = proc_status(pid, "VmRSS")
    results = []

    def send():
        results.append(http_request(server["http"], "POST", "/v2/models/m/infer", body=body,
                                    timeout=120))

    threads = [threading.Thread(target=send) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    peak = proc_status(pid, "VmHWM")
    growth = peak - before
    print(f"4 x {len(body) / MB:.1f} MB JSON bodies ({rows} rows): RSS before "
          f"{before / MB:.0f} MB, peak {peak / MB:.0f} MB, growth {growth / MB:.0f} MB "
          f"= {growth / (4 * len(body)):.2f}x the bodies; statuses {[r[0] for r in results]}")
    assert len(results) == 4
    for status, answer in results:
        assert status in (200, 400, 429), answer[:300]
    assert growth < 3 * 4 * len(body)
    time.sleep(0.5)
    after = proc_status(pid, "VmRSS")
    assert after - before < 200 * MB, f"{(after - before) / MB:.0f} MB still resident"
    assert_alive(server, work)


def test_idle_and_unfinished_connections_do_not_delay_requests(server, work):
    idle = [socket.create_connection(("127.0.0.1", server["http"])) for _ in range(16)]
    for s in idle[:8]:  # keep-alive connections that were used once
        s.sendall(b"GET /v2/health/live HTTP/1.1\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    partial = [socket.create_connection(("127.0.0.1", server["http"])) for _ in range(20)]
    for s in partial:
        s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Le")
    for _ in range(5):
        t0 = time.time()
        assert_alive(server, work)
        assert time.time() - t0 < 2.0, f"{time.time() - t0:.2f} s"
    for s in idle + partial:
        s.close()


def test_three_hundred_trickling_connections(server, work):
    """300 connections sending a byte every 50 ms: health and inference stay fast, the
    trickling requests are answered 408 at the header deadline (2 s here)."""
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"p" * 200 + b"\r\n\r\n"
    conns = [socket.create_connection(("127.0.0.1", server["http"])) for _ in range(300)]
    stop = threading.Event()

    def trickle():
        for pos in range(len(head)):
            if stop.is_set():
                return
            for c in conns:
                try:
                    c.send(head[pos:pos + 1])
                except OSError:
                    pass
            time.sleep(0.05)

    t = threading.Thread(target=trickle)
    t.start()
    worst = 0.0
    for _ in range(10):
        t0 = time.time()
        assert_alive(server, work)
        worst = max(worst, time.time() - t0)
        time.sleep(0.1)
    stop.set()
    t.join()
    timed_out = 0
    for c in conns:
        c.settimeout(5)
        try:
            if c.recv(64).startswith(b"HTTP/1.1 408"):
                timed_out += 1
        except OSError:
            pass
        c.close()
    assert worst < 2.0, f"health + inference took {worst:.2f} s"
    assert timed_out == 300


def test_post_without_body_is_answered_at_once(server, work):
    t0 = time.time()
    status, answer = raw_exchange(server["http"], b"POST /v2/repository/index HTTP/1.1\r\n\r\n")
    assert status == 200, answer[:200]
    status, answer = raw_exchange(server["http"],
                                  b"POST /v2/repository/models/m/load HTTP/1.1\r\n\r\n")
    assert status == 200, answer[:200]
    assert time.time() - t0 < 5.0
    assert_alive(server, work)


def test_unload_answers_503_until_done(server, work):
    """While "slow" unloads (a request in flight holds it for 3 s), requests get 503."""
    port = server["http"]
    inflight = []
    t = threading.Thread(target=lambda: inflight.append(http_request(
        port, "POST", "/v2/models/slow/infer", body=infer_body(work, server["inputs"]))))
    t.start()
    time.sleep(0.8)
    unload = []
    u = threading.Thread(target=lambda: unload.append(http_request(
        port, "POST", "/v2/repository/models/slow/unload")))
    u.start()
    time.sleep(0.8)
    status, answer = http_request(port, "POST", "/v2/models/slow/infer",
                                  body=infer_body(work, server["inputs"]))
    assert status == 503 and b"being unloaded" in answer, (status, answer[:200])
    status, _ = http_request(port, "GET", "/v2/models/slow/ready")
    assert status == 503
    t.join()
    u.join()
    assert inflight[0][0] == 200, inflight[0][1][:200]  # the request in flight was answered
    assert unload[0][0] == 200
    status, _ = http_request(port, "POST", "/v2/models/slow/infer",
                             body=infer_body(work, server["inputs"]))
    assert status == 404  # unloaded now
    assert http_request(port, "POST", "/v2/repository/models/slow/load")[0] == 200
    assert_alive(server, work)


def test_grpc_garbage_and_big_requests_release_memory(server, work):
    np = pytest.importorskip("numpy")
    grpcclient = pytest.importorskip("tritonclient.grpc")
    # Garbage on the gRPC port first: not HTTP/2 at all.
    for junk in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                 + os.urandom(1024)):
        try:
            s = socket.create_connection(("127.0.0.1", server["grpc"]), timeout=2)
            s.sendall(junk)
            s.recv(1024)
            s.close()
        except OSError:
            pass
    pid = server["proc"].pid
    url = f"127.0.0.1:{server['grpc']}"
    before = proc_status(pid, "VmRSS")
    rows = 17 * MB // (13 * 4)  # a 17 MB FP32 tensor
    errors = []

    def client():
        c = grpcclient.InferenceServerClient(url)
        x = grpcclient.InferInput("dense", [rows, 13], "FP32")
        x.set_data_from_numpy(np.zeros((rows, 13), np.float32))
        try:
            c.infer("m", [x])
        except Exception as e:  # the model wants its categorical inputs too: a clear error
            errors.append(str(e))
        c.close()

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(1.0)
    after = proc_status(pid, "VmRSS")
    print(f"16 x 17 MB gRPC requests: RSS {before / MB:.0f} -> {after / MB:.0f} MB")
    assert len(errors) == 16 and all("INVALID_ARGUMENT" in e or "cat_" in e for e in errors), \
        errors[:2]
    assert after - before < 150 * MB, f"{(after - before) / MB:.0f} MB retained"
    assert grpcclient.InferenceServerClient(url).is_server_live()
    assert_alive(server, work)


def test_shutdown_answers_requests_in_flight(work):
    """SIGTERM while a request is in flight (and another is pipelined behind it on the same
    connection): the first is answered in full, no connection reset."""
    s = start_server(work["dir"], work["repo"])
    body = infer_body(work, json.loads(http_request(s["http"], "GET", "/v2/models/m")[1])["inputs"])
    req = (b"POST /v2/models/slow/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    c = socket.create_connection(("127.0.0.1", s["http"]), timeout=20)
    c.sendall(req + req)
    time.sleep(0.8)
    s["proc"].send_signal(signal.SIGTERM)
    time.sleep(0.5)
    answer = b""
    reset = False
    try:
        while True:
            part = c.recv(65536)
            if not part:
                break
            answer += part
    except ConnectionResetError:
        reset = True
    c.close()
    assert s["proc"].wait(timeout=60) == 0
    s["log"].close()
    assert not reset, "connection reset"
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert b"Connection: close" in answer.split(b"\r\n\r\n")[0]
