"""`dlrec serve` over gRPC with calls in flight, against the unmodified tritonclient package: a
call blocked in the batcher, overload, many calls in flight, unload while calls wait, graceful
shutdown (every call in flight answered, no connection closed before its answer is read, new
calls refused while draining) and a client gone before its answer. The model repository is
test_serve_tritonclient.py's (tritonclient_common.work).
"""
import json
import select
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tritonclient_common import (  # noqa: F401 (work, pytestmark: fixture, marks)
    SLOW_S, encoded_columns, grpcclient, make_inputs, np, pytestmark, start_slow_server, work)
from tritonclient.utils import InferenceServerException  # noqa: E402


# --- blocked calls, overload and graceful shutdown over gRPC -----------------------------------
# A model whose requests wait in the queue for SLOW_S (long delay, preferred batch never
# reached, max_queue_size 1), served with one gRPC completion-queue thread: a call blocked in
# the batcher must not hold up the calls behind it.

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
