"""`dlrec train` writes TensorBoard event files that tensorboard's own readers load.

The run directory gets events.out.tfevents.<time>.<host>: loss, samples/s and learning rate at
every logging step, validation AUC and logloss at every evaluation, written by dlrec itself
(TFRecord framing, masked CRC-32C, Event protobufs; docs/TRAINING.md). Checked with the pinned
`tensorboard` package (requirements-test.txt): its record reader (which verifies every CRC) and
EventAccumulator (what the TensorBoard UI loads) see the tags, steps and values dlrec printed. A
run killed with SIGKILL leaves a file those readers load. Skips visibly without tensorboard or
the built `dlrec` (DLREC_BIN_DIR).
"""
import glob
import json
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest

loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

BIN_DIR = os.environ.get("DLREC_BIN_DIR",
                         os.path.join(os.path.dirname(__file__), "../../build/bin"))
DLREC = os.path.join(BIN_DIR, "dlrec")

pytestmark = pytest.mark.skipif(not os.path.exists(DLREC), reason=f"{DLREC} is not built")

LR, WARMUP = 0.04, 10


def run(*args):
    p = subprocess.run([DLREC, *map(str, args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"dlrec {' '.join(map(str, args))} failed ({p.returncode}):\n"
                             f"{p.stdout}\n{p.stderr}")
    return p


def config(path, **train):
    cfg = {"model": {"arch": "dlrm", "embedding_dim": 8, "bottom_mlp": [16, 8],
                     "top_mlp": [16, 1]},
           "optimizer": {"type": "adagrad", "lr": LR, "schedule": {"warmup_steps": WARMUP}},
           "train": dict({"batch_size": 64, "seed": 3}, **train)}
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="dlrec_tb_") as d:
        with open(os.path.join(d, "schema.json"), "w") as f:
            json.dump({"format": "criteo", "num_dense": 3, "num_cat": 4}, f)
        run("datagen", "--out", os.path.join(d, "logs.tsv"), "--rows", 3000, "--seed", 5,
            "--num-dense", 3, "--num-cat", 4)
        run("etl", "--input", os.path.join(d, "logs.tsv"), "--schema",
            os.path.join(d, "schema.json"), "--out", os.path.join(d, "data"))
        yield d


def events(run_dir):
    files = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
    assert len(files) == 1, files
    assert re.fullmatch(r"events\.out\.tfevents\.\d+\.\S+", os.path.basename(files[0]))
    return list(loader.LegacyEventFileLoader(files[0]).Load())


def scalars(evs):
    out = {}
    for e in evs:
        for v in e.summary.value:
            out.setdefault(v.tag, []).append((e.step, v.simple_value))
    return out


def test_scalars_match_what_training_printed(work):
    run_dir = os.path.join(work, "run")
    p = run("train", "--config", config(os.path.join(work, "c.json"), max_steps=22, log_every=5,
                                        eval_every=10),
            "--data", os.path.join(work, "data"), "--run", run_dir)
    evs = events(run_dir)
    assert evs[0].file_version == "brain.Event:2"
    assert all(e.wall_time > 1.6e9 for e in evs)
    s = scalars(evs)
    assert set(s) == {"train/loss", "train/samples_per_sec", "train/learning_rate", "eval/auc",
                      "eval/logloss"}
    for tag in ("train/loss", "train/samples_per_sec", "train/learning_rate"):
        assert [step for step, _ in s[tag]] == [5, 10, 15, 20, 22], tag
    assert all(v > 0 for _, v in s["train/samples_per_sec"])
    # Warm-up: lr * step / warmup until the warm-up ends (the step's own factor).
    for step, v in s["train/learning_rate"]:
        assert v == pytest.approx(LR * min(step, WARMUP) / WARMUP, rel=1e-6), step
    # The last window's loss and the evaluations, as printed (5 decimals).
    final_loss = float(re.search(r"^trained: .* loss=([0-9.]+)$", p.stdout, re.M).group(1))
    assert s["train/loss"][-1][1] == pytest.approx(final_loss, abs=1e-5)
    printed = [(int(m[0]), float(m[1]), float(m[2])) for m in
               re.findall(r"\[eval\] step (\d+) rows=\d+ AUC=([0-9.]+) logloss=([0-9.]+)",
                          p.stderr)]
    m = re.search(r"validation: rows=\d+ AUC=([0-9.]+) logloss=([0-9.]+)", p.stdout)
    printed.append((22, float(m.group(1)), float(m.group(2))))
    assert [step for step, _ in s["eval/auc"]] == [10, 20, 22]
    for (step, auc, ll), (s1, a), (s2, l) in zip(printed, s["eval/auc"], s["eval/logloss"]):
        assert step == s1 == s2
        assert a == pytest.approx(auc, abs=1e-5) and l == pytest.approx(ll, abs=1e-5)
    # TensorBoard's own loader (what its UI shows) sees the same scalars.
    acc = accumulator.EventAccumulator(run_dir)
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == set(s)
    assert [(x.step, x.value) for x in acc.Scalars("eval/auc")] == s["eval/auc"]


def test_resumed_run_adds_a_file(work):
    run_dir = os.path.join(work, "resume")
    c = config(os.path.join(work, "r.json"), max_steps=8, log_every=4)
    run("train", "--config", c, "--data", os.path.join(work, "data"), "--run", run_dir)
    c = config(os.path.join(work, "r.json"), max_steps=16, log_every=4)
    run("train", "--config", c, "--data", os.path.join(work, "data"), "--run", run_dir,
        "--resume")
    files = sorted(glob.glob(os.path.join(run_dir, "events.out.tfevents.*")))
    assert len(files) == 2
    steps = sorted(e.step for f in files for e in loader.LegacyEventFileLoader(f).Load()
                   if any(v.tag == "train/loss" for v in e.summary.value))
    assert steps == [4, 8, 12, 16]


def test_killed_run_leaves_a_readable_file(work):
    run_dir = os.path.join(work, "killed")
    c = config(os.path.join(work, "k.json"), epochs=10000, log_every=1)
    proc = subprocess.Popen([DLREC, "train", "--config", c, "--data", os.path.join(work, "data"),
                             "--run", run_dir], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        path = None
        while time.time() < deadline:
            found = glob.glob(os.path.join(run_dir, "events.out.tfevents.*"))
            if found and os.path.getsize(found[0]) > 20000:
                path = found[0]
                break
            time.sleep(0.05)
        assert path, "no event file grew within 60 s"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    size = os.path.getsize(path)
    evs = list(loader.LegacyEventFileLoader(path).Load())
    losses = [e.step for e in evs for v in e.summary.value if v.tag == "train/loss"]
    # Every step up to the kill is there, in order (a record is ~60 bytes: hundreds of them).
    assert len(losses) > 50 and losses == list(range(1, len(losses) + 1))
    # A record cut short (as a kill in the middle of a write would leave it) is dropped by the
    # reader; the ones before it still load.
    cut = os.path.join(work, "cut.tfevents")
    with open(path, "rb") as f, open(cut, "wb") as out:
        out.write(f.read(size - 5))
    assert len(list(loader.LegacyEventFileLoader(cut).Load())) == len(evs) - 1
    # The reader checks the CRCs: a flipped byte stops it at that record. (So every record it
    # loaded above had CRCs it accepted.)
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data[size // 2] ^= 1
    with open(cut, "wb") as out:
        out.write(data)
    assert len(list(loader.LegacyEventFileLoader(cut).Load())) < len(evs) - 1
