"""Shared setup of the Python tests: the CLI (DLREC, cli, the needs_dlrec mark), free loopback
ports, and for the package's tests (test_package*.py) the package as the CMake build left it
(<build>/python/dlrec, beside DLREC_BIN_DIR) and small generated inputs."""
import os
import socket
import subprocess
import sys

import pytest

BIN_DIR = os.environ.get("DLREC_BIN_DIR", "")
DLREC = os.path.join(BIN_DIR, "dlrec")
PKG_DIR = os.path.normpath(os.path.join(BIN_DIR, "..", "python")) if BIN_DIR else ""
# A module's pytestmark where every test runs the CLI.
needs_dlrec = pytest.mark.skipif(not os.path.exists(DLREC), reason="dlrec binary not built")


def import_dlrec():
    """The dlrec package of this build; skips the module visibly when it was not built."""
    if not BIN_DIR or not os.path.exists(DLREC):
        pytest.skip("DLREC_BIN_DIR does not hold the dlrec binary (run through ctest)",
                    allow_module_level=True)
    if not os.path.isdir(os.path.join(PKG_DIR, "dlrec")):
        pytest.skip("the Python module was not built (pybind11 or Python's headers were not "
                    "found at configure time; see python/dlrec.cmake)", allow_module_level=True)
    sys.path.insert(0, PKG_DIR)
    import dlrec
    return dlrec


def cli(*args):
    r = subprocess.run([DLREC, *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, f"dlrec {' '.join(map(str, args))}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_error(*args):
    """The message of a failing CLI command (its 'dlrec: error: ...' line)."""
    r = subprocess.run([DLREC, *map(str, args)], capture_output=True, text=True)
    assert r.returncode != 0, f"dlrec {' '.join(map(str, args))} did not fail"
    lines = [line for line in r.stderr.splitlines() if line.startswith("dlrec: error: ")]
    assert lines, r.stderr
    return lines[-1]


# Categorify with a low threshold, so that ids of a small dataset are not all "rare".
WORKFLOW = {"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]}

TRAIN_CONFIG = {
    "model": {"arch": "dlrm", "embedding_dim": 4, "bottom_mlp": [8, 4], "top_mlp": [8, 1],
              "interaction": "dot", "pooling": "sum"},
    "optimizer": {"type": "adagrad", "lr": 0.05},
    "train": {"batch_size": 64, "epochs": 1, "max_steps": 20, "eval_every": 0,
              "log_every": 5, "checkpoint_every": 0, "seed": 3, "device": "cpu"},
}
