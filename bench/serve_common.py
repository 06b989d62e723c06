"""Helpers shared by the serving benches that drive `dlrec serve` over loopback HTTP
(bench/serve_store_soak.py, bench/serve_update_load.py). Python standard library only."""
import http.client
import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def run(dlrec, *args):
    r = subprocess.run([dlrec, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"dlrec {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_bytes(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def wait_port(port, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def infer_body(fields, inputs):
    ins = []
    for i, t in enumerate(inputs):
        col = [f[i + 1] for f in fields]
        data = [float(v) if v else 0.0 for v in col] if t["datatype"] == "FP32" else col
        ins.append({"name": t["name"], "datatype": t["datatype"], "shape": [len(fields), 1],
                    "data": data})
    return json.dumps({"inputs": ins}).encode()


def stop_all(procs):
    """SIGTERM each process still running, then wait (a minute at most, then kill)."""
    for pr in procs:
        if pr.poll() is None:
            pr.send_signal(signal.SIGTERM)
            try:
                pr.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pr.kill()


def infer_loop(port, stop, next_body, report):
    """Posts next_body() to /v2/models/m/infer over one keep-alive connection until `stop` (a
    threading.Event) is set, calling report(ok, text) per request: ok when the status is 200,
    text the response body, or "connection: ..." after a connection error (then it reconnects
    after 50 ms)."""
    conn = None
    while not stop.is_set():
        body = next_body()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            conn.request("POST", "/v2/models/m/infer", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            report(resp.status == 200, resp.read().decode(errors="replace"))
        except (OSError, http.client.HTTPException) as e:
            report(False, "connection: " + repr(e))
            conn = None
            time.sleep(0.05)
