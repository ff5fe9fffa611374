"""Points that fit the labels of all nodes, from sums of their statistics.

With every node's Gram matrix ``G_k = X~_k^T X~_k / n_k`` and label moments
``M_k = Y_k^T X~_k / n_k`` (one-hot ``Y``), the server holds the pooled problem of all
nodes' training data without any row of it:

    f(W) = (1/N) sum_k ||X~_k W^T - Y_k||^2 + ridge ||W||^2
         = tr(W A W^T) - 2 tr(B W^T) + const,   A = sum_k (n_k/N) G_k + ridge I,
                                                 B = sum_k (n_k/N) M_k.

:func:`pooled_point` is its minimiser ``W = B A^-1``: the ridge least-squares classifier
of the pooled data, whatever the split (the analytic one-shot family: Fed3R, AFL,
FedCGS); :func:`pooled_lda` the linear discriminant of the same sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from gems_fl.geometry.linalg import (
    cholesky_solve_right,
    solve_right,
    spectral_solve_right,
    symmetrize_,
)


def _normalised(num_train: Sequence[float]) -> np.ndarray:
    n = np.asarray(num_train, dtype=np.float64)
    if n.ndim != 1 or not np.all(np.isfinite(n)) or np.any(n <= 0):
        raise ValueError(f"num_train must hold one positive count per node; got {n.tolist()}")
    return n / n.sum()


def pooled_gram(grams: Sequence[np.ndarray], num_train: Sequence[float]) -> torch.Tensor:
    """``sum_k (n_k / N) G_k``, float64 torch, summed one node at a time into one
    matrix (no stack of K matrices; the numbers of ``sum(...)`` started from 0)."""
    total = None
    for wk, g in zip(_normalised(num_train), grams):
        part = float(wk) * torch.as_tensor(g, dtype=torch.float64)
        total = part.add_(0) if total is None else total.add_(part)
    return total


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
    symmetrize_(a)
    a.diagonal().add_(float(ridge))
    return a, b


def pooled_point(grams: Sequence[np.ndarray], moments: Sequence[np.ndarray],
                 num_train: Sequence[float], ridge: float = 1e-3) -> np.ndarray:
    """The pooled ridge least-squares classifier ``B A^-1``, shape ``(C, d + 1)``.

    ``grams`` ``(d + 1, d + 1)`` and ``moments`` ``(C, d + 1)`` per node (means over
    its rows), ``num_train`` its row count; ``ridge`` is relative to one mean Gram matrix.
    """
    a, b = pooled_system(grams, moments, num_train, ridge)
    solved = cholesky_solve_right(a, b, overwrite=True)
    if solved is None:  # not positive definite: solve_right's fallback, on A formed again
        solved = solve_right(*pooled_system(grams, moments, num_train, ridge))
    return solved.numpy()


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
    return pooled_ldas(grams, moments, num_train, [shrinkage])[0]


def pooled_ldas(grams: Sequence[np.ndarray], moments: Sequence[np.ndarray],
                num_train: Sequence[float], shrinkages: Sequence[float]) -> list[np.ndarray]:
    """:func:`pooled_lda` at each of ``shrinkages`` from one pooled system. Where ``A`` is
    not numerically positive definite (the within-class matrix of Gram matrices sent as
    low-rank factors is not exactly PSD: the kernel model's), the minimum-norm solution
    comes from one eigendecomposition of the unshrunk matrix, shared by every value (three
    3,765-square decompositions cost 30 s of the kernel model's selection round)."""
    for shrinkage in shrinkages:
        if not (math.isfinite(shrinkage) and shrinkage >= 0):
            raise ValueError(f"shrinkage must be finite and >= 0; got {shrinkage}")
    a, b = pooled_system(grams, moments, num_train, 0.0)
    d = a.shape[0] - 1
    prior, mu = class_priors_and_means(b)
    within = symmetrize_(a[:d, :d].sub_((mu.T * prior) @ mu))
    scale = float(torch.trace(within).clamp(min=0.0))
    eigen = None
    out = []
    for shrinkage in shrinkages:
        shift = float(shrinkage) * scale / d
        shrunk = within.clone()
        shrunk.diagonal().add_(shift)
        weight = cholesky_solve_right(shrunk, mu, overwrite=True)
        del shrunk  # factored where it lay: not held beside the decomposition below
        if weight is None:
            eigen = torch.linalg.eigh(within) if eigen is None else eigen
            weight = spectral_solve_right(eigen, mu, shift)
        out.append(lda_classifier(weight, prior, mu))
    return out


def class_priors_and_means(moments: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pi (C,), mu (C, d))`` from the pooled label moments ``(C, d + 1)``: each class's
    share of the rows (the last column) and its mean input (zero for a class no node holds)."""
    d = moments.shape[1] - 1
    prior = moments[:, d].clamp(min=0.0)
    held = prior > 0
    mu = torch.zeros_like(moments[:, :d])
    mu[held] = moments[held, :d] / prior[held, None]
    return prior, mu


def lda_classifier(weight: torch.Tensor, prior: torch.Tensor, mu: torch.Tensor) -> np.ndarray:
    """The LDA classifier ``(C, d + 1)`` of the discriminant directions ``weight``
    ``(C, d)`` (``mu_c A^-1``): bias ``-mu_c . w_c / 2 + log pi_c``; a class no node holds is
    never predicted."""
    held = prior > 0
    weight = weight.clone()
    bias = torch.full((len(prior),), ABSENT_CLASS_BIAS, dtype=torch.float64)
    bias[held] = -0.5 * (weight[held] * mu[held]).sum(dim=1) + torch.log(prior[held])
    weight[~held] = 0.0
    return torch.cat([weight, bias[:, None]], dim=1).numpy()
