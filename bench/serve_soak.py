#!/usr/bin/env python3
"""Adversarial soak of `dlrec serve` (issue 25), loopback only, Python standard library only.

Starts the server on a small CPU model (built here with the CLI in a temporary directory) and for
--duration seconds runs, side by side:
  - valid: clients sending valid JSON inferences over keep-alive HTTP connections, throughout;
  - malformed: malformed HTTP requests (bad request lines, invalid UTF-8, bad escapes, header
    violations, bad chunking, random bytes), each on a new connection;
  - slow: a few hundred connections trickling request bytes, reopened when the server closes
    them (header/body timeouts), plus idle connections that never send;
  - big: oversized bodies (declared 200 MB, chunked past the limit), ~60 MB JSON bodies and
    deeply nested bodies;
  - grpc-garbage: random bytes, HTTP/1 and broken HTTP/2 on the gRPC port.
Every loop is bounded (a fixed number of connections, pauses between rounds). A monitor samples
the server's RSS every second and restarts it if it died (each death is counted).

Reports server deaths, valid inferences (ok / overload answers 429 or 503 / failed), their
latency, the attacks sent, and the RSS: at the start (valid traffic only), after the warm-up
(--warmup seconds of every attack, measured with the big bodies paused for 3 s: by then every
worker thread has its allocator arena) and at the end (attacks stopped, 5 s idle). Exit status
0 when there were no deaths, no failed valid inferences and the RSS at the end is within 10% of
the one after the warm-up; 1 otherwise.

  python3 bench/serve_soak.py --dlrec build/bin/dlrec --duration 600 [--json out.json]
"""
import argparse
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_common import free_port, rss_bytes, run

MB = 1 << 20


def build_repository(dlrec, d: Path):
    run(dlrec, "datagen", "--out", d / "raw.tsv", "--rows", 4000, "--seed", 5)
    run(dlrec, "etl", "--input", d / "raw.tsv", "--out", d / "data")
    cfg = {
        "model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8], "top_mlp": [16, 1],
                  "interaction": "dot", "pooling": "sum"},
        "optimizer": {"type": "adagrad", "lr": 0.02},
        "train": {"batch_size": 256, "epochs": 1, "max_steps": 20, "eval_every": 0,
                  "log_every": 100, "checkpoint_every": 0, "seed": 1, "device": "cpu"},
    }
    (d / "cfg.json").write_text(json.dumps(cfg))
    run(dlrec, "train", "--config", d / "cfg.json", "--data", d / "data", "--run", d / "run",
        "--max-steps", 20)
    run(dlrec, "export", "--run", d / "run", "--out", d / "repo" / "m" / "1")
    return d / "repo", (d / "raw.tsv").read_text().splitlines()[:512]


class Server:
    def __init__(self, dlrec, repo, logdir):
        self.dlrec, self.repo, self.logdir = dlrec, repo, logdir
        self.http = free_port()
        self.grpc = free_port()
        self.proc = None
        self.deaths = []
        self.lock = threading.Lock()

    def start(self):
        log = open(self.logdir / "server.log", "a")
        self.proc = subprocess.Popen(
            [self.dlrec, "serve", "--model-repository", str(self.repo), "--http-port",
             str(self.http), "--grpc-port", str(self.grpc), "--metrics-port", "-1"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit("the server exited at start-up; see " + str(self.logdir / "server.log"))
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.http, timeout=2)
                c.request("GET", "/v2/health/ready")
                if c.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        sys.exit("the server did not become ready")

    def check(self):
        """Restarts the server if it died; returns False then."""
        with self.lock:
            rc = self.proc.poll()
            if rc is None:
                return True
            self.deaths.append({"t": time.time(), "exit": rc})
            self.start()
            return False

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None


def infer_body(lines, inputs, rows, offset):
    fields = [line.split("\t") for line in lines[offset:offset + rows]]
    ins = []
    for i, t in enumerate(inputs):
        col = [f[i + 1] for f in fields]
        data = [float(v) if v else 0.0 for v in col] if t["datatype"] == "FP32" else col
        ins.append({"name": t["name"], "datatype": t["datatype"], "shape": [rows, 1], "data": data})
    return json.dumps({"inputs": ins}).encode()


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.counts = {}
        self.latencies = []
        self.failures = []

    def add(self, key, n=1):
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    def fail(self, what):
        with self.lock:
            self.counts["valid_failed"] = self.counts.get("valid_failed", 0) + 1
            if len(self.failures) < 20:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {what}")


def valid_client(srv, stats, lines, inputs, stop, seed):
    rnd = random.Random(seed)
    conn = None
    while not stop.is_set():
        rows = rnd.choice([1, 4, 32, 128])
        body = infer_body(lines, inputs, rows, rnd.randrange(0, len(lines) - rows))
        t0 = time.time()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", srv.http, timeout=30)
            conn.request("POST", "/v2/models/m/infer", body=body,
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            answer = r.read()
            dt = time.time() - t0
            if r.status == 200:
                out = json.loads(answer)["outputs"][0]
                if out["shape"] != [rows, 1] or len(out["data"]) != rows:
                    stats.fail(f"wrong answer shape {out['shape']}")
                else:
                    stats.add("valid_ok")
                    with stats.lock:
                        stats.latencies.append(dt)
            elif r.status in (429, 503):
                stats.add("valid_overload")
            else:
                stats.fail(f"HTTP {r.status}: {answer[:200]!r}")
            if r.getheader("Connection", "").lower() == "close":
                conn.close()
                conn = None
        except Exception as e:  # a failed valid inference is what the soak looks for
            stats.fail(f"{type(e).__name__}: {e}")
            if conn is not None:
                conn.close()
            conn = None
            time.sleep(0.05)


def exchange(port, data, timeout=5.0, read=True):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    except OSError:
        return b""
    try:
        try:
            s.sendall(data)
        except OSError:
            pass
        buf = b""
        if read:
            try:
                while len(buf) < 65536:
                    part = s.recv(65536)
                    if not part:
                        break
                    buf += part
                    if b"\r\n\r\n" in buf:
                        break
            except OSError:
                pass
        return buf
    finally:
        s.close()


MALFORMED = [
    b"GET /%ff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /\xff\xfe\xfd HTTP/1.1\r\n\r\n",
    b"GET /v2/models/%c3%28 HTTP/1.1\r\n\r\n",
    b"GET /a%zz HTTP/1.1\r\n\r\n",
    b"GET /a%00 HTTP/1.1\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET\r\n\r\n",
    b"\x00\x01\x02\x03\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: \xc0\xaf\r\n\r\n",
    b"GET / HTTP/1.1\r\nNoColon\r\n\r\n",
    b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n",
    b"GET / HTTP/1.1\r\n" + b"X: " + b"a" * 70000 + b"\r\n\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffff\r\n",
    b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX",
    b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 12\r\n\r\n{\"inputs\":[",
    b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"id\":\"\xff\"}",
    b"POST /v2/models/m/infer HTTP/1.1\r\nInference-Header-Content-Length: 99\r\n"
    b"Content-Length: 2\r\n\r\n{}",
    b"POST /v2/repository/models/m/load HTTP/1.1\r\nContent-Length: 1\r\n\r\n[",
    b"GET /v2/models/" + b"m" * 5000 + b" HTTP/1.1\r\n\r\n",
]


def malformed_loop(srv, stats, stop, seed):
    rnd = random.Random(seed)
    while not stop.is_set():
        if rnd.random() < 0.2:
            data = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 2048)))
        else:
            data = rnd.choice(MALFORMED)
        exchange(srv.http, data, timeout=3)
        stats.add("attack_malformed")
        time.sleep(0.005)


def slow_loop(srv, stats, stop, seed, count):
    """`count` connections trickling a request a byte at a time (one byte per connection every
    100 ms); a connection the server closed is replaced."""
    rnd = random.Random(seed)
    heads = [b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 400 + b"\r\n\r\n",
             b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 100000\r\n\r\n" + b"[" * 1000]
    conns = []

    def open_one():
        try:
            s = socket.create_connection(("127.0.0.1", srv.http), timeout=5)
            s.setblocking(False)
            conns.append([s, rnd.choice(heads), 0])
            stats.add("attack_slow_connections")
        except OSError:
            time.sleep(0.1)

    while not stop.is_set():
        while len(conns) < count and not stop.is_set():
            open_one()
        for c in list(conns):
            s, head, pos = c
            try:
                if pos < len(head):
                    s.send(head[pos:pos + 1])
                    c[2] += 1
                try:
                    if s.recv(4096) == b"":
                        raise ConnectionError
                except BlockingIOError:
                    pass
            except OSError:
                s.close()
                conns.remove(c)
        time.sleep(0.1)
    for s, _, _ in conns:
        s.close()


def idle_loop(srv, stats, stop, count):
    conns = []
    while not stop.is_set():
        while len(conns) < count:
            try:
                conns.append(socket.create_connection(("127.0.0.1", srv.http), timeout=5))
                stats.add("attack_idle_connections")
            except OSError:
                break
        for s in list(conns):  # the server closes idle ones after its idle timeout
            s.setblocking(False)
            try:
                if s.recv(4096) == b"":
                    s.close()
                    conns.remove(s)
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                conns.remove(s)
        stop.wait(1.0)
    for s in conns:
        s.close()


def big_loop(srv, stats, stop, seed, lines, inputs, pause, paused):
    rnd = random.Random(seed)
    # ~60 MB JSON body (valid JSON, many rows; the server parses it, then refuses or scores it).
    base = infer_body(lines, inputs, 256, 0)
    times = max(1, int(60 * MB / len(base)))
    one = json.loads(base)
    for t in one["inputs"]:
        t["data"] = t["data"] * times
        t["shape"] = [256 * times, 1]
    big = json.dumps(one).encode()
    deep = b'{"inputs": [{"name": "I1", "datatype": "FP32", "shape": [1,1], "data": ' + \
        b"[" * 100000 + b"1" + b"]" * 100000 + b"}]}"
    while not stop.is_set():
        kind = rnd.choice(["declared", "chunked", "json60", "deep", "deep_objects"])
        if kind == "declared":
            exchange(srv.http, b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 209715200"
                               b"\r\n\r\n" + b"x" * 65536)
        elif kind == "chunked":
            try:
                s = socket.create_connection(("127.0.0.1", srv.http), timeout=10)
                s.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
                chunk = b"100000\r\n" + b"7" * MB + b"\r\n"
                for _ in range(100):
                    s.sendall(chunk)
            except OSError:
                pass
            finally:
                s.close()
        elif kind == "json60":
            exchange(srv.http, b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                     % len(big) + big, timeout=60)
        elif kind == "deep":
            exchange(srv.http, b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                     % len(deep) + deep, timeout=30)
        else:
            body = b'{"parameters": ' + b'{"a":' * 50000 + b"1" + b"}" * 50000 + b"}"
            exchange(srv.http, b"POST /v2/repository/index HTTP/1.1\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body, timeout=30)
        stats.add("attack_big_" + kind)
        stop.wait(rnd.uniform(1.0, 3.0))
        if pause.is_set():  # the monitor measures the settled RSS meanwhile
            paused.set()
            while pause.is_set() and not stop.is_set():
                time.sleep(0.1)
            paused.clear()


def grpc_garbage_loop(srv, stats, stop, seed):
    rnd = random.Random(seed)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    while not stop.is_set():
        kind = rnd.randrange(4)
        if kind == 0:
            data = bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 8192)))
        elif kind == 1:
            data = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        elif kind == 2:
            data = preface + bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 4096)))
        else:  # a SETTINGS frame, then a HEADERS frame of garbage
            data = preface + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00" + \
                b"\x00\x10\x00\x01\x05\x00\x00\x00\x01" + os.urandom(16)
        exchange(srv.grpc, data, timeout=2)
        stats.add("attack_grpc_garbage")
        time.sleep(0.02)


def percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dlrec", default="build/bin/dlrec")
    ap.add_argument("--duration", type=float, default=600.0)
    ap.add_argument("--warmup", type=float, default=60.0,
                    help="seconds of attacks before the RSS the end is compared with")
    ap.add_argument("--slow-connections", type=int, default=300)
    ap.add_argument("--idle-connections", type=int, default=50)
    ap.add_argument("--valid-clients", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the summary here too")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dlrec_soak_"))
    try:
        repo, lines = build_repository(a.dlrec, work)
        srv = Server(a.dlrec, repo, work)
        srv.start()
        c = http.client.HTTPConnection("127.0.0.1", srv.http, timeout=10)
        c.request("GET", "/v2/models/m")
        inputs = json.loads(c.getresponse().read())["inputs"]
        c.close()

        stats = Stats()
        warm_stop = threading.Event()
        warm = threading.Thread(target=valid_client,
                                args=(srv, stats, lines, inputs, warm_stop, a.seed))
        warm.start()
        time.sleep(10)
        warm_stop.set()
        warm.join()
        time.sleep(2)
        rss_start = rss_bytes(srv.proc.pid)
        stats = Stats()

        stop = threading.Event()
        pause, paused = threading.Event(), threading.Event()
        threads = [threading.Thread(target=valid_client,
                                    args=(srv, stats, lines, inputs, stop, a.seed + 10 + i))
                   for i in range(a.valid_clients)]
        threads += [
            threading.Thread(target=malformed_loop, args=(srv, stats, stop, a.seed + 1)),
            threading.Thread(target=malformed_loop, args=(srv, stats, stop, a.seed + 5)),
            threading.Thread(target=slow_loop,
                             args=(srv, stats, stop, a.seed + 2, a.slow_connections)),
            threading.Thread(target=idle_loop, args=(srv, stats, stop, a.idle_connections)),
            threading.Thread(target=big_loop,
                             args=(srv, stats, stop, a.seed + 3, lines, inputs, pause, paused)),
            threading.Thread(target=grpc_garbage_loop, args=(srv, stats, stop, a.seed + 4)),
        ]
        t0 = time.time()
        for t in threads:
            t.start()
        rss_samples = []
        rss_by_minute = []
        rss_warm = None
        while time.time() - t0 < a.duration:
            time.sleep(1.0)
            if srv.check():
                rss_samples.append(rss_bytes(srv.proc.pid))
            if time.time() - t0 >= 60 * (len(rss_by_minute) + 1):
                rss_by_minute.append(round(rss_bytes(srv.proc.pid) / MB, 1))
            if rss_warm is None and time.time() - t0 >= a.warmup:
                # Every attack has run a few rounds (every worker thread has served some): with
                # the big bodies paused and 3 s to settle, the RSS the end is compared with.
                pause.set()
                paused.wait(timeout=120)
                time.sleep(3)
                rss_warm = rss_bytes(srv.proc.pid)
                pause.clear()
        stop.set()
        for t in threads:
            t.join(timeout=120)
        srv.check()
        time.sleep(5)
        rss_after = rss_bytes(srv.proc.pid)
        exit_code = srv.stop()

        lat = stats.latencies
        summary = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t0)),
            "duration_s": round(time.time() - t0, 1),
            "host_cpus": os.cpu_count(),
            "server_deaths": len(srv.deaths),
            "server_exit_status_at_sigterm": exit_code,
            "valid_ok": stats.counts.get("valid_ok", 0),
            "valid_overload": stats.counts.get("valid_overload", 0),
            "valid_failed": stats.counts.get("valid_failed", 0),
            "valid_failures_first": stats.failures,
            "valid_latency_ms": {k: (round(percentile(lat, p) * 1000, 2) if lat else None)
                                 for k, p in (("p50", 50), ("p99", 99), ("max", 100))},
            "attacks": {k: v for k, v in sorted(stats.counts.items()) if k.startswith("attack")},
            "rss_start_mb": round(rss_start / MB, 1),
            "rss_after_warmup_mb": round(rss_warm / MB, 1) if rss_warm else None,
            "rss_end_mb": round(rss_after / MB, 1),
            "rss_each_minute_mb": rss_by_minute,
            "rss_max_during_mb": round(max(rss_samples) / MB, 1) if rss_samples else None,
            "rss_end_over_after_warmup": round(rss_after / rss_warm, 3) if rss_warm else None,
        }
        print(json.dumps(summary, indent=2))
        if a.json:
            Path(a.json).write_text(json.dumps(summary, indent=2) + "\n")
        ok = (summary["server_deaths"] == 0 and summary["valid_failed"] == 0 and
              summary["rss_end_over_after_warmup"] is not None and
              summary["rss_end_over_after_warmup"] <= 1.10)
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
