"""A small KServe v2 HTTP client for `dlrec serve` (docs/SERVING.md), standard library only.

    c = Client("http://127.0.0.1:8000")
    c.wait_ready(timeout=30)
    p = c.infer("m", {"I1": np.array([1.0, np.nan], np.float32), "C1": ["68fd1e64", ""]})

Requests are JSON; with binary=True the tensors travel in the binary tensor extension (no
text encoding of the numbers), and so does any float tensor holding NaN (missing values, which
JSON cannot carry). Errors of the server raise ServerError (a RuntimeError) with its
HTTP status and message; connection errors are the standard library's (OSError).
"""
import json
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

_DATATYPES = {np.dtype(np.float32): "FP32", np.dtype(np.float64): "FP64",
              np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}


class ServerError(RuntimeError):
    """An error answer of the server: .status (HTTP status) and the server's message."""

    def __init__(self, status, message):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


def _tensor(name, values):
    """(datatype, shape, NumPy array or list of bytes) of one input; 1-D becomes [rows, 1]."""
    if isinstance(values, (list, tuple)) and values and all(
            isinstance(v, (str, bytes)) for v in values):
        values = np.array([v.encode() if isinstance(v, str) else v for v in values],
                          dtype=object)
    arr = np.asarray(values)
    if arr.ndim == 1:
        arr = arr.reshape(-1, 1)
    if arr.dtype.kind in "USO":
        items = []
        for i, v in enumerate(arr.reshape(-1)):
            if isinstance(v, str):
                items.append(v.encode())
            elif isinstance(v, (bytes, bytearray, np.bytes_)):
                items.append(bytes(v))
            else:  # bytes(5) would be five zero bytes: refused, never sent
                raise TypeError(f"input '{name}': element {i} is {type(v).__name__}, not str "
                                "or bytes (a BYTES input takes strings)")
        return "BYTES", list(arr.shape), items
    if arr.dtype not in _DATATYPES:
        raise TypeError(f"input '{name}': dtype {arr.dtype} is not one of float32, float64, "
                        "int32, int64 or strings")
    return _DATATYPES[arr.dtype], list(arr.shape), np.ascontiguousarray(arr)


class Client:
    def __init__(self, url, timeout=60.0):
        if "://" not in url:
            url = "http://" + url
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _request(self, method, path, body=None, headers=None):
        req = urllib.request.Request(self.url + path, data=body, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as e:
            data = e.read()
            try:
                message = json.loads(data).get("error", data.decode(errors="replace"))
            except ValueError:
                message = data.decode(errors="replace")
            raise ServerError(e.code, message) from None

    def _model_path(self, model, version):
        p = "/v2/models/" + urllib.parse.quote(model, safe="")
        return p + ("/versions/" + urllib.parse.quote(str(version), safe="") if version else "")

    def _ok(self, path):
        try:
            return self._request("GET", path)[0] == 200
        except ServerError:
            return False

    def live(self):
        return self._ok("/v2/health/live")

    def ready(self):
        return self._ok("/v2/health/ready")

    def model_ready(self, model, version=None):
        return self._ok(self._model_path(model, version) + "/ready")

    def wait_ready(self, timeout=30.0):
        """Waits until the server answers ready (connection refused counts as not yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.ready():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url} was not ready within {timeout} s")
            time.sleep(0.1)

    def metadata(self):
        return json.loads(self._request("GET", "/v2")[2])

    def model_metadata(self, model, version=None):
        return json.loads(self._request("GET", self._model_path(model, version))[2])

    def infer(self, model, inputs, version=None, binary=False, request_id=None):
        """Scores rows: inputs maps each input name (raw columns: see model_metadata) to a
        1-D or [rows, 1] array, or a list of strings for BYTES columns. Returns the output
        "probability" as a float32 NumPy array [rows]."""
        if not isinstance(inputs, dict) or not inputs:
            raise TypeError("inputs must be a non-empty dict of input name -> values")
        head = {"inputs": [], "outputs": [{"name": "probability",
                                           "parameters": {"binary_data": bool(binary)}}]}
        if request_id is not None:
            head["id"] = str(request_id)
        blobs = []
        for name, values in inputs.items():
            dt, shape, data = _tensor(name, values)
            t = {"name": name, "datatype": dt, "shape": shape}
            # JSON has no NaN: a float tensor with missing values (NaN) travels as binary.
            if binary or (dt in ("FP32", "FP64") and not np.isfinite(data).all()):
                blob = (b"".join(struct.pack("<I", len(b)) + b for b in data) if dt == "BYTES"
                        else data.astype(data.dtype.newbyteorder("<"), copy=False).tobytes())
                t["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                t["data"] = ([b.decode("utf-8", errors="strict") for b in data] if dt == "BYTES"
                             else data.reshape(-1).tolist())
            head["inputs"].append(t)
        body = json.dumps(head).encode()
        headers = {"Content-Type": "application/json"}
        if blobs:
            headers["Inference-Header-Content-Length"] = str(len(body))
            headers["Content-Type"] = "application/octet-stream"
            body += b"".join(blobs)
        _, resp_headers, data = self._request("POST", self._model_path(model, version) +
                                              "/infer", body, headers)
        return _output(resp_headers, data)


def _output(headers, data):
    lower = {k.lower(): v for k, v in headers.items()}
    hlen = lower.get("inference-header-content-length")
    head = json.loads(data[:int(hlen)] if hlen else data)
    outputs = head.get("outputs", [])
    out = next((o for o in outputs if o.get("name") == "probability"), None)
    if out is None:
        raise ServerError(200, f"the response has no output 'probability': {outputs}")
    if "data" in out:
        return np.asarray(out["data"], dtype=np.float32).reshape(-1)
    size = out.get("parameters", {}).get("binary_data_size")
    if hlen is None or size is None:
        raise ServerError(200, "the response's 'probability' has neither data nor binary data")
    start = int(hlen)
    return np.frombuffer(data[start:start + int(size)], dtype="<f4").astype(np.float32)
