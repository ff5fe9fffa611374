"""Class Gram matrices in a compact wire form: each class's covariance as a rank-r factor
plus its residual diagonal, the class mean taken from the label moments.

A class Gram matrix ``S_c = mean over the class's rows of x~ x~^T`` is ``(d+1) x (d+1)``:
1.2 MB as a float32 triangle on Fashion-MNIST's 785. It is the class mean ``m_c`` and
covariance ``Sigma_c`` in one matrix, ``S_c = [[Sigma_c + m_c m_c^T, m_c], [m_c^T, 1]]``.
The label moments already carry ``m_c`` exactly, so a node sends only ``Sigma_c`` the way
``gram-rank`` sends its Gram matrix: the top-r eigenpairs as a factor ``F_c`` (float16
vectors, power-of-two column scales, :func:`gems_fl.geometry.gram.half_factor`) and
``diag(Sigma_c - F_c F_c^T)``, so every pixel keeps its own variance. 82 KB per class at
r = 50 and d = 784. Both ends build the same matrices from the sent arrays
(:func:`class_grams_from_factors`), and a matrix built that way is positive semidefinite
with bias entry 1 by construction.

Measured (benchmarks/gaussian_gap.py, ``lowrank:50``, Fashion-MNIST paper K=5 seed 0,
L2 1e-3): the gaussian point from the rank-50 form 0.831 against 0.837 from the whole
matrices and 0.806 from the shared covariance that the default round held before.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gems_fl.geometry.gram import from_half, half_factor, low_rank_factor


def class_means(moments: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each held class's mean ``(m, d)`` float64 from the label moments as they travel
    (float32) and the counts: the means the server computes, so both ends agree."""
    m = np.asarray(moments, dtype=np.float32).astype(np.float64)
    c = np.asarray(counts, dtype=np.float64)
    held = np.flatnonzero(c > 0)
    return m[held, :-1] * c.sum() / c[held, None]


def class_factors(grams: np.ndarray, means: np.ndarray, rank: int,
                  rows: Sequence[np.ndarray] | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sent form of class Gram matrices ``grams`` ``(m, d + 1, d + 1)``:
    ``(vectors (m, d, r) float16 in [-1, 1], scales (m, r) float32 powers of two,
    residual (m, d) float32 >= 0)``, the covariance of each class about ``means``
    ``(m, d)`` (:func:`class_means`) cut to its top ``rank`` eigenpairs.

    ``rows``: each class's inputs ``(N_c, d)`` that ``grams`` are the means over. A class
    with fewer rows than ``d`` then takes its eigenpairs from the thin SVD of its centred
    rows (``N_c x d``) instead of the ``d x d`` covariance: the same pairs, at a fraction
    of the cost (a node of 50 rows at 784 pixels)."""
    s = torch.as_tensor(np.asarray(grams), dtype=torch.float64)
    mu = torch.as_tensor(np.asarray(means), dtype=torch.float64)
    if s.ndim != 3 or s.shape[1] != s.shape[2] or mu.shape != (s.shape[0], s.shape[1] - 1):
        raise ValueError(f"class Gram matrices {tuple(s.shape)} and means {tuple(mu.shape)} "
                         "must be (m, d + 1, d + 1) and (m, d)")
    m, d = s.shape[0], s.shape[1] - 1
    if not isinstance(rank, (int, np.integer)) or not 1 <= rank <= d:
        raise ValueError(f"rank must be an integer in [1, {d}]; got {rank!r}")
    if rows is not None and len(rows) != m:
        raise ValueError(f"rows of {len(rows)} classes for {m} class Gram matrices")
    cov = s[:, :d, :d] - mu[:, :, None] * mu[:, None, :]
    cov = 0.5 * (cov + cov.transpose(1, 2))
    factor = torch.zeros(m, d, rank, dtype=torch.float64)
    for i in range(m):
        few = rows is not None and 0 < len(rows[i]) < d
        if few:
            x = torch.as_tensor(np.asarray(rows[i]), dtype=torch.float64) - mu[i]
            _, sing, vh = torch.linalg.svd(x / len(x) ** 0.5, full_matrices=False)
            keep = min(rank, len(sing))
            factor[i, :, :keep] = vh[:keep].T * sing[:keep]
        else:
            factor[i] = torch.as_tensor(low_rank_factor(cov[i].numpy(), rank), dtype=torch.float64)
    halves = [half_factor(f) for f in factor.numpy().astype(np.float32)]
    vectors = np.stack([v for v, _ in halves])
    scales = np.stack([sc for _, sc in halves])
    sent = torch.as_tensor(from_half(vectors, scales[:, None, :]), dtype=torch.float64)
    residual = torch.diagonal(cov, dim1=1, dim2=2) - (sent * sent).sum(dim=2)
    return vectors, scales, residual.clamp_min(0.0).numpy().astype(np.float32)


def class_grams_from_factors(vectors: np.ndarray, scales: np.ndarray, residual: np.ndarray,
                             means: np.ndarray) -> np.ndarray:
    """The class Gram matrices ``(m, d + 1, d + 1)`` float64 that :func:`class_factors`'s
    arrays and the class means stand for: ``[[F F^T + diag(r) + m m^T, m], [m^T, 1]]``."""
    f = torch.as_tensor(from_half(vectors, np.asarray(scales)[:, None, :]), dtype=torch.float64)
    mu = torch.as_tensor(np.asarray(means), dtype=torch.float64)
    m, d, _ = f.shape
    out = torch.empty(m, d + 1, d + 1, dtype=torch.float64)
    out[:, :d, :d] = f @ f.transpose(1, 2) + mu[:, :, None] * mu[:, None, :]
    out[:, :d, :d].diagonal(dim1=1, dim2=2).add_(torch.as_tensor(np.asarray(residual),
                                                                 dtype=torch.float64))
    out[:, :d, d] = mu
    out[:, d, :d] = mu
    out[:, d, d] = 1.0
    return out.numpy()


def check_class_factors(vectors, scales, residual, moments: np.ndarray, counts: np.ndarray,
                        n: int, rank: int) -> np.ndarray:
    """Validate a node's class Gram matrices in factor form against its checked label
    moments and counts (one entry per class with a count > 0, in class order); return
    the matrices as float64 ``(m, n, n)``.

    Raises ``ValueError`` naming the first problem: a shape other than ``(m, n - 1, r)``,
    ``(m, r)`` and ``(m, n - 1)`` (``r = min(rank, n - 1)``); NaN or infinite entries;
    vectors outside ``[-1, 1]``; scales that are not > 0; a residual below 0.
    """
    held = int(np.sum(np.asarray(counts) > 0))
    r, d = min(int(rank), n - 1), n - 1
    arrays = {"class-vectors": (vectors, (held, d, r)), "class-scales": (scales, (held, r)),
              "class-residual": (residual, (held, d))}
    checked = {}
    for name, (value, shape) in arrays.items():
        arr = np.asarray(value, dtype=np.float64)
        if arr.shape != shape:
            raise ValueError(f"{name} has shape {arr.shape}; expected {shape} (one entry per "
                             f"class with training rows, rank {r})")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} contains NaN or infinite entries")
        checked[name] = arr
    if np.abs(checked["class-vectors"]).max(initial=0.0) > 1:
        raise ValueError("class-vectors must lie in [-1, 1] (each column's scale is sent apart)")
    if checked["class-scales"].min(initial=1.0) <= 0:
        raise ValueError("class-scales must be > 0")
    if checked["class-residual"].min(initial=0.0) < 0:
        raise ValueError("class-residual must be >= 0 (the diagonal of a covariance minus "
                         "its factor's part)")
    return class_grams_from_factors(np.asarray(vectors, dtype=np.float16),
                                    np.asarray(scales, dtype=np.float32),
                                    checked["class-residual"], class_means(moments, counts))
