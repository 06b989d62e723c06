"""`pip install .` of the Python package (pyproject.toml, docs/PYTHON.md): builds the wheel with
scikit-build-core (pinned in requirements-test.txt; no build isolation, nothing downloaded) in
<build>/pip (CPU only), so that the next run rebuilds only what changed, installs it into a
temporary directory and checks that the installed package encodes rows as the build tree's
package does."""
import json
import os
import subprocess
import sys
import time

import pytest

from package_common import BIN_DIR, import_dlrec

np = pytest.importorskip("numpy")
pytest.importorskip("scikit_build_core", reason="scikit-build-core is not installed "
                    "(scripts/install-deps.sh installs it from requirements-test.txt)")
dlrec = import_dlrec()

SOURCE_DIR = os.environ.get("DLREC_SOURCE_DIR", "")

CHECK = """
import json, sys, numpy as np, dlrec
assert dlrec.__file__.startswith(sys.argv[1]), dlrec.__file__
schema = {"format": "csv", "columns": [{"name": "x", "kind": "dense"},
                                       {"name": "c", "kind": "categorical"}]}
wf = dlrec.Workflow({"pipeline": [{"columns": ["x"], "ops": [{"op": "FillMissing"}]},
                                   {"columns": ["c"], "ops": [{"op": "Categorify"}]}]}, schema)
rows = {"x": np.array([1.5, np.nan, 3.0]), "c": np.array(["a", "b", "a"])}
out = wf.fit(rows).transform(rows)
try:
    dlrec.Workflow({"pipeline": [{"columns": ["c"], "ops": [{"op": "Nope"}]}]}, schema)
except dlrec.Error as e:
    err = str(e)
print(json.dumps({"ids": out["cat_ids"][0].tolist(), "dense": out["dense"].tolist(),
                  "error": err}))
"""


def test_pip_install_builds_a_working_package(tmp_path):
    assert SOURCE_DIR, "DLREC_SOURCE_DIR is not set (run through ctest)"
    build_dir = os.path.normpath(os.path.join(BIN_DIR, "..", "pip"))
    # The packaging path is what is tested here: a CPU build (CUDA sources would cost CI far
    # more), with every core (Makefiles build serially unless told).
    env = dict(os.environ)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", SOURCE_DIR, "--no-deps",
                        "--no-build-isolation", "--no-cache-dir", "--disable-pip-version-check",
                        "-w", str(tmp_path / "wheel"), "-C", f"build-dir={build_dir}",
                        "-C", "cmake.define.DLREC_CUDA=OFF"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]
    print(f"pip wheel: {time.monotonic() - t:.1f} s (build tree {build_dir})")
    wheels = list((tmp_path / "wheel").glob("dlrec-*.whl"))
    assert len(wheels) == 1, wheels
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--disable-pip-version-check", "--target", str(site), str(wheels[0])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (site / "dlrec" / "client.py").exists()
    # dlrec.torch: its module and its C ABI library (docs/PYTHON.md, "dlrec.torch").
    assert (site / "dlrec" / "torch.py").exists()
    assert (site / "dlrec" / "libdlrec_torch.so").exists()
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", CHECK, str(site)], capture_output=True, text=True,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # The same rows through the build tree's package.
    schema = {"format": "csv", "columns": [{"name": "x", "kind": "dense"},
                                           {"name": "c", "kind": "categorical"}]}
    wf = dlrec.Workflow({"pipeline": [{"columns": ["x"], "ops": [{"op": "FillMissing"}]},
                                      {"columns": ["c"], "ops": [{"op": "Categorify"}]}]}, schema)
    rows = {"x": np.array([1.5, np.nan, 3.0]), "c": np.array(["a", "b", "a"])}
    want = wf.fit(rows).transform(rows)
    assert got["ids"] == want["cat_ids"][0].tolist()
    assert np.array_equal(np.array(got["dense"], np.float32), want["dense"], equal_nan=True)
    assert "Nope" in got["error"]
