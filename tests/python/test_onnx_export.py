"""`dlrec export --onnx` checked with onnxruntime (docs/EXPORT.md, "ONNX").

For every shipped model config (the dlrm/dcnv2/deepfm/wide_deep presets, the graph configs of
configs/, a hashed-table model) and for multi-hot data with sum and mean pooling: train a few
steps on generated data, export with --onnx, check the file with onnx's checker, and compare
onnxruntime's probabilities with `dlrec predict` on the same rows (its --onnx-inputs gives the
encoded rows): equal within 1e-5. Needs the built `dlrec` (DLREC_BIN_DIR), onnx and onnxruntime
(pinned in requirements-test.txt); skips visibly without them.
"""
import json
import os
import subprocess
import tempfile

import pytest

np = pytest.importorskip("numpy")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

BIN_DIR = os.environ.get("DLREC_BIN_DIR",
                         os.path.join(os.path.dirname(__file__), "../../build/bin"))
DLREC = os.path.join(BIN_DIR, "dlrec")
SRC = os.environ.get("DLREC_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "../.."))
TOL = 1e-5

pytestmark = pytest.mark.skipif(not os.path.exists(DLREC), reason=f"{DLREC} is not built")

NUM_DENSE, NUM_CAT, MULTI_HOT = 4, 6, 2
WORKFLOW = {"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 2}]}]}


def run(*args):
    p = subprocess.run([DLREC, *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"dlrec {' '.join(map(str, args))} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def schema(multi_hot):
    cols = [{"name": "label", "kind": "label"}]
    cols += [{"name": f"I{i}", "kind": "dense"} for i in range(NUM_DENSE)]
    cols += [{"name": f"C{i}", "kind": "categorical",
              "multi_hot": multi_hot and i >= NUM_CAT - MULTI_HOT} for i in range(NUM_CAT)]
    return {"format": "csv", "delimiter": "\t", "header": False, "list_sep": ",",
            "cat_encoding": "hex", "columns": cols}


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="dlrec_onnx_") as d:
        for name, mh in (("onehot", 0), ("multihot", MULTI_HOT)):
            logs = os.path.join(d, f"{name}.tsv")
            run("datagen", "--out", logs, "--rows", 4000, "--seed", 11, "--num-dense", NUM_DENSE,
                "--num-cat", NUM_CAT, "--multi-hot", mh)
            for f, obj in ((f"{name}_schema.json", schema(mh > 0)), ("workflow.json", WORKFLOW)):
                with open(os.path.join(d, f), "w") as out:
                    json.dump(obj, out)
            run("etl", "--input", logs, "--format", "csv", "--schema",
                os.path.join(d, f"{name}_schema.json"), "--workflow",
                os.path.join(d, "workflow.json"), "--out", os.path.join(d, f"data_{name}"))
            # The rows to score: the last 300 of the logs (validation rows, unseen ids included).
            with open(logs) as f:
                lines = f.read().splitlines()
            with open(os.path.join(d, f"{name}_rows.tsv"), "w") as f:
                f.write("\n".join(lines[-300:]) + "\n")
        yield d


def shipped(name, section="model"):
    with open(os.path.join(SRC, "configs", name)) as f:
        return json.load(f)[section]


# The shipped configs train with their own optimizer; the others with this one.
OPTIMIZER = {"type": "adagrad", "lr": 0.05}
SHIPPED = {"dlrm_small": "dlrm_small.json", "dcnv2": "dcnv2.json", "deepfm": "deepfm.json",
           "wide_deep": "wide_deep.json", "dlrm_graph": "dlrm_graph.json",
           "dlrm_hashed": "dlrm_hashed.json", "criteo_sample_dcnv2": "criteo_sample_dcnv2.json"}


MODELS = {
    # Presets.
    "dlrm_small": lambda: shipped("dlrm_small.json"),
    "dlrm_cat_mean": lambda: {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8],
                              "top_mlp": [16, 1], "interaction": "cat", "pooling": "mean"},
    "dcnv2_preset": lambda: {"arch": "dcnv2", "embedding_dim": 8, "bottom_mlp": [16, 8],
                             "top_mlp": [32, 1], "cross_layers": 2},
    "dcnv2_preset_low_rank": lambda: {"arch": "dcnv2", "embedding_dim": 8, "bottom_mlp": [16, 8],
                                      "top_mlp": [32, 1], "cross_layers": 3, "cross_low_rank": 4},
    "deepfm_preset": lambda: {"arch": "deepfm", "embedding_dim": 8, "top_mlp": [32, 1]},
    "wide_deep_preset": lambda: {"arch": "wide_deep", "embedding_dim": 8, "top_mlp": [32, 1]},
    # Shipped graph configs (their own layer lists and sizes).
    "dcnv2": lambda: shipped("dcnv2.json"),
    "deepfm": lambda: shipped("deepfm.json"),
    "wide_deep": lambda: shipped("wide_deep.json"),
    "dlrm_graph": lambda: shipped("dlrm_graph.json"),
    "dlrm_hashed": lambda: shipped("dlrm_hashed.json"),
    "criteo_sample_dcnv2": lambda: shipped("criteo_sample_dcnv2.json"),
    # Mixed: a table subset with per-table widths, a hashed table among fixed ones.
    "graph_mixed": lambda: {"arch": "graph", "layers": [
        {"name": "dense", "type": "dense"},
        {"name": "emb", "type": "embedding", "features": [0, 2, 5], "dims": [4, 6, 8],
         "tables": {"2": {"hashed": {"capacity": 150}}}},
        {"name": "all", "type": "concat", "inputs": ["dense", "emb"]},
        {"name": "top", "type": "mlp", "input": "all", "sizes": [8, 1]},
        {"name": "wide", "type": "wide", "features": [1, 5]},
        {"name": "sum", "type": "add", "inputs": ["top", "wide"]},
        {"name": "logit", "type": "output", "input": "sum"}]},
}


def check(work, tag, name, data, pooling=None, steps=12, flag="--onnx"):
    model = MODELS[name]()
    optimizer = shipped(SHIPPED[name], "optimizer") if name in SHIPPED else OPTIMIZER
    if pooling is not None:
        model = dict(model, pooling=pooling)
        if model.get("arch") == "graph":
            model["layers"] = [dict(l, pooling=pooling) if l["type"] in ("embedding", "wide")
                               else l for l in model["layers"]]
    d = os.path.join(work, tag)
    os.makedirs(d)
    cfg = {"model": model, "optimizer": optimizer,
           "train": {"batch_size": 128, "max_steps": steps, "log_every": 0, "seed": 7}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    run("train", "--config", os.path.join(d, "config.json"), "--data",
        os.path.join(work, f"data_{data}"), "--run", os.path.join(d, "run"))
    run("export", "--run", os.path.join(d, "run"), "--out", os.path.join(d, "model"), flag)
    path = os.path.join(d, "model", "model.onnx")
    # (By path: with external data the checker reads the tensors beside the model.)
    onnx.checker.check_model(path, full_check=True)
    run("predict", "--model", os.path.join(d, "model"), "--input",
        os.path.join(work, f"{data}_rows.tsv"), "--output", os.path.join(d, "probs.txt"),
        "--onnx-inputs", os.path.join(d, "feed.json"))
    expected = np.loadtxt(os.path.join(d, "probs.txt"), dtype=np.float64)
    with open(os.path.join(d, "feed.json")) as f:
        feed = {k: np.asarray(v, dtype=np.float32 if k == "dense" else np.int64)
                for k, v in json.load(f).items()}
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == sorted(feed)
    prob, logit = session.run(["probability", "logit"], feed)
    assert prob.shape == expected.shape == (300,)
    diff = float(np.max(np.abs(prob.astype(np.float64) - expected)))
    print(f"{tag}: max |onnxruntime - dlrec| = {diff:.3g}")
    assert diff <= TOL, f"{tag}: onnxruntime differs from dlrec predict by {diff}"
    assert np.allclose(1 / (1 + np.exp(-logit.astype(np.float64))), prob, atol=1e-6)
    # Not a constant model: the rows get different scores.
    assert float(np.std(expected)) > 1e-4, f"{tag}: every row scored the same"
    return session, feed


@pytest.mark.parametrize("name", sorted(MODELS))
def test_onehot_models_match_onnxruntime(work, name):
    check(work, f"onehot_{name}", name, "onehot")


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("name", ["dlrm_small", "deepfm", "graph_mixed", "dlrm_hashed"])
def test_multihot_models_match_onnxruntime(work, name, pooling):
    session, feed = check(work, f"multihot_{name}_{pooling}", name, "multihot", pooling)
    # The multi-hot features come as CSR pairs, the one-hot ones as the columns of "cat".
    names = {i.name: i for i in session.get_inputs()}
    for t in range(NUM_CAT - MULTI_HOT, NUM_CAT):
        assert f"cat_{t}_ids" in names and f"cat_{t}_offsets" in names
    assert names["cat"].shape == ["N", NUM_CAT]
    lens = np.diff(feed[f"cat_{NUM_CAT - 1}_offsets"])
    assert lens.max() > 1, "the data should hold bags of several ids"


@pytest.mark.parametrize("name", ["dcnv2_preset", "graph_mixed"])
def test_external_data_matches_onnxruntime(work, name):
    """--onnx-external-data: the large weights in model.onnx.data beside model.onnx."""
    check(work, f"external_{name}", name, "onehot", flag="--onnx-external-data")
    model_dir = os.path.join(work, f"external_{name}", "model")
    assert os.path.getsize(os.path.join(model_dir, "model.onnx.data")) > 10000
    m = onnx.load(os.path.join(model_dir, "model.onnx"), load_external_data=False)
    external = [t for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    # Only small constants (shapes, indices) stay inside.
    assert all(len(t.raw_data) < 1024 for t in m.graph.initializer)
    assert external and all(int(next(e.value for e in t.external_data if e.key == "offset"))
                            % 4096 == 0 for t in external)


def test_untrained_hashed_model_exports(work):
    """A hashed table that has seen no id yet: every id reads zeros, as in dlrec."""
    d = os.path.join(work, "init_hashed")
    os.makedirs(d)
    cfg = {"model": shipped("dlrm_hashed.json"), "optimizer": {"type": "sgd", "lr": 0.1},
           "train": {"batch_size": 64}}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    run("export", "--init", os.path.join(d, "config.json"), "--data",
        os.path.join(work, "data_onehot"), "--out", os.path.join(d, "model"), "--onnx")
    run("predict", "--model", os.path.join(d, "model"), "--input",
        os.path.join(work, "onehot_rows.tsv"), "--output", os.path.join(d, "probs.txt"),
        "--onnx-inputs", os.path.join(d, "feed.json"))
    expected = np.loadtxt(os.path.join(d, "probs.txt"), dtype=np.float64)
    with open(os.path.join(d, "feed.json")) as f:
        feed = {k: np.asarray(v, dtype=np.float32 if k == "dense" else np.int64)
                for k, v in json.load(f).items()}
    prob = ort.InferenceSession(os.path.join(d, "model", "model.onnx"),
                                providers=["CPUExecutionProvider"]).run(["probability"], feed)[0]
    assert float(np.max(np.abs(prob - expected))) <= TOL


def test_export_without_onnx_flag_writes_no_onnx(work):
    d = os.path.join(work, "no_flag")
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"model": MODELS["dlrm_small"](), "train": {"batch_size": 64}}, f)
    run("export", "--init", os.path.join(d, "config.json"), "--data",
        os.path.join(work, "data_onehot"), "--out", os.path.join(d, "model"))
    assert not os.path.exists(os.path.join(d, "model", "model.onnx"))
