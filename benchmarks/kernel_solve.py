"""What an exact solve of a kernel site's problem costs, against the epochs a run uses.

    python3 benchmarks/kernel_solve.py --sites 3 1

A design study for issue 63's first item on the kernel model, where ``local-solve=auto``
still trains by Adam's epochs. Each site of a Dirichlet(0.1) K=5 division of
Fashion-MNIST (seed 0) is mapped to kernel features built as a run builds them (class
centres of each site as landmarks, picked as ``benchmarks/kernel.py central`` picks them,
4,000 asked: 3,393 kept at seed 0, as many as a run of the division keeps; the rows
beside scaled as a run scales them), then fitted three ways on one thread, as a node fits:

- ``adam``: the run's recipe (the paper's Adam epochs with early stopping);
- ``lbfgs``: the product's exact solve (``gems_fl.learning.exact``: L-BFGS preconditioned
  by Böhning's bound from the site's Gram matrix), to its tolerance (no gradient entry
  above 1e-4);
- ``newton-cg``: a candidate studied here, not in the product: truncated Newton whose
  conjugate-gradient steps are preconditioned by the curvature of the current model in
  the top ``--rank`` eigendirections of the site's Gram matrix (each row weighted by
  twice its largest ``p (1 - p)``, a bound on its softmax Hessian), the rest of the
  spectrum by its diagonal; the same objective and tolerance.

Reported per site and fit: seconds, products with the rows (each reads the site's
``N x D`` features once), the largest gradient entry at the end, the objective (mean
cross-entropy plus 1e-3 / 2 ||W||^2) and the accuracy on the site's validation rows.
The Gram matrix and the eigendirections are timed apart (a node builds the first for
its space anyway). Prints a table and writes JSON (results/benchmarks/kernel_solve.json).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--sites", "0", "--landmarks", "60", "--rank", "20"]]
L2 = 1e-3
TOLERANCE = 1e-4


def site_features(dataset: str, landmarks: int, seed: int, nodes: int, alpha: float,
                  sites: list[int]):
    """Each site's ``(x_train, y_train, x_val, y_val)`` on the kernel features, as a run
    of ``model='kernel'`` maps them, and the map."""
    from kernel import site_landmarks

    from gems_fl.data import load_dataset
    from gems_fl.data.kernel_features import KernelFeatures, row_scale
    from gems_fl.data.partition import node_data, parse_division
    from gems_fl.data.random_features import bandwidth_from_stats
    from gems_fl.data.site_files import feature_stats

    splits = load_dataset(dataset, seed=seed)
    marks = site_landmarks(splits, landmarks, seed, alpha=alpha, nodes=nodes)
    x = splits.train_x
    scale = row_scale(float(np.mean(np.einsum("ij,ij->i", x, x))), splits.num_features)
    fmap = KernelFeatures(marks, bandwidth_from_stats([feature_stats(x)]), raw=True,
                          raw_scale=scale)
    parts = parse_division(f"dirichlet:{alpha:g}", nodes, splits.num_classes)
    for site in sorted(set(sites)):
        x_tr, y_tr, x_val, y_val = node_data(splits, parts, site, seed)
        yield site, fmap, splits.num_classes, (fmap.transform(x_tr), y_tr, fmap.transform(x_val), y_val)


class Counted:
    """The objective, its gradient and Hessian products, counting the products with the
    rows (float32 products, float64 elsewhere, as the product's exact solve does)."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        import torch
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
        self.xa = torch.cat([xt, torch.ones(len(xt), 1)], dim=1)
        self.y = torch.as_tensor(np.asarray(y), dtype=torch.long)
        self.products = 0

    def value(self, w):
        import torch
        n = len(self.y)
        log_p = torch.log_softmax((self.xa @ w.float().T).double(), dim=1)
        p = log_p.exp()
        residual = p.clone()
        residual[torch.arange(n), self.y] -= 1.0
        grad = (residual.float().T @ self.xa).double() / n + L2 * w
        self.products += 2
        loss = -float(log_p.gather(1, self.y[:, None]).sum()) / n
        return loss + 0.5 * L2 * float((w * w).sum()), grad, p

    def hessian_times(self, p, v):
        z = (self.xa @ v.float().T).double()
        pz = p * z
        self.products += 2
        return ((pz - p * pz.sum(1, keepdim=True)).float().T @ self.xa).double() / len(p) + L2 * v


class SubspacePreconditioner:
    """``M^{-1}`` for ``M = (I - 11^T / C) (x) (V A V^T + diag) + l2 I``: ``A`` the rows'
    curvature-weighted Gram matrix in the eigendirections ``V``, the diagonal the rest of
    the spectrum weighted by the rows' mean curvature; the class-mean direction sees
    ``l2`` alone."""

    def __init__(self, projected, vec, rest_diag, curvature):
        import torch
        weighted = projected * curvature.sqrt()[:, None]
        a = weighted.T @ weighted / len(curvature) + L2 * torch.eye(projected.shape[1],
                                                                    dtype=torch.float64)
        self.a_inv = torch.cholesky_inverse(torch.linalg.cholesky(a))
        self.vec = vec
        self.rest = 1.0 / (float(curvature.mean()) * rest_diag + L2)

    def __call__(self, g):
        mean = g.mean(0, keepdim=True)
        centred = g - mean
        along = centred @ self.vec
        rest = (centred - along @ self.vec.T) * self.rest
        rest -= (rest @ self.vec) @ self.vec.T
        return (along @ self.a_inv) @ self.vec.T + rest + mean / L2


def newton_cg(f: Counted, gram, rank: int, num_classes: int) -> tuple[np.ndarray, dict]:
    import torch

    from gems_fl.geometry.gram import top_eigenpairs
    t0 = time.perf_counter()
    lam, vec = top_eigenpairs(torch.as_tensor(gram), rank)
    projected = f.xa.double() @ vec
    rest_diag = (torch.as_tensor(gram).diagonal() - (vec * vec * lam).sum(1)).clamp_min(0)
    eigen_s = time.perf_counter() - t0
    w = torch.zeros(num_classes, f.xa.shape[1], dtype=torch.float64)
    loss, grad, p = f.value(w)
    outer = 0
    while float(grad.abs().max()) > TOLERANCE and outer < 200:
        outer += 1
        precondition = SubspacePreconditioner(projected, vec, rest_diag,
                                              2 * (p * (1 - p)).max(1).values)
        norm = float(grad.norm())
        forcing = min(0.5, norm ** 0.5) * norm
        step_dir, r = torch.zeros_like(grad), -grad
        z = precondition(r)
        d, rz = z.clone(), float((r * z).sum())
        for _ in range(200):
            hd = f.hessian_times(p, d)
            a = rz / float((d * hd).sum())
            step_dir += a * d
            r = r - a * hd
            if float(r.norm()) <= forcing:
                break
            z = precondition(r)
            rz_new = float((r * z).sum())
            d, rz = z + (rz_new / rz) * d, rz_new
        slope, step = float((grad * step_dir).sum()), 1.0
        while True:
            new_loss, new_grad, new_p = f.value(w + step * step_dir)
            if new_loss <= loss + 1e-4 * step * slope or step < 1e-10:
                break
            step *= 0.5
        w, loss, grad, p = w + step * step_dir, new_loss, new_grad, new_p
    return w.numpy(), {"objective": loss, "gradient": float(grad.abs().max()),
                       "newton_steps": outer, "eigen_s": eigen_s}


def fit(how: str, x, y, num_classes: int, gram, rank: int, seed: int) -> tuple[np.ndarray, dict]:
    import torch

    from gems_fl.learning.exact import solve_softmax
    from gems_fl.learning.models import model_to_vector
    from gems_fl.settings import Settings
    from gems_fl.settings.options import node_work
    counted = Counted(x, y)
    if how == "adam":
        work = node_work(Settings(dataset="fashion-mnist", model="kernel", local_solve="adam"))
        torch.manual_seed(seed)
        model = work.training.new_model(x.shape[1], num_classes)
        report = work.training.recipe.train(model, x, y, seed)
        w = model_to_vector(model).reshape(num_classes, -1)
        loss, grad, _ = counted.value(torch.as_tensor(w, dtype=torch.float64))
        return w, {"objective": loss, "gradient": float(grad.abs().max()), "epochs": report.epochs}
    if how == "lbfgs":
        w, report = solve_softmax(x, y, num_classes, l2=L2, tolerance=TOLERANCE, gram=gram)
        return w, {"objective": report.objective, "gradient": report.gradient_norm,
                   "products": 2 * report.iterations, "stopped_by": report.stopped_by}
    w, info = newton_cg(counted, gram, rank, num_classes)
    return w, {**info, "products": counted.products}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--sites", type=int, nargs="+", default=[3, 1])
    parser.add_argument("--fits", nargs="+", default=["adam", "lbfgs", "newton-cg"],
                        choices=["adam", "lbfgs", "newton-cg"])
    parser.add_argument("--landmarks", type=int, default=4000)
    parser.add_argument("--rank", type=int, default=1600,
                        help="newton-cg: eigendirections with the rows' curvature")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=default_out("kernel_solve"))
    args = parser.parse_args()
    from gems_fl.geometry.gram import float32_gram
    from gems_fl.learning.threads import compute_threads

    records = []
    for site, fmap, num_classes, (x, y, xv, yv) in site_features(
            args.dataset, args.landmarks, args.seed, 5, 0.1, args.sites):
        with compute_threads():
            t0 = time.perf_counter()
            gram = float32_gram(x)
            gram_s = time.perf_counter() - t0
            for how in args.fits:
                t0 = time.perf_counter()
                w, info = fit(how, x, y, num_classes, gram, min(args.rank, len(gram) - 1), args.seed)
                seconds = time.perf_counter() - t0
                val = float(np.mean(np.argmax(xv @ w[:, :-1].T + w[:, -1], axis=1) == yv))
                records.append({"site": site, "train_rows": len(y), "dim": fmap.dim,
                                "landmarks": fmap.num_landmarks, "fit": how, "seconds": seconds,
                                "gram_s": gram_s, "val_accuracy": val, **info})
                print(records[-1], flush=True)
                write_envelope("kernel_solve", args.out, records, seeds=[args.seed])
    print_table(["site", "rows", "D", "fit", "s", "products with the rows", "last gradient entry",
                 "objective", "val accuracy"],
                [[r["site"], r["train_rows"], r["dim"], r["fit"], f"{r['seconds']:.1f}",
                  r.get("products", "-"), f"{r['gradient']:.1e}", f"{r['objective']:.5f}",
                  f"{r['val_accuracy']:.4f}"] for r in records], right=3)
    write_envelope("kernel_solve", args.out, records, seeds=[args.seed])
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
