"""The gaussian point's softmax fit: preconditioned (the project's) against plain L-BFGS.

    python3 benchmarks/gaussian_fit.py [--out benchmarks/out/gaussian_fit.json]

The class means and covariances of Fashion-MNIST's 60,000 training images (what the
server's sums give whatever the split) go through :func:`gems_fl.geometry.virtual.
gaussian_point` at each L2 penalty of ``GAUSSIAN_L2S``, once with the project's fit
(L-BFGS in the whitened eigenbasis of the rows' covariance, ``FIT_ITERATIONS``) and once
with plain L-BFGS in standardised coordinates (the fit before, 300 iterations). Prints
per fit the penalised training loss on the virtual rows, the test accuracy on the 10,000
official test images and the seconds, on the thread count of the run's policy (1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from unittest import mock

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from gems_fl.data.datasets import DEFAULT_FASHION_MNIST_DIR  # noqa: E402
from gems_fl.data.idx import read_idx  # noqa: E402
from gems_fl.geometry import virtual  # noqa: E402
from gems_fl.geometry.choices import GAUSSIAN_L2S  # noqa: E402
from gems_fl.learning.threads import compute_threads  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks" / "out" / "gaussian_fit.json")
    args = parser.parse_args()
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
    fits = {"preconditioned": virtual.fit_softmax, "plain-300": plain_fit}
    seen = {}

    def recording(fit):
        def wrapped(xv, yv, c, *, l2, iterations=None):
            ws = fit(xv, yv, c, l2=l2)
            logits = xv.double() @ torch.as_tensor(ws[:, :-1]).T + torch.as_tensor(ws[:, -1])
            seen["loss"] = float(torch.nn.functional.cross_entropy(logits, yv)
                                 + l2 * float((ws[:, :-1] ** 2).sum()))
            return ws
        return wrapped

    rows = []
    print(f"{'fit':>15} {'L2':>7} {'loss':>8} {'test acc':>8} {'seconds':>8}")
    with compute_threads():
        for name, fit in fits.items():
            for l2 in GAUSSIAN_L2S:
                with mock.patch.object(virtual, "fit_softmax", recording(fit)):
                    t0 = time.perf_counter()
                    w = virtual.gaussian_point(counts, means, covs, l2=l2, seed=0)
                    seconds = time.perf_counter() - t0
                acc = float(np.mean(np.argmax(test_x @ w[:, :-1].T + w[:, -1], 1) == test_y))
                rows.append({"fit": name, "l2": l2, "loss": seen["loss"],
                             "test_accuracy": acc, "seconds": seconds})
                print(f"{name:>15} {l2:>7.0e} {seen['loss']:>8.5f} {acc:>8.4f} {seconds:>8.1f}",
                      flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"fits": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
