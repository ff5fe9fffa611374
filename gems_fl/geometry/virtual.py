"""The ``gaussian`` point: logistic regression on virtual rows drawn from each class's
pooled Gaussian.

The pooled ridge and LDA points fit least squares or one shared covariance, so they stay
a few points below the pooled logistic model (Fashion-MNIST pixels: 0.815 against 0.845).
With each node's class Gram matrices (``mean over its rows of class c of x~ x~^T``,
:func:`gems_fl.geometry.gram.class_grams`) and class counts the server holds, for every
class, the mean and covariance of that class over all nodes' rows, whatever the split.
:func:`gaussian_point` draws virtual rows from those Gaussians (``MAX_VIRTUAL_ROWS`` in
all, each class in proportion to its count, seeded) and fits the softmax layer to them by
full-batch L-BFGS (preconditioned by the rows' covariance): the "virtual representations"
of CCVR (Luo et al., NeurIPS 2021) and the class statistics of FedCGS (AAAI 2025), here
with no public data and from one round of sums. The fit runs in standardised
coordinates (the pooled mean and standard deviation) and is mapped back.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

#: at most this many virtual rows in all (rows per class in proportion to its count)
MAX_VIRTUAL_ROWS = 50_000
#: L-BFGS iterations of the fit (preconditioned: see :func:`fit_softmax`)
FIT_ITERATIONS = 100
#: the preconditioner adds this times the L2 penalty to each covariance eigenvalue (the
#: penalty's share of the curvature, the softmax loss's own being ~0.1 per unit variance)
PRECONDITION_L2 = 10.0
#: covariance shrinkage toward its mean eigenvalue (a class seen on a few rows)
COVARIANCE_SHRINKAGE = 1e-3


def pooled_class_moments(class_grams: Sequence[np.ndarray], class_counts: Sequence[np.ndarray]
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each class's row count, mean and covariance over all nodes.

    ``class_grams[k]`` ``(m_k, n, n)`` holds node k's matrix for each class it has rows of
    (class order), ``class_counts[k]`` ``(C,)`` its class counts. Returns ``(counts (C,),
    means (C, n - 1), covariances (C, n - 1, n - 1))``, float64; a class no node holds has
    count 0 and zeros.
    """
    if not class_grams or len(class_grams) != len(class_counts):
        raise ValueError(f"got {len(class_grams)} nodes' class Gram matrices and "
                         f"{len(class_counts)} class counts; pass one of each per node")
    num_classes = len(class_counts[0])
    n = np.asarray(class_grams[0]).shape[-1]
    sums = np.zeros((num_classes, n, n))
    counts = np.zeros(num_classes)
    for k, (grams, cnt) in enumerate(zip(class_grams, class_counts)):
        cnt = np.asarray(cnt, dtype=np.float64)
        held = np.flatnonzero(cnt > 0)
        grams = np.asarray(grams, dtype=np.float64)
        if len(cnt) != num_classes or grams.shape != (len(held), n, n):
            raise ValueError(f"node {k}: class Gram matrices {grams.shape} do not match its "
                             f"{len(held)} classes with rows of {num_classes} and size {n}")
        sums[held] += cnt[held, None, None] * grams
        counts += cnt
    seen = counts > 0
    second = np.zeros_like(sums)
    second[seen] = sums[seen] / counts[seen, None, None]
    return counts, *class_statistics(second)


def class_statistics(second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(means (C, n - 1), covariances (C, n - 1, n - 1))`` from each class's mean of
    ``x~ x~^T`` ``(C, n, n)`` (zeros for a class without rows)."""
    means = second[:, -1, :-1]
    covs = second[:, :-1, :-1] - means[:, :, None] * means[:, None, :]
    return means, 0.5 * (covs + np.swapaxes(covs, 1, 2))


def gaussian_point(counts: np.ndarray, means: np.ndarray, covariances: np.ndarray, *,
                   l2: float = 1e-6, seed: int = 0, rows: int = MAX_VIRTUAL_ROWS,
                   shrinkage: float = COVARIANCE_SHRINKAGE,
                   iterations: int = FIT_ITERATIONS, classes: np.ndarray | None = None,
                   num_classes: int | None = None) -> np.ndarray:
    """The softmax layer ``(C, d + 1)`` fitted to virtual rows of the class Gaussians.

    ``counts`` ``(C,)``, ``means`` ``(C, d)`` and ``covariances`` ``(C, d, d)`` as
    :func:`pooled_class_moments` returns them. ``l2`` penalises the weights (not the bias)
    in standardised units; ``seed`` fixes the draw. For a mixture, the Gaussians are
    components (:func:`gems_fl.geometry.components.mixture_moments`): ``classes`` ``(M,)``
    names each one's class, of ``num_classes``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    m, d = np.shape(means)
    if counts.shape != (m,) or np.shape(covariances) != (m, d, d):
        raise ValueError(f"counts {counts.shape}, means {np.shape(means)} and covariances "
                         f"{np.shape(covariances)} must be (M,), (M, d) and (M, d, d)")
    classes = np.arange(m) if classes is None else np.asarray(classes, dtype=np.int64)
    c = m if num_classes is None else int(num_classes)
    if classes.shape != (m,) or (m and (classes.min() < 0 or classes.max() >= c)):
        raise ValueError(f"classes {classes.shape} must name one of {c} classes per Gaussian")
    if not (np.isfinite(l2) and l2 >= 0) or rows < 1 or counts.sum() <= 0:
        raise ValueError(f"l2={l2} must be >= 0, rows={rows} >= 1 and some class must have rows")
    total = counts.sum()
    mean = counts @ np.asarray(means) / total
    spread = (np.einsum("c,cii->i", counts, np.asarray(covariances))
              + counts @ (np.asarray(means) - mean) ** 2) / total
    scale = standard_scale(np.sqrt(np.maximum(spread, 0.0)))
    gen = torch.Generator().manual_seed(int(seed))
    per_class = np.floor(rows * counts / total + 0.5).astype(int)
    xs, ys = [], []
    for k in np.flatnonzero(per_class > 0):
        cov = np.asarray(covariances[k]) / np.outer(scale, scale)
        cov = cov + shrinkage * max(float(np.trace(cov)) / d, 1e-12) * np.eye(d)
        lam, vecs = np.linalg.eigh(0.5 * (cov + cov.T))
        root = torch.as_tensor(vecs * np.sqrt(np.clip(lam, 0.0, None)), dtype=torch.float32)
        z = torch.randn(int(per_class[k]), d, generator=gen)
        centre = torch.as_tensor((means[k] - mean) / scale, dtype=torch.float32)
        xs.append(centre + z @ root.T)
        ys.append(torch.full((int(per_class[k]),), int(classes[k]), dtype=torch.long))
    ws = fit_softmax(torch.cat(xs), torch.cat(ys), c, l2=l2, iterations=iterations)
    return unstandardise(ws, mean, scale)


def standard_scale(std: np.ndarray) -> np.ndarray:
    """Per-feature scales for standardising: ``std``, with 1 for a (near-)constant feature."""
    return np.where(std > 1e-6 * max(float(std.max()), 1e-12), std, 1.0)


def unstandardise(ws: np.ndarray, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """A layer ``(C, d + 1)`` fitted on ``(x - mean) / scale`` as a layer on ``x``."""
    weight = ws[:, :-1] / scale
    return np.concatenate([weight, (ws[:, -1] - weight @ mean)[:, None]], axis=1)


def fit_softmax(x: torch.Tensor, y: torch.Tensor, num_classes: int, *, l2: float,
                iterations: int = FIT_ITERATIONS) -> np.ndarray:
    """The softmax layer ``(C, d + 1)`` minimising the mean cross-entropy on rows ``x``
    ``(N, d)`` float32 with labels ``y`` plus ``l2 ||weight||^2``, by full-batch L-BFGS
    from zero (float64 result, in ``x``'s coordinates).

    L-BFGS runs in the eigenbasis of the rows' covariance, each axis scaled by
    ``1 / sqrt(lambda_j + PRECONDITION_L2 * l2)``: a change of variables, so the objective
    (the penalty mapped with it) and its minimiser are unchanged, but correlated pixels no
    longer make the problem ill-conditioned. On Fashion-MNIST's class Gaussians the fit
    reaches in 100 iterations the loss that 300 unpreconditioned ones reached.
    """
    x64 = x.double()
    mean = x64.mean(0)
    centred = (x64 - mean).float()
    cov = (centred.T @ centred).double() / max(len(x), 1)
    lam, vecs = torch.linalg.eigh(0.5 * (cov + cov.T))
    lam = lam.clamp_min(0.0) + PRECONDITION_L2 * float(l2) \
        + 1e-9 * max(float(lam.mean()), 1e-12)
    axes = vecs / lam.sqrt()  # (d, d): z = (x - mean) @ axes; weight = u @ axes.T
    z = centred @ axes.float()
    penalty = (1.0 / lam).float()  # ||weight||^2 = sum_j ||u_j||^2 / lam_j
    u = torch.zeros(num_classes, x.shape[1] + 1, dtype=torch.float32, requires_grad=True)
    opt = torch.optim.LBFGS([u], max_iter=int(iterations), history_size=20,
                            line_search_fn="strong_wolfe", tolerance_grad=1e-9,
                            tolerance_change=1e-12)

    def loss() -> torch.Tensor:
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(z @ u[:, :-1].T + u[:, -1], y) \
            + float(l2) * ((u[:, :-1] ** 2) * penalty).sum()
        value.backward()
        return value

    opt.step(loss)
    fitted = u.detach().double()
    weight = fitted[:, :-1] @ axes.T
    bias = fitted[:, -1] - weight @ mean
    return torch.cat([weight, bias[:, None]], dim=1).numpy()
