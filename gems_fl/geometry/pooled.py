"""Points that fit the labels of all nodes, from sums of their statistics.

With every node's Gram matrix ``G_k = X~_k^T X~_k / n_k`` and label moments
``M_k = Y_k^T X~_k / n_k`` (one-hot ``Y``), the server holds the pooled problem of all
nodes' training data without any row of it:

    f(W) = (1/N) sum_k ||X~_k W^T - Y_k||^2 + ridge ||W||^2
         = tr(W A W^T) - 2 tr(B W^T) + const,   A = sum_k (n_k/N) G_k + ridge I,
                                                 B = sum_k (n_k/N) M_k.

:func:`pooled_point` is its minimiser ``W = B A^-1``: the ridge least-squares classifier
of the pooled data, whatever the split (the analytic one-shot family: Fed3R, AFL,
FedCGS). :func:`best_point` minimises ``f`` over the models that lie in every node's
good-enough space ``tr((W - W_k) G_k (W - W_k)^T) <= rho_k^2``: for multipliers
``mu >= 0`` the Lagrangian's minimiser is again closed form,

    W(mu) = (B + sum_k mu_k W_k G_k)(A + sum_k mu_k G_k)^-1,

and the concave dual ``g(mu)`` (gradient ``q_k(W(mu)) - rho_k^2``) is maximised with
L-BFGS-B over ``mu >= 0``. The result is then made feasible exactly: if rounding leaves
it just outside some space, it moves toward a point known to lie in all of them (the
minimax point) by the smallest step that brings it inside.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from scipy.optimize import minimize

from gems_fl.geometry._linalg import _solve_right
from gems_fl.geometry.gram import expanded_sq_distances
from gems_fl.geometry.spaces import GramSpace, within_radius

_MAX_ITER = 200


def _normalised(num_train: Sequence[float]) -> np.ndarray:
    n = np.asarray(num_train, dtype=np.float64)
    if n.ndim != 1 or not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise ValueError(f"num_train must hold one positive count per node; got {n.tolist()}")
    return n / n.sum()


def pooled_gram(grams: Sequence[np.ndarray], num_train: Sequence[float]) -> torch.Tensor:
    """``sum_k (n_k / N) G_k``, float64 torch, summed one node at a time (no stack of K
    matrices)."""
    w = _normalised(num_train)
    return sum(float(wk) * torch.as_tensor(g, dtype=torch.float64) for wk, g in zip(w, grams))


def pooled_system(grams: Sequence[np.ndarray], moments: Sequence[np.ndarray],
                  num_train: Sequence[float], ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` of the pooled problem (see the module docstring), float64 torch."""
    if not grams or len(grams) != len(moments):
        raise ValueError(f"got {len(grams)} Gram matrices and {len(moments)} label moments; "
                         "pass one of each per node")
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be finite and >= 0; got {ridge}")
    w = _normalised(num_train)
    a = pooled_gram(grams, num_train)
    b = sum(float(wk) * torch.as_tensor(m, dtype=torch.float64) for wk, m in zip(w, moments))
    if a.shape[0] != b.shape[1]:
        raise ValueError(f"label moments have {b.shape[1]} columns; the Gram matrices are "
                         f"{a.shape[0]} x {a.shape[0]}")
    a = 0.5 * (a + a.T)
    a.diagonal().add_(float(ridge))
    return a, b


def pooled_point(grams: Sequence[np.ndarray], moments: Sequence[np.ndarray],
                 num_train: Sequence[float], ridge: float = 1e-3) -> np.ndarray:
    """The pooled ridge least-squares classifier ``B A^-1``, shape ``(C, d + 1)``.

    ``grams`` ``(d + 1, d + 1)`` and ``moments`` ``(C, d + 1)`` per node (means over
    its rows), ``num_train`` its row count; ``ridge`` is relative to one mean Gram matrix.
    """
    a, b = pooled_system(grams, moments, num_train, ridge)
    return _solve_right(a, b).numpy()


ABSENT_CLASS_BIAS = -30.0  # a class no node holds: never predicted (log-prior of ~1e-13)


def pooled_lda(grams: Sequence[np.ndarray], moments: Sequence[np.ndarray],
               num_train: Sequence[float], shrinkage: float = 1e-2) -> np.ndarray:
    """The pooled linear discriminant (LDA) classifier, shape ``(C, d + 1)``.

    From the same sums as :func:`pooled_point`: the pooled class priors ``pi_c`` and
    class means ``mu_c`` (the label moments' last column and rows), and the within-class
    covariance ``S_w = E[x x^T] - sum_c pi_c mu_c mu_c^T`` (the Gram matrix's top-left
    block less the between-class part). With ``A = S_w + shrinkage * tr(S_w) / d * I``,
    class ``c`` scores ``x^T A^-1 mu_c - mu_c^T A^-1 mu_c / 2 + log pi_c``: the Bayes rule
    for Gaussian classes with a shared covariance (FedCGS's global statistics give the
    same classifier). Unlike least squares on one-hot targets it does not mask classes
    between others, which is worth a few tenths of a point on Fashion-MNIST.
    """
    if not (math.isfinite(shrinkage) and shrinkage >= 0):
        raise ValueError(f"shrinkage must be finite and >= 0; got {shrinkage}")
    a, b = pooled_system(grams, moments, num_train, 0.0)
    d = a.shape[0] - 1
    prior = b[:, d].clamp(min=0.0)
    held = prior > 0
    mu = torch.zeros_like(b[:, :d])
    mu[held] = b[held, :d] / prior[held, None]
    within = a[:d, :d] - (mu.T * prior) @ mu
    within = 0.5 * (within + within.T)
    within.diagonal().add_(float(shrinkage) * float(torch.trace(within).clamp(min=0.0)) / d)
    weight = _solve_right(within, mu)
    bias = torch.full((len(prior),), ABSENT_CLASS_BIAS, dtype=torch.float64)
    bias[held] = -0.5 * (weight[held] * mu[held]).sum(dim=1) + torch.log(prior[held])
    weight[~held] = 0.0
    return torch.cat([weight, bias[:, None]], dim=1).numpy()


def best_point(
    centers: Sequence[np.ndarray], grams: Sequence[np.ndarray], radii: Sequence[float],
    moments: Sequence[np.ndarray], num_train: Sequence[float], *, ridge: float = 1e-3,
    feasible: np.ndarray | None = None, max_iter: int = _MAX_ITER,
) -> tuple[np.ndarray, dict]:
    """The model of best pooled fit among those inside every node's Gram space.

    Parameters
    ----------
    centers : per node, ``W_k`` ``(C, d + 1)``.
    grams : per node, ``G_k`` ``(d + 1, d + 1)``.
    radii : per node, ``rho_k > 0`` (logit units).
    moments, num_train, ridge : the pooled problem (:func:`pooled_point`).
    feasible : a point inside every space (e.g. the minimax point), used to make the
        result exactly feasible; None: the result is returned as the dual gives it.

    Returns
    -------
    (W, info) : ``W`` ``(C, d + 1)``; ``info`` holds ``multipliers`` (per node),
        ``iterations``, ``pooled_inside`` (the pooled point already lay in every space,
        so it is the answer) and ``blend`` (the step toward ``feasible``, 0 if none).
    """
    r = np.asarray(radii, dtype=np.float64)
    if len(centers) != len(grams) or r.shape != (len(grams),) or np.any(~(r > 0)):
        raise ValueError("best_point needs one center, Gram matrix and radius > 0 per node")
    a0, b0 = pooled_system(grams, moments, num_train, ridge)
    gs = [torch.as_tensor(g, dtype=torch.float64) for g in grams]
    ws = [torch.as_tensor(c, dtype=torch.float64) for c in centers]
    hs = [wk @ gk for wk, gk in zip(ws, gs)]  # W_k G_k
    cs = [float((hk * wk).sum()) for hk, wk in zip(hs, ws)]  # tr(W_k G_k W_k^T)
    r2 = r ** 2

    def solve(mu: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        a, b = a0.clone(), b0.clone()
        for m, gk, hk in zip(mu.tolist(), gs, hs):
            if m > 0.0:
                a.add_(gk, alpha=m)
                b.add_(hk, alpha=m)
        w = _solve_right(0.5 * (a + a.T), b)
        return w, np.array(expanded_sq_distances(w, gs, hs, cs))

    def negative_dual(mu: np.ndarray) -> tuple[float, np.ndarray]:
        w, q = solve(mu)
        fit = float(((w @ a0) * w).sum()) - 2.0 * float((b0 * w).sum())
        return -(fit + float(mu @ (q - r2))), -(q - r2)

    info: dict = {"iterations": 0, "blend": 0.0}
    w0, q0 = solve(np.zeros(len(gs)))
    info["pooled_inside"] = bool(np.all(within_radius(np.sqrt(q0), r)))
    if info["pooled_inside"]:
        info["multipliers"] = [0.0] * len(gs)
        return w0.numpy(), info
    res = minimize(negative_dual, np.zeros(len(gs)), jac=True, method="L-BFGS-B",
                   bounds=[(0.0, None)] * len(gs), options={"maxiter": max_iter})
    mu = np.maximum(res.x, 0.0)
    w, q = solve(mu)
    info["iterations"] = int(res.nit)
    info["multipliers"] = [float(v) for v in mu]
    # Decide with the distances GramSpace.contains computes: the expanded q above can
    # round a boundary point inside that the membership check puts outside.
    if feasible is not None and not _inside_all(w, ws, gs, r):
        w, info["blend"] = _blend_inside(w, torch.as_tensor(feasible, dtype=torch.float64),
                                         ws, gs, r)
    return w.numpy(), info


def _inside_all(p: torch.Tensor, ws, gs, r: np.ndarray) -> bool:
    """Whether ``p`` lies in every space, by the membership check itself
    (:meth:`GramSpace.contains`), which the aggregation reports."""
    x = p.numpy().reshape(-1)
    return all(GramSpace(wk.numpy(), gk.numpy(), float(rk)).contains(x)
               for wk, gk, rk in zip(ws, gs, r))


def _blend_inside(w: torch.Tensor, inside: torch.Tensor, ws, gs,
                  r: np.ndarray) -> tuple[torch.Tensor, float]:
    """``(1 - t) w + t inside`` for the smallest ``t`` in ``[0, 1]`` that lies in every
    space (``inside`` lies in all of them). Along the segment each node's squared
    distance is a convex quadratic ``a t^2 + b t + c``; its constraint holds from its
    smaller root on, so ``t`` is the largest of those roots: closed form, three quadratic
    forms per node. Rounding is absorbed by nudging ``t`` up until the check passes."""
    d = inside - w
    lows = [0.0]
    for wk, gk, rk in zip(ws, gs, r.tolist()):
        e = w - wk
        dg = d @ gk
        qa, qb = float((dg * d).sum()), 2.0 * float((dg * e).sum())
        qc = float(((e @ gk) * e).sum()) - rk * rk
        if qc <= 0.0 or qa <= 0.0:
            continue
        lows.append((-qb - math.sqrt(max(qb * qb - 4.0 * qa * qc, 0.0))) / (2.0 * qa))
    t = min(max(lows), 1.0)

    while t < 1.0 and not _inside_all(w + t * d, ws, gs, r):
        t = min(1.0, t + (1.0 - t) * 1e-6 + 1e-12)
    return w + t * d, t
