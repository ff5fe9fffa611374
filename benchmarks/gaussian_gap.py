"""How much the ``gaussian`` point loses to the Gaussian model of each class, and what
cheaper class statistics would keep.

    python3 benchmarks/gaussian_gap.py --seed 0 --division paper:5
    python3 benchmarks/gaussian_gap.py --seed 2 --division paper:5 --mlp RUN/gems_model.npz

The pooled training rows of the division's nodes (Fashion-MNIST, ``gems_fl.data``) give
each class's exact count, mean and covariance (what the summed class Gram matrices give
the server). For each way of forming the class covariances, the softmax layer is fitted
by :func:`gems_fl.geometry.virtual.gaussian_point` at each of ``GAUSSIAN_L2S`` and scored
on the test set; ``logistic`` is the same L-BFGS fit on the real pooled rows (the
pooled logistic model that a Gaussian per class approximates). Covariances:

- ``full``: each class's own (the ``gaussian`` point with ``class-grams=true``);
- ``shared``: the pooled within-class covariance for every class (LDA's);
- ``lowrank:R``: each node's class covariance cut to its top R eigenpairs plus its
  residual diagonal, summed over nodes (a per-node factor form on the wire);
- ``project:P``: the shared covariance plus each class's deviation from it inside the
  top P eigenvectors of the shared one (a basis the server would send).

With ``--mlp NPZ`` (a run's ``gems_model.npz``, one hidden layer, trained on the same
seed and division) the rows are that model's hidden features instead, and only ``full``
and ``logistic`` are scored. Test accuracies here are for understanding the point, not
for choosing it: runs choose on the nodes' validation data. Prints a table and writes
JSON (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--division", "paper:3", "--forms", "full", "shared"]]

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.geometry.choices import GAUSSIAN_L2S
from gems_fl.geometry.virtual import fit_softmax, gaussian_point, standard_scale, unstandardise


def logistic_fit(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float) -> np.ndarray:
    """The softmax layer fitted to real rows, as ``gaussian_point`` fits virtual ones
    (standardised, the same penalty and L-BFGS fit, mapped back)."""
    mean, scale = x.mean(0), standard_scale(x.std(0))
    ws = fit_softmax(torch.as_tensor((x - mean) / scale, dtype=torch.float32),
                     torch.as_tensor(y, dtype=torch.long), num_classes, l2=l2)
    return unstandardise(ws, mean, scale)


def covariances(kind: str, nodes: list, counts, means, covs) -> np.ndarray:
    c, d = means.shape
    shared = np.einsum("c,cij->ij", counts, covs) / counts.sum()
    if kind == "full":
        return covs
    if kind == "shared":
        return np.repeat(shared[None], c, axis=0)
    name, value = kind.split(":")
    if name == "project":
        vecs = np.linalg.eigh(shared)[1][:, ::-1][:, :int(value)]
        proj = vecs @ vecs.T
        return np.stack([shared + proj @ (covs[k] - shared) @ proj for k in range(c)])
    if name == "lowrank":
        r, out = int(value), np.zeros((c, d, d))
        for x, y in nodes:
            for k in np.unique(y):
                xk = x[y == k]
                mk = xk.mean(0)
                ck = np.cov(xk.T, bias=True) if len(xk) > 1 else np.zeros((d, d))
                lam, vecs = np.linalg.eigh(ck)
                lam, vecs = lam[::-1][:r], vecs[:, ::-1][:, :r]
                approx = (vecs * lam) @ vecs.T
                approx += np.diag(np.clip(np.diag(ck) - np.diag(approx), 0.0, None))
                out[k] += len(xk) * (approx + np.outer(mk - means[k], mk - means[k]))
        return out / counts[:, None, None]
    raise ValueError(f"unknown covariance form {kind!r}: use full, shared, lowrank:R or "
                     "project:P")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--division", default="paper:5", help="DIVISION:NODES")
    parser.add_argument("--forms", nargs="+",
                        default=["full", "shared", "lowrank:25", "lowrank:50", "project:100"])
    parser.add_argument("--mlp", type=Path, help="a run's gems_model.npz (one hidden layer)")
    parser.add_argument("--out", type=Path, default=Path(default_out("gaussian_gap")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    spec, k = args.division.rsplit(":", 1)
    splits = load_dataset(args.dataset, seed=args.seed)
    division = parse_division(spec, int(k), splits.num_classes)
    nodes = [node_data(splits, division, i, args.seed)[:2] for i in range(int(k))]
    nodes = [(np.asarray(x, np.float64), np.asarray(y)) for x, y in nodes]
    test_x = np.asarray(splits.test_x, np.float64)
    forms = args.forms
    if args.mlp:
        model = np.load(args.mlp)
        w1, b1 = model["hidden.0.weight"].astype(np.float64), model["hidden.0.bias"].astype(np.float64)
        nodes = [(np.maximum(x @ w1.T + b1, 0.0), y) for x, y in nodes]
        test_x = np.maximum(test_x @ w1.T + b1, 0.0)
        forms = ["full"]
    x = np.vstack([x for x, _ in nodes])
    y = np.concatenate([y for _, y in nodes])
    c = splits.num_classes
    counts = np.bincount(y, minlength=c).astype(np.float64)
    means = np.stack([x[y == j].mean(0) for j in range(c)])
    covs = np.stack([np.cov(x[y == j].T, bias=True) for j in range(c)])

    def accuracy(w: np.ndarray) -> float:
        return float(((test_x @ w[:, :-1].T + w[:, -1]).argmax(1) == splits.test_y).mean())

    rows = []
    for form in [*forms, "logistic"]:
        t0 = time.perf_counter()
        if form == "logistic":
            acc = [accuracy(logistic_fit(x, y, c, l2)) for l2 in GAUSSIAN_L2S]
        else:
            cov = covariances(form, nodes, counts, means, covs)
            acc = [accuracy(gaussian_point(counts, means, cov, l2=l2, seed=args.seed))
                   for l2 in GAUSSIAN_L2S]
        rows.append({"form": form, "test": dict(zip(map(str, GAUSSIAN_L2S), acc)),
                     "seconds": time.perf_counter() - t0})
        print(f"{form}: " + ", ".join(f"L2 {l2:g} {a:.4f}" for l2, a in zip(GAUSSIAN_L2S, acc)),
              flush=True)
    write_envelope("gaussian_gap", args.out, {"division": args.division,
                                              "features": "mlp" if args.mlp else "pixels",
                                              "rows": rows}, seeds=[args.seed])
    print("\n| rows | " + " | ".join(f"L2 {l2:g}" for l2 in GAUSSIAN_L2S) + " |")
    print("| --- | " + " | ".join("---" for _ in GAUSSIAN_L2S) + " |")
    for r in rows:
        print(f"| {r['form']} | " + " | ".join(f"{a:.4f}" for a in r["test"].values()) + " |")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
