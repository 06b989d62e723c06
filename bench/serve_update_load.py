#!/usr/bin/env python3
"""Online update under load (issue 22, "Correctness"): `dlrec push` while 64 clients ask two
`dlrec serve` instances of one model, loopback only, Python standard library only.

Builds a DLRM whose tables live in RocksDB (`dlrec export --init ... --tiers rocksdb=DIR`),
starts its own redis-server on a free port and --instances servers of the same repository, each
with the store  updates (the Redis Stream) -> host (LFU) -> rocksdb. Then --clients clients
(spread over the instances, keep-alive HTTP) send requests for --duration seconds:
  - probe clients (--probes per instance): the same request again and again (--rows fixed log
    lines), so that each answer can be told apart: the old model's, the new one's, or neither;
  - load clients (the others): rows drawn from the whole log.
At --push-at seconds `dlrec push` publishes new tables (a short training run's checkpoint
against the export's weights). After the clients stop, a fresh instance started on the same
repository (which replays the stream) gives the new model's answer to the probe.

Passes (exit 0) when: no request failed on any instance; every probe answer is the old answer or
the fresh instance's, within --tol (dynamic batching merges the probe with other requests, and a
GEMM over more rows may round differently; a mix of old and new rows would be far from both); no
probe client saw the old answer after the new one; and every instance served the new answer
within 1 s of the push's end (`dlrec push` returning, after the commit of its version).

  python3 bench/serve_update_load.py --dlrec build/bin/dlrec [--clients 64] [--duration 20]
"""
import argparse
import http.client
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from serve_common import free_port, infer_body, infer_loop, run, stop_all, wait_port


def start_server(dlrec, repo, log_path):
    port = free_port()
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [dlrec, "serve", "--model-repository", repo, "--http-port", str(port), "--grpc-port",
         "-1", "--metrics-port", "-1"], stdout=log, stderr=subprocess.STDOUT)
    assert wait_port(port, 120), f"the server did not start; see {log_path}"
    return proc, port


def ask(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v2/models/m/infer", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode()
    c.close()
    assert r.status == 200, text
    return answer_of(text)


def answer_of(text):
    return tuple(float(v) for v in json.loads(text)["outputs"][0]["data"])


def dist(x, y):
    return max(abs(u - v) for u, v in zip(x, y))


class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = []  # (time, instance, kind, ok, answer or error text, client)

    def add(self, *e):
        with self.lock:
            self.events.append((time.time(), *e))


def client(port, inst, kind, lines, probe_body, inputs, rows, stop, log, seed):
    rnd = random.Random(seed)

    def body():
        if kind == "probe":
            return probe_body
        return infer_body([lines[rnd.randrange(len(lines))] for _ in range(rows)], inputs)

    def report(ok, text):
        if not ok:
            log.add(inst, kind, False, text[:300], seed)
        else:
            log.add(inst, kind, True, answer_of(text) if kind == "probe" else "", seed)

    infer_loop(port, stop, body, report)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dlrec", default="build/bin/dlrec")
    p.add_argument("--redis-server", default=shutil.which("redis-server") or "redis-server")
    p.add_argument("--instances", type=int, default=2)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--probes", type=int, default=2, help="probe clients per instance")
    p.add_argument("--duration", type=float, default=20)
    p.add_argument("--push-at", type=float, default=8)
    p.add_argument("--rows", type=int, default=8, help="log lines per request")
    p.add_argument("--tol", type=float, default=1e-5,
                   help="largest difference of a probability from the old or new answer")
    p.add_argument("--json")
    a = p.parse_args()
    if a.instances < 1 or a.clients < a.instances * (a.probes + 1) or a.probes < 1:
        sys.exit("need >= 1 instance, >= 1 probe per instance and a load client per instance")
    if not 0 < a.push_at < a.duration:
        sys.exit("--push-at must be inside the run")
    d = Path(tempfile.mkdtemp(prefix="update_load_"))
    procs = []
    try:
        run(a.dlrec, "datagen", "--out", d / "raw.tsv", "--rows", 20000, "--seed", 5)
        run(a.dlrec, "etl", "--input", d / "raw.tsv", "--out", d / "data")
        (d / "cfg.json").write_text(json.dumps({
            "model": {"arch": "dlrm", "embedding_dim": 16, "bottom_mlp": [32, 16],
                      "top_mlp": [32, 1]},
            "train": {"batch_size": 512, "max_steps": 20}}))
        repo = d / "repo"
        (repo / "m").mkdir(parents=True)
        run(a.dlrec, "export", "--init", d / "cfg.json", "--data", d / "data", "--out",
            repo / "m" / "1", "--tiers", f"rocksdb={repo / 'm' / 'tables'}")
        # The same initial model with its tables in weights.dlrec: the push's base.
        run(a.dlrec, "export", "--init", d / "cfg.json", "--data", d / "data", "--out", d / "base")
        # The new tables: a short training run's (every row it touched differs from the export).
        run(a.dlrec, "train", "--config", d / "cfg.json", "--data", d / "data", "--run", d / "run",
            "--device", "cpu")
        redis_port = free_port()
        redis = subprocess.Popen(
            [a.redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(d), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL)
        procs.append(redis)
        assert wait_port(redis_port), "redis-server did not start"
        stream = "dlrec:m:updates"
        (repo / "m" / "config.json").write_text(json.dumps({"embedding_store": {
            "host": {"bytes": 1 << 20, "shards": 4, "eviction": "lfu"},
            "updates": {"address": f"127.0.0.1:{redis_port}", "stream": stream,
                        "block_ms": 50},
            "rocksdb": {"path": "tables"}}}))
        ports = []
        for i in range(a.instances):
            proc, port = start_server(a.dlrec, repo, d / f"server{i}.log")
            procs.append(proc)
            ports.append(port)
        c = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=10)
        c.request("GET", "/v2/models/m")
        inputs = json.loads(c.getresponse().read())["inputs"]
        c.close()
        lines = [l.split("\t") for l in (d / "raw.tsv").read_text().splitlines()]
        probe_body = infer_body(lines[:a.rows], inputs)
        old = [ask(port, probe_body) for port in ports]
        assert all(dist(o, old[0]) <= a.tol for o in old), "the instances disagree before the push"
        old = old[0]

        log, stop = Log(), threading.Event()
        threads = []
        for i in range(a.clients):
            inst = i % a.instances
            kind = "probe" if i // a.instances < a.probes else "load"
            threads.append(threading.Thread(target=client, args=(
                ports[inst], inst, kind, lines, probe_body, inputs, a.rows, stop, log, i),
                daemon=True))
        t0 = time.time()
        for t in threads:
            t.start()
        time.sleep(a.push_at)
        push_start = time.time()
        pushed = run(a.dlrec, "push", "--model", repo / "m" / "1", "--base",
                     d / "base" / "weights.dlrec", "--weights", d / "run" / "checkpoint.dlrec",
                     "--redis", f"127.0.0.1:{redis_port}", "--stream", stream).strip()
        push_end = time.time()
        time.sleep(max(0.0, a.duration - (time.time() - t0)))
        stop.set()
        for t in threads:
            t.join(timeout=60)
        alive = [pr.poll() is None for pr in procs[1:]]

        # The new model's answer: an instance started now replays the stream before serving.
        proc, port = start_server(a.dlrec, repo, d / "server_fresh.log")
        procs.append(proc)
        new = ask(port, probe_body)

        ev = log.events
        failed = [e for e in ev if not e[3]]
        probes = [e for e in ev if e[2] == "probe" and e[3]]
        def which(ans):
            do, dn = dist(ans, old), dist(ans, new)
            return "old" if do <= a.tol and do < dn else "new" if dn <= a.tol else "neither"
        kinds = [which(e[4]) for e in probes]
        neither = [e for e, k in zip(probes, kinds) if k == "neither"]
        first_new = {}  # per instance: when a probe first got the new answer
        went_back = 0   # probe answers that were old after that client had seen the new one
        seen_new = set()
        for e, k in sorted(zip(probes, kinds)):  # a client's requests are sequential
            if k == "new":
                first_new.setdefault(e[1], e[0])
                seen_new.add(e[5])
            elif e[5] in seen_new:
                went_back += 1
        lag = {i: round(first_new[i] - push_end, 3) if i in first_new else None
               for i in range(a.instances)}
        r = {
            "instances": a.instances, "clients": a.clients, "rows_per_request": a.rows,
            "duration_s": a.duration, "push": pushed, "push_s": round(push_end - push_start, 3),
            "requests": len(ev), "failed": len(failed),
            "probe_answers": len(probes), "probe_old": kinds.count("old"),
            "probe_new": kinds.count("new"), "probe_neither": len(neither),
            "old_after_new": went_back, "new_minus_old_max": round(dist(new, old), 6),
            "largest_difference_within_class": max(
                (min(dist(e[4], old), dist(e[4], new)) for e in probes), default=0.0),
            "first_new_s_after_push_end": lag,
            "first_new_s_after_push_start": {i: round(first_new[i] - push_start, 3)
                                             for i in first_new}, "servers_alive": alive,
            "example_failure": failed[0][4] if failed else "",
        }
        ok = (not failed and not neither and not went_back and dist(new, old) > 10 * a.tol
              and all(alive)
              and all(v is not None and v < 1.0 for v in lag.values()))
        r["pass"] = bool(ok)
        print(json.dumps(r, indent=2))
        if a.json:
            Path(a.json).write_text(json.dumps(r, indent=1))
        return 0 if ok else 1
    finally:
        stop_all(procs)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
