"""dlrec's dense optimizer steps against torch.optim on random data.

Each case runs a few steps of one optimizer on a random [7, 5] parameter with random gradients,
in PyTorch (float32, CPU) and in dlrec (through the `OptimizerTorch.StepsFromFile` case of
build/bin/test_nn, fed a JSON file), and compares the final weights. Skipped when torch is not
installed or test_nn is not built.
"""
import json
import os
import subprocess
import tempfile
import zlib

import pytest

torch = pytest.importorskip("torch")

BIN = os.environ.get("DLREC_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
TEST_NN = os.path.join(BIN, "test_nn")

STEPS = 4
SHAPE = (7, 5)
LR = 0.05


def run_dlrec(options, w, grads, lr):
    if not os.path.exists(TEST_NN):
        pytest.skip(f"{TEST_NN} not built")
    with tempfile.TemporaryDirectory() as d:
        case = os.path.join(d, "case.json")
        out = os.path.join(d, "out.json")
        with open(case, "w") as f:
            json.dump({"options": options, "lr": lr, "shape": list(SHAPE),
                       "w": w.flatten().tolist(), "grads": [g.flatten().tolist() for g in grads]}, f)
        env = dict(os.environ, DLREC_OPT_CASE=case, DLREC_OPT_OUT=out)
        r = subprocess.run([TEST_NN, "--gtest_filter=OptimizerTorch.StepsFromFile"], env=env,
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(out) as f:
            return torch.tensor(json.load(f)["w"], dtype=torch.float32).reshape(SHAPE)


def run_torch(make_opt, w, grads, clip_norm=0.0, clip_value=0.0):
    p = torch.nn.Parameter(w.clone())
    opt = make_opt([p])
    for g in grads:
        opt.zero_grad()
        p.grad = g.clone()
        if clip_norm > 0:
            torch.nn.utils.clip_grad_norm_([p], clip_norm)
        if clip_value > 0:
            torch.nn.utils.clip_grad_value_([p], clip_value)
        opt.step()
    return p.detach()


CASES = {
    "sgd": ({"type": "sgd"}, lambda ps: torch.optim.SGD(ps, lr=LR), {}),
    "sgd_momentum": ({"type": "sgd", "momentum": 0.9},
                     lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.9), {}),
    "sgd_nesterov_wd": ({"type": "sgd", "momentum": 0.8, "nesterov": True, "weight_decay": 0.01},
                        lambda ps: torch.optim.SGD(ps, lr=LR, momentum=0.8, nesterov=True,
                                                   weight_decay=0.01), {}),
    "sgd_clip_norm": ({"type": "sgd", "clip_norm": 1.0}, lambda ps: torch.optim.SGD(ps, lr=LR),
                      {"clip_norm": 1.0}),
    "sgd_clip_value": ({"type": "sgd", "clip_value": 0.3}, lambda ps: torch.optim.SGD(ps, lr=LR),
                       {"clip_value": 0.3}),
    "adagrad": ({"type": "adagrad", "adagrad_init": 0.1, "adagrad_eps": 1e-10},
                lambda ps: torch.optim.Adagrad(ps, lr=LR, initial_accumulator_value=0.1, eps=1e-10), {}),
    "adam": ({"type": "adam", "beta1": 0.85, "beta2": 0.99, "adam_eps": 1e-7},
             lambda ps: torch.optim.Adam(ps, lr=LR, betas=(0.85, 0.99), eps=1e-7), {}),
    "adamw": ({"type": "adam", "weight_decay": 0.1},
              lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.1), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(name):
    options, make_opt, clip = CASES[name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    w = torch.randn(SHAPE, generator=gen)
    grads = [torch.randn(SHAPE, generator=gen) * 2 for _ in range(STEPS)]
    expected = run_torch(make_opt, w, grads, **clip)
    got = run_dlrec(options, w, grads, LR)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, w), "the optimizer did not move the weights"


def test_rowwise_adagrad_matches_its_definition():
    """Row-wise Adagrad has no torch.optim class: compare with its formula written in torch."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(SHAPE, generator=gen)
    grads = [torch.randn(SHAPE, generator=gen) for _ in range(STEPS)]
    ref = w.clone().double()
    acc = torch.full((SHAPE[0], 1), 0.01, dtype=torch.float64)
    for g in grads:
        g = g.double()
        acc += (g * g).mean(dim=1, keepdim=True)
        ref -= LR * g / (acc.sqrt() + 1e-8)
    got = run_dlrec({"type": "rowwise_adagrad", "adagrad_init": 0.01}, w, grads, LR)
    torch.testing.assert_close(got, ref.float(), rtol=1e-5, atol=1e-6)
