"""dlrec.train's progress callback raising: the training stops at its next step boundary and
train() raises that exception, rather than finishing the whole run first. No torch needed."""
import json

import pytest

from package_common import TRAIN_CONFIG, WORKFLOW, cli, import_dlrec

dlrec = import_dlrec()

STEPS = 20000  # far more than run before the callback's exception is seen (every 50 ms)


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("progress")
    cli("datagen", "--out", d / "raw.tsv", "--rows", 2000, "--seed", 3)
    (d / "wf.json").write_text(json.dumps(WORKFLOW))
    cli("etl", "--input", d / "raw.tsv", "--workflow", d / "wf.json", "--out", d / "data",
        "--valid-ratio", 0.2)
    return d


def config():
    cfg = json.loads(json.dumps(TRAIN_CONFIG))
    cfg["train"].update({"log_every": 1, "max_steps": STEPS, "epochs": 1000,
                         "checkpoint_every": 0})
    return cfg


def logged(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_an_exception_in_progress_stops_training_and_is_raised(data):
    seen = []
    stop = Stop("enough")

    def progress(record):
        seen.append(record)
        if record.get("step") == 3:
            raise stop

    log = data / "stopped.jsonl"
    with pytest.raises(Stop) as raised:
        dlrec.train(config(), data / "data", data / "run_stopped", progress=progress,
                    metrics_log=log)
    assert raised.value is stop
    assert [r["step"] for r in seen] == [1, 2, 3]  # not called after it raised
    records = logged(log)
    last = records[-1]["step"]
    assert 3 <= last < STEPS, f"training went on to step {last} after the callback raised"
    assert not any("auc" in r for r in records), "the final evaluation ran"


def test_a_run_without_an_exception_still_finishes(data):
    steps = []
    result = dlrec.train(config() | {"train": config()["train"] | {"max_steps": 30}},
                         data / "data", data / "run_full",
                         progress=lambda r: steps.append(r["step"]))
    assert result["steps"] == 30
    assert steps[:30] == list(range(1, 31)) and len(steps) == 31  # then the evaluation's record
