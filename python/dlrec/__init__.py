"""dlrec from Python: the ETL workflow, training, evaluation, export and prediction of the C++
library (the same code as the `dlrec` CLI), and a KServe v2 client for `dlrec serve`.

See docs/PYTHON.md. Errors of the library raise dlrec.Error (a RuntimeError) with the message
the CLI prints; bad arguments raise TypeError or ValueError naming the argument or column.
"""
import json
import os
import threading
import time

import numpy as np

from . import _dlrec
from ._columns import raw_rows
from .client import Client

Error = _dlrec.Error
__all__ = ["Error", "Workflow", "etl", "read_shard", "train", "evaluate", "export", "Predictor",
           "Client", "set_quiet"]
__version__ = "0.1.0"


def set_quiet(quiet=True):
    """Silences (or restores) the progress lines dlrec prints to stderr."""
    _dlrec.set_progress_quiet(bool(quiet))


def _json_text(value, what):
    """JSON text of a dict/list, or of a JSON file given by path."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, (str, os.PathLike)):
        return _dlrec.read_json_file(os.fspath(value))  # errors name the file, as the CLI's
    raise TypeError(f"{what} must be a dict or the path of a JSON file, got "
                    f"{type(value).__name__}")


def _schema_text(schema):
    if schema is None or schema == "criteo":
        return json.dumps({"format": "criteo"})
    return _json_text(schema, "schema")


def _files(source):
    """The source as a list of file paths, or None when it is in-memory data."""
    if isinstance(source, (str, os.PathLike)):
        return [os.fspath(source)]
    if isinstance(source, (list, tuple)) and source and all(
            isinstance(f, (str, os.PathLike)) for f in source):
        return [os.fspath(f) for f in source]
    return None


def _on_error(on_error):
    if on_error not in ("fail", "skip"):
        raise ValueError(f"on_error must be 'fail' or 'skip', got {on_error!r}")
    return on_error


_DEFAULT_WORKFLOW = {"pipeline": [
    {"columns": "@dense", "ops": [{"op": "FillMissing", "value": 0}, {"op": "Clip", "min": 0},
                                  {"op": "LogOp"}]},
    {"columns": "@categorical", "ops": [{"op": "Categorify", "freq_threshold": 15}]}]}


class Workflow:
    """An ETL workflow (etl::Workflow): fit on raw rows, transform raw rows into model inputs.

    Rows are a file path or list of paths (TSV/CSV/Parquet, read with the schema), a dict of
    NumPy arrays or a pyarrow Table (columns by schema name; see docs/PYTHON.md).
    """

    def __init__(self, config=None, schema=None, base_dir=""):
        """config: the pipeline (dict or JSON path; default: the Criteo workflow of
        configs/etl_criteo.json); schema: dict, JSON path or "criteo" (default)."""
        if config is None:
            config = _DEFAULT_WORKFLOW
        self._w = _dlrec.Workflow.from_config(_json_text(config, "config"),
                                              _schema_text(schema), os.fspath(base_dir))

    @classmethod
    def load(cls, path):
        """A fitted workflow from its workflow.json (written by `dlrec etl` or save())."""
        self = cls.__new__(cls)
        self._w = _dlrec.Workflow.load(os.fspath(path))
        return self

    @property
    def schema(self):
        return json.loads(self._w.schema_json())

    @property
    def fitted(self):
        return self._w.fitted()

    @property
    def dense_names(self):
        return self._w.dense_names()

    @property
    def cat_names(self):
        return self._w.cat_names()

    @property
    def layout(self):
        return json.loads(self._w.layout_json())

    def to_json(self):
        return json.loads(self._w.to_json())

    def save(self, path):
        self._w.save(os.fspath(path))

    def fit(self, rows, on_error="fail"):
        """Fits the workflow on every row given (files: on_error 'fail' or 'skip' for
        malformed lines). Returns self."""
        files = _files(rows)
        if files is not None:
            self._w.fit_files(files, _on_error(on_error))
        else:
            self._w.fit_rows(raw_rows(rows, self.schema, need_label=True))
        return self

    def transform(self, rows, on_error="fail"):
        """Encodes the rows: a dict with "labels" [rows], "dense" [rows, num_dense] float32,
        "cat_ids" and "cat_offsets" (one int64 array per categorical feature, in cat_names
        order) and, with Filter ops, "kept_rows" (the input row of each output row)."""
        if not self._w.fitted():
            raise Error("the workflow is not fitted: call fit() first, or load a fitted one")
        files = _files(rows)
        if files is not None:
            return self._w.transform_files(files, _on_error(on_error))
        return self._w.transform_rows(raw_rows(rows, self.schema, need_label=False))


def etl(inputs, out, workflow=None, schema=None, valid_ratio=None, train_rows=None,
        shard_rows=0, on_error="fail", overwrite=False, memory_budget_mb=0, shuffle=False,
        seed=0, ranks=1):
    """`dlrec etl`: fits the workflow on the training rows of the input files and writes the
    dataset directory `out` (shards, workflow.json, stats.json, dataset.json). Returns the
    run's counts and times as a dict."""
    files = _files(inputs)
    if files is None:
        raise TypeError("inputs must be a file path or a list of file paths")
    if valid_ratio is not None and train_rows is not None:
        raise ValueError("give either valid_ratio or train_rows, not both")
    if valid_ratio is None:
        valid_ratio = 0.0 if train_rows is not None else 0.1
    return _dlrec.run_etl(files, _schema_text(schema),
                          _json_text(_DEFAULT_WORKFLOW if workflow is None else workflow,
                                     "workflow"),
                          os.fspath(out), -1 if train_rows is None else int(train_rows),
                          float(valid_ratio), int(shard_rows), _on_error(on_error),
                          bool(overwrite), int(memory_budget_mb), bool(shuffle), int(seed),
                          int(ranks))


def read_shard(path):
    """The rows of a shard file (as Workflow.transform returns them) and its "layout_json"."""
    return _dlrec.read_shard(os.fspath(path))


_TRAIN_OVERRIDES = ("batch_size", "epochs", "max_steps", "device", "precision")


def train(config, data, run, resume=False, progress=None, metrics_log=None, **overrides):
    """Trains as `dlrec train` does (the same Trainer): config is a run config (dict or JSON
    path), data an ETL output directory, run the run directory. overrides: batch_size, epochs,
    max_steps, device, precision (as the CLI's flags). progress: called with each record of
    the metrics log ({"step", "loss"} per logged step, then the final evaluation) while training
    runs; an exception it raises stops the training at the next step boundary (no final
    checkpoint or evaluation, as an interrupted run) and is raised from train(); metrics_log:
    also keep those records in this file (JSON lines).
    Returns steps, samples, seconds, last_loss, logged_losses and eval (None without a
    validation split)."""
    for key, value in overrides.items():
        if key not in _TRAIN_OVERRIDES:
            raise TypeError(f"train() got an unexpected keyword argument '{key}' (overrides: "
                            f"{', '.join(_TRAIN_OVERRIDES)})")
        want = str if key in ("device", "precision") else int
        if value is not None and (not isinstance(value, want) or isinstance(value, bool)):
            raise TypeError(f"train(): {key} must be {want.__name__}, got {type(value).__name__}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if progress is not None and not callable(progress):
        raise TypeError("progress must be callable")
    if isinstance(config, (str, os.PathLike)):
        config_path, config_json = os.fspath(config), ""
    elif isinstance(config, dict):
        config_path, config_json = "", json.dumps(config)
    else:
        raise TypeError(f"config must be a dict or the path of a JSON file, got "
                        f"{type(config).__name__}")
    args = (config_path, config_json, overrides, os.fspath(data), os.fspath(run), bool(resume))
    if progress is None:
        return _dlrec.train(*args, "" if metrics_log is None else os.fspath(metrics_log))
    return _train_with_progress(args, progress, metrics_log)


def _train_with_progress(args, progress, metrics_log):
    """Runs the trainer on a thread (it releases the GIL) and hands each new line of its
    metrics log to `progress` on this thread. An exception there (raised by `progress`, or a
    KeyboardInterrupt) stops the training at its next step boundary and is raised once the
    trainer has stopped."""
    own_log = metrics_log is None
    log = os.fspath(args[4]) + ".progress.jsonl" if own_log else \
        os.fspath(metrics_log)
    start = os.path.getsize(log) if os.path.exists(log) else 0
    outcome = {}
    cancel = _dlrec.CancelFlag()

    def work():
        try:
            outcome["result"] = _dlrec.train(*args, log, cancel)
        except BaseException as e:  # handed to the caller's thread below
            outcome["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    pos, pending = start, b""
    try:
        while True:
            done = not t.is_alive()
            if os.path.exists(log):
                with open(log, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                pos += len(chunk)
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        progress(json.loads(line))
            if done:
                break
            time.sleep(0.05)
    except BaseException:
        cancel.set()  # the trainer stops at its next step; the exception goes on after the join
        raise
    finally:
        t.join()
        if own_log and os.path.exists(log):
            os.remove(log)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def evaluate(run, data=None):
    """`dlrec eval`: the run's checkpoint on the validation split; AUC/logloss (or RMSE/MAE for
    "mse"), rows, and "probabilities" (NumPy, in row order)."""
    return _dlrec.evaluate(os.fspath(run), "" if data is None else os.fspath(data))


def export(run, out, overwrite=False, onnx=None):
    """`dlrec export`: the run's latest checkpoint with its dataset's workflow into the model
    directory `out`. onnx: None, "auto" (model.onnx too) or "external" (weights in
    model.onnx.data)."""
    _dlrec.export_model(os.fspath(run), os.fspath(out), bool(overwrite),
                        "none" if onnx is None else onnx)


class Predictor:
    """An exported model (`dlrec export`) scoring raw rows, as `dlrec predict` and the server
    do: the workflow is applied first."""

    def __init__(self, model_dir, device="cpu", precision="fp32"):
        self._p = _dlrec.Predictor(os.fspath(model_dir), device, precision)
        self._schema = json.loads(self._p.schema_json())

    @property
    def schema(self):
        return self._schema

    @property
    def config(self):
        return json.loads(self._p.config_json())

    def predict(self, rows):
        """Probabilities (float32 NumPy [rows]; for "mse" models the predicted values) of raw
        rows: a dict of NumPy arrays or a pyarrow Table (label columns are not needed), or a
        list of text lines as in the logs."""
        if isinstance(rows, (list, tuple)) and all(isinstance(x, str) for x in rows):
            return self._p.predict_lines(list(rows), "lines", 4096)
        return self._p.predict_rows(raw_rows(rows, self._schema, need_label=False))
