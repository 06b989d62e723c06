"""Every error path of the Python package (docs/PYTHON.md): library errors raise dlrec.Error (a
RuntimeError) with the CLI's message; bad arguments (type, dtype, shape, missing column) raise
TypeError / ValueError naming the argument or the column."""
import json

import pytest

from package_common import TRAIN_CONFIG, WORKFLOW, cli, cli_error, import_dlrec

np = pytest.importorskip("numpy")
dlrec = import_dlrec()

SCHEMA = {"format": "csv", "columns": [
    {"name": "y", "kind": "label"}, {"name": "x", "kind": "dense"},
    {"name": "c", "kind": "categorical"}, {"name": "m", "kind": "categorical", "multi_hot": True}]}
CONFIG = {"pipeline": [{"columns": "@categorical", "ops": [{"op": "Categorify"}]}]}
HEX_SCHEMA = dict(SCHEMA, cat_encoding="hex")


def rows(n=4):
    return {"y": np.zeros(n, np.float32), "x": np.arange(n, dtype=np.float32),
            "c": np.arange(n, dtype=np.int64), "m": (np.arange(n + 1), np.arange(n))}


@pytest.fixture
def wf():
    return dlrec.Workflow(CONFIG, schema=SCHEMA).fit(rows())


def test_error_is_a_runtime_error():
    assert issubclass(dlrec.Error, RuntimeError)


def cli_message(*args):
    return cli_error(*args).removeprefix("dlrec: error: ")


def test_library_errors_carry_the_cli_message(tmp_path):
    missing = tmp_path / "missing.tsv"
    with pytest.raises(dlrec.Error) as e:
        dlrec.etl(missing, tmp_path / "out")
    assert str(e.value) == cli_message("etl", "--input", missing, "--out", tmp_path / "out")
    bad = tmp_path / "bad.tsv"
    bad.write_text("1\t" + "\t" * 12 + "\tzz" + "\t" * 25 + "\n")
    with pytest.raises(dlrec.Error) as e:
        dlrec.etl(bad, tmp_path / "out2")
    assert "bad.tsv:1" in str(e.value)
    assert str(e.value) == cli_message("etl", "--input", bad, "--out", tmp_path / "out2")
    with pytest.raises(dlrec.Error) as e:
        dlrec.Predictor(tmp_path / "nomodel")
    (tmp_path / "x.tsv").write_text("")
    assert str(e.value) == cli_message("predict", "--model", tmp_path / "nomodel", "--input",
                                       tmp_path / "x.tsv")


def test_bad_configs(tmp_path):
    with pytest.raises(dlrec.Error, match="Categorfy"):
        dlrec.Workflow({"pipeline": [{"columns": "@categorical", "ops": [{"op": "Categorfy"}]}]})
    with pytest.raises(dlrec.Error, match="nope"):
        dlrec.Workflow(CONFIG, schema={"format": "csv", "columns": [{"name": "a", "kind": "nope"}]})
    p = tmp_path / "broken.json"
    p.write_text("{\"pipeline\": [")
    with pytest.raises(dlrec.Error, match="broken.json"):
        dlrec.Workflow(p)
    with pytest.raises(TypeError, match="config must be a dict"):
        dlrec.Workflow(42)
    cfg = json.loads(json.dumps(TRAIN_CONFIG))
    cfg["train"]["bogus_key"] = 1
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(dlrec.Error) as e:
        dlrec.train(tmp_path / "cfg.json", tmp_path / "data", tmp_path / "run")
    assert "bogus_key" in str(e.value)
    assert str(e.value) == cli_message("train", "--config", tmp_path / "cfg.json", "--data",
                                       tmp_path / "data", "--run", tmp_path / "run")
    with pytest.raises(dlrec.Error, match="bogus_key"):
        dlrec.train(cfg, tmp_path / "data", tmp_path / "run")


def test_bad_train_eval_export_arguments(tmp_path):
    with pytest.raises(TypeError, match="unexpected keyword argument 'batchsize'"):
        dlrec.train(TRAIN_CONFIG, tmp_path, tmp_path / "run", batchsize=3)
    with pytest.raises(TypeError, match="batch_size must be int"):
        dlrec.train(TRAIN_CONFIG, tmp_path, tmp_path / "run", batch_size="64")
    with pytest.raises(TypeError, match="progress must be callable"):
        dlrec.train(TRAIN_CONFIG, tmp_path, tmp_path / "run", progress=3)
    # Overrides are validated as the config file's keys are (a batch of 0 rows divided by zero).
    for key, value in (("batch_size", 0), ("batch_size", -3), ("epochs", 0), ("max_steps", 0)):
        with pytest.raises(dlrec.Error, match=f"train.{key}"):
            dlrec.train(TRAIN_CONFIG, tmp_path, tmp_path / "run", **{key: value})
    with pytest.raises(dlrec.Error, match="train.precision"):
        dlrec.train(TRAIN_CONFIG, tmp_path, tmp_path / "run", precision="fp8")
    with pytest.raises(dlrec.Error, match="dataset.json"):  # no dataset there
        dlrec.train(TRAIN_CONFIG, tmp_path / "nodata", tmp_path / "run")
    with pytest.raises(dlrec.Error, match="run.json"):
        dlrec.evaluate(tmp_path / "norun")
    with pytest.raises(dlrec.Error, match="onnx must be"):
        dlrec.export(tmp_path / "norun", tmp_path / "m", onnx="yes")
    with pytest.raises(dlrec.Error):
        dlrec.export(tmp_path / "norun", tmp_path / "m")


def test_bad_rows(wf):
    with pytest.raises(ValueError, match="missing column 'c'"):
        wf.transform({k: v for k, v in rows().items() if k != "c"})
    with pytest.raises(ValueError, match="missing column 'y'"):  # fit needs the label
        dlrec.Workflow(CONFIG, schema=SCHEMA).fit({k: v for k, v in rows().items() if k != "y"})
    with pytest.raises(TypeError, match="dense column 'x' needs a numeric array, got dtype <U1"):
        wf.transform(dict(rows(), x=np.array(["a", "b", "c", "d"])))
    with pytest.raises(ValueError, match=r"dense column 'x' needs a 1-D array, got shape \(4, 1\)"):
        wf.transform(dict(rows(), x=np.zeros((4, 1), np.float32)))
    with pytest.raises(ValueError, match="column 'x' has 3 rows, the first column has 4"):
        wf.transform(dict(rows(), x=np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="categorical column 'c' needs integer keys or strings"):
        wf.transform(dict(rows(), c=np.zeros(4, np.float32)))
    with pytest.raises(ValueError, match="column 'c' needs a 1-D array"):
        wf.transform(dict(rows(), c=np.zeros((2, 2), np.int64)))
    with pytest.raises(TypeError, match="categorical column 'c' holds int values"):
        wf.transform(dict(rows(), c=np.array(["a", 5, "b", None], dtype=object)))
    with pytest.raises(ValueError, match="a pair \\(offsets, keys\\), got a tuple of 1"):
        wf.transform(dict(rows(), m=(np.arange(5),)))
    with pytest.raises(ValueError, match="column 'm' has 3 rows"):
        wf.transform(dict(rows(), m=(np.arange(4), np.arange(3))))
    with pytest.raises(dlrec.Error, match="column 'm': list offsets must start at 0 and end at 4"):
        wf.transform(dict(rows(), m=(np.array([0, 1, 2, 3, 9]), np.arange(4))))
    with pytest.raises(dlrec.Error, match="column 'm': list offsets decrease at row 1"):
        wf.transform(dict(rows(), m=(np.array([0, 3, 1, 2, 4]), np.arange(4))))
    with pytest.raises(TypeError, match="rows must be a dict of NumPy arrays"):
        wf.transform(42)
    with pytest.raises(ValueError, match="rows hold no columns"):
        wf.transform({})
    with pytest.raises(ValueError, match="on_error must be 'fail' or 'skip'"):
        wf.transform("x.tsv", on_error="ignore")


def test_bad_keys():
    wf = dlrec.Workflow(CONFIG, schema=HEX_SCHEMA)
    with pytest.raises(dlrec.Error, match="column 'c', row 2: 'xyz' is not a hexadecimal"):
        wf.fit(dict(rows(), c=np.array(["a1", "", "xyz", "ff"])))
    with pytest.raises(dlrec.Error, match="more than 16 digits"):
        wf.fit(dict(rows(), c=np.array(["a1", "", "1" * 17, "ff"])))
    # Several values in a one-hot column's row (a "|" list given to a one-hot column).
    one_hot = dlrec.Workflow(CONFIG, schema=dict(SCHEMA, columns=[
        {"name": "y", "kind": "label"}, {"name": "c", "kind": "categorical"}]))
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"y": np.zeros(2, np.float32), "c": pa.array([[1, 2], [3]])})
    with pytest.raises(dlrec.Error, match="column 'c' is one-hot in the schema but a row holds"):
        one_hot.fit(table)
    with pytest.raises(TypeError, match="Arrow type double"):
        one_hot.fit(pa.table({"y": np.zeros(2, np.float32), "c": pa.array([1.5, 2.5])}))
    with pytest.raises(ValueError, match="null items inside a list"):
        dlrec.Workflow(CONFIG, schema=SCHEMA).fit(pa.table({
            "y": np.zeros(2, np.float32), "x": np.zeros(2, np.float32), "c": pa.array([1, 2]),
            "m": pa.array([[1, None], [3]])}))


def test_transform_before_fit_and_missing_values(wf):
    with pytest.raises(dlrec.Error, match="not fitted"):
        dlrec.Workflow(CONFIG, schema=SCHEMA).transform(rows())
    # Missing values: a negative int64 key, an empty string, an Arrow null -> id 0.
    got = wf.transform(dict(rows(), c=np.array([0, -1, 2, -5], np.int64)))
    np.testing.assert_array_equal(got["cat_ids"][0][[1, 3]], [0, 0])
    np.testing.assert_array_equal(got["cat_offsets"][0], [0, 1, 2, 3, 4])


def test_predictor_bad_rows(tmp_path):
    d = tmp_path
    cli("datagen", "--out", d / "raw.tsv", "--rows", 600, "--seed", 2)
    (d / "wf.json").write_text(json.dumps(WORKFLOW))
    cli("etl", "--input", d / "raw.tsv", "--workflow", d / "wf.json", "--out", d / "data")
    dlrec.set_quiet(True)
    try:
        dlrec.train(TRAIN_CONFIG, d / "data", d / "run", max_steps=2)
    finally:
        dlrec.set_quiet(False)
    dlrec.export(d / "run", d / "model")
    with pytest.raises(dlrec.Error, match="exists"):
        dlrec.export(d / "run", d / "model")
    p = dlrec.Predictor(d / "model")
    with pytest.raises(ValueError, match="missing column 'I1'"):
        p.predict({"C1": np.zeros(3, np.int64)})
    with pytest.raises(dlrec.Error, match="lines:1"):
        p.predict(["not\ta\tcriteo\tline"])
    with pytest.raises(dlrec.Error):
        dlrec.Predictor(d / "model", device="tpu:0")
