"""The gaussian point's softmax fit: the project's, the same with autograd's gradient, and
plain L-BFGS.

    python3 benchmarks/gaussian_fit.py [--fits now,autograd,plain-300]
                                       [--out results/benchmarks/gaussian_fit.json]

The class means and covariances of Fashion-MNIST's 60,000 training images (what the
server's sums give whatever the split) go through :func:`gems_fl.geometry.virtual.
gaussian_point` at each L2 penalty of ``GAUSSIAN_L2S``, in the order and with the shared
draw of the selection round's candidates. Fits:

- ``now``: the project's (L-BFGS in the whitened eigenbasis of the rows' covariance,
  ``FIT_ITERATIONS``, the loss's gradient written out);
- ``autograd``: the same fit with the gradient left to autograd (the fit before);
- ``plain-300``: plain L-BFGS in standardised coordinates, 300 iterations (before the
  preconditioning).

Prints per fit the penalised training loss on the virtual rows, the test accuracy on the
10,000 official test images and the seconds,
on the thread count of the run's policy (1); the seconds are the fit's, the draw (made
once, shared by every fit) is timed apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--fits", "now"]]

from gems_fl.data.datasets import DEFAULT_FASHION_MNIST_DIR
from gems_fl.data.idx import read_idx
from gems_fl.geometry import virtual
from gems_fl.geometry.choices import GAUSSIAN_L2S
from gems_fl.learning.threads import compute_threads


def plain_fit(x: torch.Tensor, y: torch.Tensor, num_classes: int, *, l2: float,
              iterations: int = 300) -> np.ndarray:
    """The fit before preconditioning: L-BFGS on ``x`` as given."""
    w = torch.zeros(num_classes, x.shape[1] + 1, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=iterations, history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-9,
                            tolerance_change=1e-12)

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(x @ w[:, :-1].T + w[:, -1], y) \
            + l2 * (w[:, :-1] ** 2).sum()
        value.backward()
        return value

    opt.step(loss)
    return w.detach().double().numpy()


def autograd_fit(rows, *, l2: float, iterations: int) -> np.ndarray:
    """The project's preconditioned fit with autograd's gradient (the fit before)."""
    def autograd_loss_and_gradient(u, z, onehot, s, penalty):
        with torch.enable_grad():
            leaf = u.detach().requires_grad_(True)
            value = torch.nn.functional.cross_entropy(
                z @ (leaf[:, :-1] * s).T + leaf[:, -1], onehot.argmax(1)) \
                + (leaf[:, :-1] ** 2 * penalty).sum()
            value.backward()
        return value.detach(), leaf.grad

    with mock.patch.object(virtual, "softmax_loss_and_gradient", autograd_loss_and_gradient):
        return virtual._fit_prepared(rows, l2=l2, iterations=iterations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fits", default="now,autograd,plain-300",
                        help="comma-separated: now, autograd, plain-300")
    parser.add_argument("--out", type=Path, default=Path(default_out("gaussian_fit")))
    args = parser.parse_args()
    names = [f.strip() for f in args.fits.split(",") if f.strip()]
    unknown = sorted(set(names) - {"now", "autograd", "plain-300"})
    if unknown:
        parser.error(f"unknown fits {unknown}; choose from now, autograd, plain-300")
    folder = Path(DEFAULT_FASHION_MNIST_DIR)

    def images(name: str) -> np.ndarray:
        raw = read_idx(folder / f"{name}-images-idx3-ubyte.gz")
        return raw.reshape(len(raw), -1).astype(np.float64) / 255.0

    x, y = images("train"), read_idx(folder / "train-labels-idx1-ubyte.gz").astype(int)
    test_x, test_y = images("t10k"), read_idx(folder / "t10k-labels-idx1-ubyte.gz")
    classes = int(y.max()) + 1
    counts = np.bincount(y, minlength=classes).astype(np.float64)
    means = np.stack([x[y == c].mean(0) for c in range(classes)])
    covs = np.stack([np.cov(x[y == c].T, bias=True) for c in range(classes)])
    rows = []
    print(f"{'fit':>10} {'L2':>7} {'loss':>8} {'test acc':>8} {'seconds':>8}")
    with compute_threads() as threads:
        virtual.forget_draw()
        t0 = time.perf_counter()
        draw = virtual._virtual_draw(counts, means, covs, seed=0, rows=virtual.MAX_VIRTUAL_ROWS,
                                     shrinkage=virtual.COVARIANCE_SHRINKAGE, classes=None,
                                     num_classes=None)
        draw_seconds = time.perf_counter() - t0
        print(f"the draw: {draw_seconds:.1f} s")
        prepared = draw.rows
        standard = prepared.rotated @ prepared.basis.T.float() + prepared.centre.float()
        for name in names:
            for l2 in GAUSSIAN_L2S:
                t0 = time.perf_counter()
                if name == "now":  # as the run calls it (the draw is made once, above)
                    w = virtual.gaussian_point(counts, means, covs, l2=l2, seed=0)
                elif name == "autograd":
                    w = virtual.unstandardise(autograd_fit(
                        prepared, l2=l2, iterations=virtual.FIT_ITERATIONS), draw.mean, draw.scale)
                else:
                    w = virtual.unstandardise(plain_fit(standard, prepared.labels, classes, l2=l2),
                                              draw.mean, draw.scale)
                seconds = time.perf_counter() - t0
                # the penalised loss on the virtual rows, in the standardised units the
                # penalty is stated in
                ws = np.concatenate([w[:, :-1] * draw.scale,
                                     (w[:, -1] + w[:, :-1] @ draw.mean)[:, None]], axis=1)
                logits = standard.double() @ torch.as_tensor(ws[:, :-1]).T + torch.as_tensor(ws[:, -1])
                loss = float(torch.nn.functional.cross_entropy(logits, prepared.labels)
                             + l2 * float((ws[:, :-1] ** 2).sum()))
                acc = float(np.mean(np.argmax(test_x @ w[:, :-1].T + w[:, -1], 1) == test_y))
                rows.append({"fit": name, "l2": l2, "loss": loss, "test_accuracy": acc,
                             "seconds": seconds})
                print(f"{name:>10} {l2:>7.0e} {loss:>8.5f} {acc:>8.4f} {seconds:>8.1f}", flush=True)
    write_envelope("gaussian_fit", args.out,
                   {"fits": rows, "draw_seconds": draw_seconds, "threads": threads})


if __name__ == "__main__":
    main()
