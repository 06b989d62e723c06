#!/usr/bin/env python3
"""PyTorch peer of bench/criteo_sample.sh: the same split (first 8,000 rows train, last 2,000
validate), the same preprocessing as configs/etl_criteo.json (dense: missing -> 0, clip at 0,
log1p; categorical: Categorify with freq_threshold 15 fitted on the training rows, 0 = missing,
1 = rare/unseen, 2.. = vocabulary), the same model (dlrm_small: dim 16, bottom 13-64-16, top
64-1, dot interaction) and training settings (configs/criteo_sample.json: SGD lr 0.3, batch 64,
4 epochs, no shuffling). Prints AUC=<value> for each of several seeds.

    python3 bench/pytorch_criteo_sample.py [path/to/day_0.part.tsv] [--seeds 5]
"""
import argparse
import collections
import math

import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import roc_auc_score
from torch_common import mlp


def load(path):
    rows = [line.rstrip("\n").split("\t") for line in open(path)]
    y = np.array([float(r[0]) for r in rows], dtype=np.float32)
    dense = np.array([[float(v) if v else 0.0 for v in r[1:14]] for r in rows], dtype=np.float32)
    cats = [[r[14 + c] for r in rows] for c in range(26)]
    return y, np.log1p(np.maximum(dense, 0.0)), cats


def categorify(col_train, col_all, threshold):
    counts = collections.Counter(v for v in col_train if v)
    vocab = sorted((k for k, n in counts.items() if n >= threshold), key=lambda k: (-counts[k], k))
    index = {k: i + 2 for i, k in enumerate(vocab)}
    ids = np.array([0 if not v else index.get(v, 1) for v in col_all], dtype=np.int64)
    return ids, len(vocab) + 2


class DLRM(nn.Module):
    def __init__(self, cards, dim=16):
        super().__init__()
        self.bottom = mlp([13, 64, dim], relu_last=True)
        self.embs = nn.ModuleList()
        for c in cards:
            e = nn.Embedding(c, dim)
            nn.init.uniform_(e.weight, -math.sqrt(1.0 / c), math.sqrt(1.0 / c))
            self.embs.append(e)
        n = 1 + len(cards)
        self.li, self.lj = torch.tril_indices(n, n, offset=-1)
        self.top = mlp([dim + n * (n - 1) // 2, 64, 1], relu_last=False)

    def forward(self, dense, ids):
        x = self.bottom(dense)
        z = torch.stack([x] + [e(ids[:, t]) for t, e in enumerate(self.embs)], dim=1)
        zz = torch.bmm(z, z.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat([x, zz], dim=1)).squeeze(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="../shared/data/criteo/day_0.part.tsv")
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    y, dense, cats = load(a.path)
    ntr = 8000
    ids, cards = [], []
    for col in cats:
        i, c = categorify(col[:ntr], col, 15)
        ids.append(i)
        cards.append(c)
    ids = torch.tensor(np.stack(ids, axis=1))
    dense_t, y_t = torch.tensor(dense), torch.tensor(y)
    aucs = []
    for seed in range(a.seeds):
        torch.manual_seed(seed)
        m = DLRM(cards)
        opt = torch.optim.SGD(m.parameters(), lr=0.3)
        loss_fn = nn.BCEWithLogitsLoss()
        for _ in range(4):
            for s in range(0, ntr, 64):
                opt.zero_grad()
                loss_fn(m(dense_t[s:s + 64], ids[s:s + 64]), y_t[s:s + 64]).backward()
                opt.step()
        with torch.no_grad():
            p = torch.sigmoid(m(dense_t[ntr:], ids[ntr:])).numpy()
        aucs.append(roc_auc_score(y[ntr:], p))
        print(f"seed {seed}: AUC={aucs[-1]:.5f}")
    print(f"mean AUC over {a.seeds} seeds: {np.mean(aucs):.5f} (min {np.min(aucs):.5f}, max {np.max(aucs):.5f})")


if __name__ == "__main__":
    main()
