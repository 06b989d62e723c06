#!/usr/bin/env python3
"""Soak of `dlrec serve` through the tiered embedding store with Redis restarted mid-run (issue 22,
"Reliability"). Loopback only, Python standard library only.

Builds a DLRM whose tables live in RocksDB (`dlrec export --init ... --tiers rocksdb=DIR`), starts
its own redis-server on a free port and the server with the store
  host (LFU, small: the hot rows fit, the cold ones churn) -> redis -> rocksdb,
then runs --clients clients for --duration seconds over keep-alive HTTP:
  - hot clients (half): one request at a time of rows drawn from --hot-lines fixed log lines
    (their rows stay in the host tier: warmed before the clock starts);
  - cold clients (the other half): rows drawn from the whole log (most rows not cached).
At --duration/2 Redis is stopped (SIGTERM) for --down seconds, then started again on the same
port (empty: no persistence). RSS of the server is sampled every second.

Passes (exit 0) when: the server never died; hot requests never failed; cold requests failed
only while Redis was down (plus --grace seconds after it came back, for connections in flight),
each failure's body naming the Redis tier (since 46c8340 a Redis that is down is passed over and
its rows read from RocksDB, so none need fail); the server counted failed Redis lookups (its
`dlrec_embedding_store_failures{tier="redis"}`: the outage was seen); cold requests succeeded again after the restart
(recovery without restarting the server); RSS at the end within 10% of RSS after the warm-up.

  python3 bench/serve_store_soak.py --dlrec build/bin/dlrec --duration 600 [--json out.json]
"""
import argparse
import http.client
import json
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_common import free_port, infer_body, infer_loop, rss_bytes, run, stop_all, wait_port


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = []  # (time, kind, ok, error text or "")

    def add(self, kind, ok, err=""):
        with self.lock:
            self.events.append((time.time(), kind, ok, err))


def client(port, kind, lines, hot, inputs, rows, stop, stats, seed):
    rnd = random.Random(seed)
    pool = hot if kind == "hot" else lines
    infer_loop(port, stop,
               lambda: infer_body([pool[rnd.randrange(len(pool))] for _ in range(rows)], inputs),
               lambda ok, text: stats.add(kind, ok, "" if ok else text[:300]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dlrec", default="build/bin/dlrec")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--duration", type=float, default=600)
    p.add_argument("--down", type=float, default=10, help="seconds Redis stays down")
    p.add_argument("--grace", type=float, default=2)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--rows", type=int, default=4, help="log lines per request")
    p.add_argument("--hot-lines", type=int, default=16)
    p.add_argument("--host-bytes", type=int, default=160 << 10,
                   help="the host tier's bound: the hot rows fit, most others do not")
    p.add_argument("--json")
    a = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="store_soak_"))
    procs = []
    try:
        run(a.dlrec, "datagen", "--out", d / "raw.tsv", "--rows", 20000, "--seed", 5)
        run(a.dlrec, "etl", "--input", d / "raw.tsv", "--out", d / "data")
        (d / "cfg.json").write_text(json.dumps({"model": {
            "arch": "dlrm", "embedding_dim": 16, "bottom_mlp": [32, 16], "top_mlp": [32, 1]}}))
        repo = d / "repo"
        (repo / "m").mkdir(parents=True)
        run(a.dlrec, "export", "--init", d / "cfg.json", "--data", d / "data", "--out",
            repo / "m" / "1", "--tiers", f"rocksdb={repo / 'm' / 'tables'}")
        redis_port, http_port, metrics_port = free_port(), free_port(), free_port()
        redis_cmd = [a.redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save",
                     "", "--appendonly", "no", "--dir", str(d), "--loglevel", "warning"]
        redis = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL)
        procs.append(redis)
        assert wait_port(redis_port), "redis-server did not start"
        (repo / "m" / "config.json").write_text(json.dumps({"embedding_store": {
            "host": {"bytes": a.host_bytes, "shards": 2, "eviction": "lfu"},
            "redis": {"address": f"127.0.0.1:{redis_port}", "key_prefix": "soak",
                      "timeout_ms": 500},
            "rocksdb": {"path": "tables"}}}))
        log = open(d / "server.log", "w")
        server = subprocess.Popen(
            [a.dlrec, "serve", "--model-repository", repo, "--http-port", str(http_port),
             "--grpc-port", "-1", "--metrics-port", str(metrics_port)], stdout=log,
            stderr=subprocess.STDOUT)
        procs.append(server)
        assert wait_port(http_port, 120), "the server did not start; see " + str(d / "server.log")
        c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        c.request("GET", "/v2/models/m")
        inputs = json.loads(c.getresponse().read())["inputs"]
        lines = [l.split("\t") for l in (d / "raw.tsv").read_text().splitlines()]
        hot = lines[:a.hot_lines]
        for _ in range(200):  # warm the hot rows into the host tier (LFU counts them up)
            c.request("POST", "/v2/models/m/infer", infer_body(hot, inputs))
            assert c.getresponse().read() and True
        c.close()

        stats, stop = Stats(), threading.Event()
        threads = [threading.Thread(target=client, args=(
            http_port, "hot" if i % 2 == 0 else "cold", lines, hot, inputs, a.rows, stop, stats,
            i), daemon=True) for i in range(a.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        rss = []
        down_at = up_at = None
        warm_rss = None
        while time.time() - t0 < a.duration:
            time.sleep(1)
            rss.append((round(time.time() - t0, 1), rss_bytes(server.pid)))
            if warm_rss is None and time.time() - t0 >= min(30, a.duration / 4):
                warm_rss = rss[-1][1]
            if down_at is None and time.time() - t0 >= a.duration / 2:
                down_at = time.time()  # the outage starts with the signal (Redis then closes)
                redis.send_signal(signal.SIGTERM)
                redis.wait()
            if down_at and up_at is None and time.time() - down_at >= a.down:
                redis = subprocess.Popen(redis_cmd, stdout=subprocess.DEVNULL)
                procs.append(redis)
                wait_port(redis_port)
                up_at = time.time()
            if server.poll() is not None:
                break
        stop.set()
        for t in threads:
            t.join(timeout=40)
        end_rss = rss_bytes(server.pid)
        died = server.poll() is not None
        redis_failures = None  # the server's count of failed Redis lookups: the outage seen
        if not died:
            m = http.client.HTTPConnection("127.0.0.1", metrics_port, timeout=10)
            m.request("GET", "/metrics")
            for line in m.getresponse().read().decode().splitlines():
                if line.startswith("dlrec_embedding_store_failures{") and 'tier="redis"' in line:
                    redis_failures = int(float(line.split()[-1]))
            m.close()

        ev = stats.events
        def window(e):
            return down_at is not None and down_at <= e[0] <= (up_at or t0 + 1e12) + a.grace
        hot_fail = [e for e in ev if e[1] == "hot" and not e[2]]
        cold_fail = [e for e in ev if e[1] == "cold" and not e[2]]
        cold_fail_outside = [e for e in cold_fail if not window(e)]
        unclear = [e for e in cold_fail if "redis tier" not in e[3]]
        cold_ok_after = [e for e in ev if e[1] == "cold" and e[2] and up_at and e[0] > up_at]
        first_ok_after = min((e[0] for e in cold_ok_after), default=None)
        lat_ok = len([e for e in ev if e[2]])
        r = {
            "duration_s": a.duration, "clients": a.clients, "rows_per_request": a.rows,
            "redis_down_s": round((up_at or time.time()) - down_at, 2) if down_at else None,
            "requests": len(ev), "ok": lat_ok,
            "hot_requests": len([e for e in ev if e[1] == "hot"]), "hot_failed": len(hot_fail),
            "cold_requests": len([e for e in ev if e[1] == "cold"]),
            "cold_failed": len(cold_fail), "cold_failed_outside_outage": len(cold_fail_outside),
            "redis_tier_failures": redis_failures,
            "failures_without_a_clear_error": len(unclear),
            "cold_ok_after_restart": len(cold_ok_after),
            "recovered_s_after_restart": round(first_ok_after - up_at, 3) if first_ok_after else None,
            "server_died": died, "rss_warm_mib": round((warm_rss or 0) / 2**20, 1),
            "rss_end_mib": round(end_rss / 2**20, 1),
            "rss_max_mib": round(max(v for _, v in rss) / 2**20, 1) if rss else 0,
            "failures_from_s_after_sigterm": round(min(e[0] for e in cold_fail) - down_at, 3)
            if cold_fail and down_at else None,
            "failures_until_s_after_restart": round(max(e[0] for e in cold_fail) - up_at, 3)
            if cold_fail and up_at else None,
            "example_failure": cold_fail[0][3] if cold_fail else "",
            "example_failure_outside": (hot_fail + cold_fail_outside)[0][3]
            if hot_fail or cold_fail_outside else "",
        }
        ok = (not died and not hot_fail and not cold_fail_outside and not unclear
              and redis_failures and cold_ok_after and warm_rss and end_rss <= warm_rss * 1.10)
        r["pass"] = bool(ok)
        print(json.dumps(r, indent=2))
        if a.json:
            Path(a.json).write_text(json.dumps({**r, "rss_samples": rss}, indent=1))
        return 0 if ok else 1
    finally:
        stop_all(procs)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
