"""Refinement steps computed directly on the pooled data (not through the apps): which
step rule and which L2 penalty reach what accuracy after R steps, on validation and test.

    python3 benchmarks/refinement_offline.py --seeds 0 1 2 3 4

Fashion-MNIST, all training rows of each seed's split pooled: what the nodes' gradients
and Gram matrices sum to, whatever the division, so the steps do not depend on it (only
their start does). Start: the pooled LDA point (shrinkage 1e-2, the point the selection
round keeps most often) scaled by the logit scale with the lowest validation
cross-entropy. Each step rule is the protocol's, with the project's own functions
(``gems_fl.geometry.refine``): every round evaluates the model sent (its pooled loss and
gradient), and the model after the round is what ``Refiner.x`` would be. Rules:
``monotone`` (plain Bohning steps), ``accelerated`` (Nesterov with restart), ``secant``
(the default: steps divided by the secant curvature, a point kept only when the
objective did not rise). ``--l2`` lists the ``refine-l2`` values tried (relative to the
mean diagonal of the pooled Gram matrix). Prints validation and test accuracy after the
last step, the validation choice of ``refine-l2``, and writes the JSON (``--out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--steps", "5", "--methods", "secant", "--l2", "0.001"]]

import numpy as np
import torch

from gems_fl.data import load_dataset
from gems_fl.geometry.gram import gram_matrix, label_moments
from gems_fl.geometry.pooled import pooled_lda
from gems_fl.geometry.refine import (
    bohning_step,
    penalised,
    secant_curvature,
    softmax_gradient,
)
from gems_fl.geometry.selection import TEMPERATURES

RIDGE = 1e-3  # the step's ridge: the pooled ridge the selection round keeps most often


def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(((np.c_[x, np.ones(len(x))] @ w.T).argmax(1) == y).mean())


def refine(start, x, y, gram, method: str, l2_relative: float, steps: int,
           ridge: float = RIDGE):
    """The models after each of ``steps`` rounds of ``method`` (a list of (C, d + 1)) on
    the pooled rows ``x``, ``y`` with the pooled Gram matrix ``gram`` (``ridge``: the
    step's, ``Refiner.ridge``)."""
    l2 = l2_relative * float(np.mean(np.diag(gram)))

    def objective(w):
        gradient, loss = softmax_gradient(w, x, y)
        return penalised(w, loss, gradient, l2)

    models, x_now, x_prev, k, last = [], start, start, 0, np.inf
    good, curvature = None, 1.0
    for _ in range(steps):
        if method == "accelerated" and k > 0:
            sent = x_now + (k - 1) / (k + 2) * (x_now - x_prev)
        elif method == "secant" and good is not None:
            sent = good[0] + (x_now - good[0]) / curvature  # x_now: the plain step from it
        else:
            sent = x_now
        value, gradient = objective(sent)
        if method == "secant":
            if good is None:
                good = (sent, value, gradient)
            elif value <= good[1]:
                curvature = secant_curvature(sent - good[0], gradient - good[2], gram, l2)
                good = (sent, value, gradient)
            else:
                curvature = 1.0
            x_prev, x_now = x_now, bohning_step(good[0], good[2], gram, ridge, l2=l2)
        else:
            x_prev, x_now = x_now, bohning_step(sent, gradient, gram, ridge, l2=l2)
            k = 1 if method == "accelerated" and value > last else k + 1
            last = value
        models.append(x_now)
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--methods", nargs="+", default=["secant", "monotone", "accelerated"])
    parser.add_argument("--l2", type=float, nargs="+", default=[0.0, 3e-4, 1e-3, 3e-3, 1e-2])
    parser.add_argument("--out", type=Path, default=Path(default_out("refinement_offline")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = []
    for seed in args.seeds:
        s = load_dataset(args.dataset, seed=seed)
        gram = gram_matrix(s.train_x)
        lda = pooled_lda([gram], [label_moments(s.train_x, s.train_y, 10)[0]],
                         [len(s.train_y)], 1e-2)
        xv = np.c_[s.val_x, np.ones(len(s.val_x))]
        scale = min(TEMPERATURES, key=lambda t: float(torch.nn.functional.cross_entropy(
            torch.as_tensor(xv @ (t * lda).T), torch.as_tensor(s.val_y))))
        start = scale * lda
        print(f"seed {seed}: LDA start x{scale:g}, test {accuracy(start, s.test_x, s.test_y):.4f}",
              flush=True)
        for method in args.methods:
            for l2 in args.l2:
                models = refine(start, s.train_x, s.train_y, gram, method, l2, args.steps)
                row = {"seed": seed, "method": method, "refine_l2": l2,
                       "start_test": accuracy(start, s.test_x, s.test_y),
                       "test": [accuracy(w, s.test_x, s.test_y) for w in models],
                       "val": accuracy(models[-1], s.val_x, s.val_y)}
                rows.append(row)
                print(f"  {method:<11} l2 {l2:<7g} val {row['val']:.4f} test after steps "
                      f"1/5/{args.steps}: {row['test'][0]:.4f} / {row['test'][4]:.4f} / "
                      f"{row['test'][-1]:.4f}", flush=True)
    summary = []
    print(f"\nMean over seeds {args.seeds} after {args.steps} steps:")
    print("| method | refine-l2 | validation | test |")
    print("| --- | --- | --- | --- |")
    for method in args.methods:
        for l2 in args.l2:
            mine = [r for r in rows if r["method"] == method and r["refine_l2"] == l2]
            entry = {"method": method, "refine_l2": l2,
                     "val": float(np.mean([r["val"] for r in mine])),
                     "test": float(np.mean([r["test"][-1] for r in mine]))}
            summary.append(entry)
            print(f"| {method} | {l2:g} | {entry['val']:.4f} | {entry['test']:.4f} |")
    best = max(summary, key=lambda e: e["val"])
    print(f"\nBest on validation: {best['method']}, refine-l2 {best['refine_l2']:g} "
          f"(test {best['test']:.4f})")
    write_envelope("refinement_offline", args.out,
                   {"steps": args.steps, "ridge": RIDGE, "rows": rows, "summary": summary,
                    "best_on_validation": best}, seeds=args.seeds)
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
