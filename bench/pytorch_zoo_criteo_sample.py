#!/usr/bin/env python3
"""PyTorch peer of bench/zoo_criteo_sample.sh: Wide&Deep, DCNv2 (stacked and parallel) and
DeepFM on the 10,000 Criteo rows, first 8,000 train, last 2,000 validate. The data, the
preprocessing and the training settings are bench/pytorch_criteo_sample.py's (imported from it):
dense log1p(max(x, 0)) with missing -> 0, Categorify freq_threshold 15 on the training rows;
batch 64, 4 epochs in file order, mean BCE, as for DLRM; SGD with lr 0.1 (LR below, chosen with
--holdout: see bench/zoo_criteo_sample.sh). The architectures are those of
configs/criteo_sample_<model>.json, with dlrec's initialisation: embeddings uniform
+-sqrt(1/rows), linear weights N(0, sqrt(2/(in+out))), MLP biases N(0, sqrt(1/out)), cross-layer
biases 0, the wide part's weights and bias 0.

    python3 bench/pytorch_zoo_criteo_sample.py [day_0.part.tsv] [--models wide_deep,dcnv2,...]
        [--seeds 5]

wide_deep_ftrl is Wide&Deep with the paper's optimizers (configs/criteo_sample_wide_deep_ftrl.json):
FTRL-Proximal with L1 for the wide part (its weights and bias; the FTRL class below, written
from McMahan et al. 2013 as dlrec's nn::Optimizer computes it) and Adagrad (eps 1e-8, as
dlrec) for the embeddings and the deep MLP; --wide-lr, --deep-lr and --l1 override the
learning rates and the L1 strength (chosen with --holdout: see bench/zoo_criteo_sample.sh).
Prints "<model> seed <s>: AUC=<v>" per run and "<model> mean AUC=<v>" per model.
"""
import argparse
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import roc_auc_score

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_criteo_sample import categorify, load, mlp  # noqa: E402  (same data and MLP init)

DIM = 16
NUM_DENSE = 13


def xavier_linear(n_in, n_out, bias):
    lin = nn.Linear(n_in, n_out, bias=bias)
    nn.init.normal_(lin.weight, 0.0, math.sqrt(2.0 / (n_in + n_out)))
    if bias:
        nn.init.zeros_(lin.bias)
    return lin


class Embeddings(nn.Module):
    """One table per feature, dim columns (dim 1 and zero init for the wide part)."""

    def __init__(self, cards, dim, zero=False):
        super().__init__()
        self.tables = nn.ModuleList()
        for c in cards:
            e = nn.Embedding(c, dim)
            if zero:
                nn.init.zeros_(e.weight)
            else:
                nn.init.uniform_(e.weight, -math.sqrt(1.0 / c), math.sqrt(1.0 / c))
            self.tables.append(e)

    def forward(self, ids):  # [B, T] -> [B, T, dim]
        return torch.stack([e(ids[:, t]) for t, e in enumerate(self.tables)], dim=1)


class Wide(nn.Module):
    def __init__(self, cards):
        super().__init__()
        self.w = Embeddings(cards, 1, zero=True)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, ids):  # [B, 1]
        return self.w(ids).sum(dim=1) + self.bias


class CrossNet(nn.Module):
    """x_{l+1} = x0 * (U_l V_l x_l + b_l) + x_l (low rank r; full rank when r == 0)."""

    def __init__(self, width, layers, rank):
        super().__init__()
        self.v = nn.ModuleList([xavier_linear(width, rank, False) for _ in range(layers)]) if rank else None
        self.w = nn.ModuleList([xavier_linear(rank or width, width, True) for _ in range(layers)])

    def forward(self, x0):
        x = x0
        for l, w in enumerate(self.w):
            h = self.v[l](x) if self.v is not None else x
            x = x0 * w(h) + x
        return x


class WideDeep(nn.Module):
    def __init__(self, cards):
        super().__init__()
        self.wide = Wide(cards)
        self.emb = Embeddings(cards, DIM)
        self.deep = mlp([NUM_DENSE + len(cards) * DIM, 64, 1], relu_last=False)

    def forward(self, dense, ids):
        e = self.emb(ids).flatten(1)
        return (self.wide(ids) + self.deep(torch.cat([dense, e], dim=1))).squeeze(1)


class DeepFM(nn.Module):
    def __init__(self, cards):
        super().__init__()
        self.first = Wide(cards)
        self.emb = Embeddings(cards, DIM)
        self.deep = mlp([NUM_DENSE + len(cards) * DIM, 64, 1], relu_last=False)

    def forward(self, dense, ids):
        v = self.emb(ids)  # [B, T, d]
        fm = 0.5 * (v.sum(dim=1).pow(2) - v.pow(2).sum(dim=1)).sum(dim=1, keepdim=True)
        deep = self.deep(torch.cat([dense, v.flatten(1)], dim=1))
        return (self.first(ids) + fm + deep).squeeze(1)


class DCNv2(nn.Module):
    def __init__(self, cards, parallel):
        super().__init__()
        self.bottom = mlp([NUM_DENSE, 64, DIM], relu_last=True)
        self.emb = Embeddings(cards, DIM)
        width = (1 + len(cards)) * DIM
        self.cross = CrossNet(width, 3, 64)
        self.parallel = parallel
        if parallel:
            self.deep = mlp([width, 64, 16], relu_last=True)
            self.head = mlp([width + 16, 1], relu_last=False)
        else:
            self.top = mlp([width, 64, 1], relu_last=False)

    def forward(self, dense, ids):
        x0 = torch.cat([self.bottom(dense), self.emb(ids).flatten(1)], dim=1)
        if self.parallel:
            return self.head(torch.cat([self.cross(x0), self.deep(x0)], dim=1)).squeeze(1)
        return self.top(self.cross(x0)).squeeze(1)


class FTRL(torch.optim.Optimizer):
    """FTRL-Proximal, per value: s = (sqrt(n + g^2) - sqrt(n)) / alpha; z += g - s w; n += g^2;
    w = 0 if |z| <= l1 else -(z - sign(z) l1) / ((beta + sqrt(n)) / alpha + l2). A value whose
    gradient is 0 (an embedding row not in the batch) keeps its z and n, and so its weight: the
    dense update equals dlrec's sparse one."""

    def __init__(self, params, lr, beta=1.0, l1=0.0, l2=0.0):
        super().__init__(params, dict(lr=lr, beta=beta, l1=l1, l2=l2))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            alpha, beta, l1, l2 = group["lr"], group["beta"], group["l1"], group["l2"]
            for w in group["params"]:
                if w.grad is None:
                    continue
                st = self.state[w]
                if not st:
                    st["z"] = torch.zeros_like(w)
                    st["n"] = torch.zeros_like(w)
                z, n, g = st["z"], st["n"], w.grad
                n_new = n + g * g
                sigma = (n_new.sqrt() - n.sqrt()) / alpha
                z.add_(g - sigma * w)
                n.copy_(n_new)
                shrunk = z - torch.sign(z) * l1
                w.copy_(torch.where(z.abs() <= l1, torch.zeros_like(w),
                                    -shrunk / ((beta + n.sqrt()) / alpha + l2)))


# Wide&Deep with the paper's optimizers: FTRL (wide) and Adagrad (the rest); the values of
# configs/criteo_sample_wide_deep_ftrl.json.
FTRL_WIDE_LR, FTRL_L1, ADAGRAD_LR = 0.03, 0.001, 0.01


def make_optimizers(name, m, a):
    if name != "wide_deep_ftrl":
        return [torch.optim.SGD(m.parameters(), lr=a.lr or LR[name])]
    wide = list(m.wide.parameters())
    rest = [p for p in m.parameters() if all(p is not q for q in wide)]
    return [FTRL(wide, lr=a.wide_lr or FTRL_WIDE_LR, l1=FTRL_L1 if a.l1 is None else a.l1),
            torch.optim.Adagrad(rest, lr=a.deep_lr or ADAGRAD_LR, eps=1e-8)]


# SGD learning rates (configs/criteo_sample_<model>.json; bench/zoo_criteo_sample.sh says how
# they were chosen).
LR = {"wide_deep": 0.1, "dcnv2": 0.1, "dcnv2_parallel": 0.1, "deepfm": 0.1}

MODELS = {
    "wide_deep": WideDeep,
    "wide_deep_ftrl": WideDeep,
    "dcnv2": lambda cards: DCNv2(cards, parallel=False),
    "dcnv2_parallel": lambda cards: DCNv2(cards, parallel=True),
    "deepfm": DeepFM,
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="../shared/data/criteo/day_0.part.tsv")
    ap.add_argument("--models", default="wide_deep,dcnv2,dcnv2_parallel,deepfm")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    ap.add_argument("--lr", type=float, default=None,
                    help="SGD learning rate (default: each model's, from the configs)")
    ap.add_argument("--wide-lr", type=float, default=None, help="wide_deep_ftrl: FTRL alpha")
    ap.add_argument("--deep-lr", type=float, default=None, help="wide_deep_ftrl: Adagrad lr")
    ap.add_argument("--l1", type=float, default=None, help="wide_deep_ftrl: FTRL L1")
    ap.add_argument("--holdout", action="store_true",
                    help="hyperparameter selection: train on rows 0-5,999, validate on rows "
                         "6,000-7,999 (never reads the validation rows 8,000-9,999)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    y, dense, cats = load(a.path)
    ntr, nend = 8000, len(y)
    if a.holdout:
        ntr, nend = 6000, 8000
        y, dense, cats = y[:nend], dense[:nend], [c[:nend] for c in cats]
    ids, cards = [], []
    for col in cats:
        i, c = categorify(col[:ntr], col, 15)
        ids.append(i)
        cards.append(c)
    ids = torch.tensor(np.stack(ids, axis=1))
    dense_t, y_t = torch.tensor(dense), torch.tensor(y)
    for name in a.models.split(","):
        aucs = []
        for seed in range(a.seeds):
            torch.manual_seed(seed)
            m = MODELS[name](cards)
            opts = make_optimizers(name, m, a)
            loss_fn = nn.BCEWithLogitsLoss()
            for _ in range(4):
                for s in range(0, ntr, 64):
                    for opt in opts:
                        opt.zero_grad()
                    loss_fn(m(dense_t[s:s + 64], ids[s:s + 64]), y_t[s:s + 64]).backward()
                    for opt in opts:
                        opt.step()
            with torch.no_grad():
                p = torch.sigmoid(m(dense_t[ntr:], ids[ntr:])).numpy()
            aucs.append(roc_auc_score(y[ntr:], p) if np.isfinite(p).all() else float("nan"))
            print(f"{name} seed {seed}: AUC={aucs[-1]:.5f}", flush=True)
        print(f"{name} mean AUC={np.mean(aucs):.5f} (min {np.min(aucs):.5f}, max {np.max(aucs):.5f})",
              flush=True)


if __name__ == "__main__":
    main()
