"""Class Gram matrices per k-means component: each class as a mixture of Gaussians.

The ``gaussian`` point (:mod:`gems_fl.geometry.virtual`) models each class by one
Gaussian. The rows of a class are rarely one: on an MLP's ReLU features (many exact
zeros, several modes) the softmax layer fitted to one Gaussian per class stays about 2
points below the same fit on the real rows. With ``class-components=G`` each node splits
the rows of each class it holds into up to ``G`` k-means clusters (scikit-learn, seeded)
and sends one Gram matrix per cluster with its row count, so the server draws its
virtual rows from a mixture: each node's clusters are kept apart (a cluster is a node's,
not a shared one). The clusters of a class add up to its class Gram matrix, which is what
the server keeps when it holds only sums (``server-grams=sums``).

A component's row is ``(class, rows)``; components come in class order.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import torch

from gems_fl.geometry.gram import checked_class_matrices, labelled_rows
from gems_fl.geometry.virtual import class_statistics

#: a cluster is formed only for this many rows of its class, and for twice the layer's
#: size: a covariance from fewer rows than twice its dimension is mostly noise (on the
#: digits' 65 inputs, components of ~70 rows cost GEMS 0.8-1.6 points, 2-4 of its 256 test
#: images, convex and MLP)
MIN_COMPONENT_ROWS = 50


def component_grams(x: np.ndarray | torch.Tensor, y, num_classes: int, components: int,
                    seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(grams (M, d + 1, d + 1), parts (M, 2))``: for each class the node holds (class
    order), the rows split into ``min(components, rows // min_rows)`` (at least one)
    k-means clusters, ``min_rows`` the larger of ``MIN_COMPONENT_ROWS`` and ``2 (d + 1)``,
    and for each cluster the mean of ``x~ x~^T`` over its rows and ``[class, rows]``.
    With ``components=1`` the grams are :func:`gems_fl.geometry.gram.class_grams`."""
    if int(components) < 1:
        raise ValueError(f"components={components} must be >= 1 (1: one Gaussian per class)")
    xa, yt = labelled_rows(x, y, num_classes)
    grams, parts = [], []
    min_rows = max(MIN_COMPONENT_ROWS, 2 * xa.shape[1])
    for c in torch.unique(yt).tolist():
        rows = xa[yt == c]
        for members in _clusters(rows[:, :-1], int(components), min_rows, seed):
            part = rows[members]
            g = part.T @ part / len(part)
            grams.append(0.5 * (g + g.T))
            parts.append((c, len(part)))
    return torch.stack(grams).numpy(), np.asarray(parts, dtype=np.int64)


def _clusters(rows: torch.Tensor, components: int, min_rows: int,
              seed: int) -> list[torch.Tensor]:
    """Index sets of the k-means clusters of ``rows`` (empty ones dropped)."""
    k = min(components, len(rows) // min_rows)
    if k <= 1:
        return [torch.arange(len(rows))]
    from sklearn.cluster import KMeans  # here: scikit-learn's import costs every process 1-3 s
    from sklearn.exceptions import ConvergenceWarning

    with warnings.catch_warnings():  # duplicate rows can leave fewer distinct clusters
        warnings.simplefilter("ignore", ConvergenceWarning)
        labels = KMeans(n_clusters=k, random_state=int(seed), n_init=1).fit_predict(
            rows.numpy())
    found = [torch.as_tensor(np.flatnonzero(labels == j)) for j in range(k)]
    return [f for f in found if len(f)]


def check_component_grams(triangles, parts, counts: np.ndarray, moments: np.ndarray, n: int,
                          *, tol: float = 1e-4) -> tuple[np.ndarray, np.ndarray]:
    """Validate a node's component Gram matrices (packed upper triangles, one row per
    component) and their ``parts`` ``(M, 2)`` ``[class, rows]`` against its checked label
    moments and class counts; return ``(grams (M, n, n) float64, parts int64)``.

    Raises ``ValueError`` naming the first problem: shapes; classes out of class order or
    not held; a component without rows; a class whose components' rows do not add up to
    its count; a matrix that fails :func:`check_gram` (finite, symmetric, PSD, bias entry
    1); a class whose components' count-weighted mean last row is farther than ``tol``
    (relative to the largest entry) from ``[class mean, 1]`` as the label moments give it.
    """
    tri = np.asarray(triangles, dtype=np.float64)
    raw = np.asarray(parts)
    if raw.ndim != 2 or raw.shape[1] != 2 or not np.all(np.isfinite(raw)) \
            or not np.array_equal(raw, np.round(raw)):
        raise ValueError(f"class-components has shape {raw.shape}; expected (M, 2) integers "
                         "[class, rows], one row per component")
    parts = raw.astype(np.int64)
    m = len(parts)
    if tri.shape != (m, n * (n + 1) // 2):
        raise ValueError(f"component Gram matrices have shape {tri.shape}; expected "
                         f"({m}, {n * (n + 1) // 2}): one packed triangle per component")
    counts = np.asarray(counts)
    held = np.flatnonzero(counts > 0)
    classes, rows = parts[:, 0], parts[:, 1]
    if m == 0 or np.any(np.diff(classes) < 0) or not np.array_equal(np.unique(classes), held):
        raise ValueError(f"components name classes {np.unique(classes).tolist()} (in class "
                         f"order expected); the label counts hold {held.tolist()}")
    if rows.min() < 1:
        raise ValueError("a component has no rows")
    sums = np.bincount(classes, weights=rows, minlength=len(counts))
    if not np.array_equal(sums[held], counts[held]):
        bad = int(held[np.flatnonzero(sums[held] != counts[held])[0]])
        raise ValueError(f"class {bad}'s components hold {int(sums[bad])} rows; its count "
                         f"is {int(counts[bad])}")
    return checked_class_matrices(tri, classes, rows, counts, moments, n, tol=tol), parts


def class_totals(grams: np.ndarray, parts: np.ndarray) -> np.ndarray:
    """Each class's Gram matrix ``(m, n, n)`` (class order) from its components': their
    row-weighted mean."""
    grams, parts = np.asarray(grams, dtype=np.float64), np.asarray(parts)
    out = []
    for c in np.unique(parts[:, 0]):
        mine = parts[:, 0] == c
        out.append(np.tensordot(parts[mine, 1] / parts[mine, 1].sum(), grams[mine], axes=1))
    return np.stack(out)


def mixture_moments(grams: Sequence[np.ndarray], parts: Sequence[np.ndarray]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every node's components as Gaussians: ``(rows (M,), means (M, n - 1), covariances
    (M, n - 1, n - 1), classes (M,))`` over all nodes, float64 (``classes`` int64).
    ``grams[k]`` ``(m_k, n, n)`` and ``parts[k]`` ``(m_k, 2)`` are node k's."""
    if not grams or len(grams) != len(parts):
        raise ValueError(f"got {len(grams)} nodes' component Gram matrices and {len(parts)} "
                         "component lists; pass one of each per node")
    stacked = np.concatenate([np.asarray(g, dtype=np.float64) for g in grams])
    table = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1, 2) for p in parts])
    if len(stacked) != len(table):
        raise ValueError(f"{len(stacked)} component Gram matrices but {len(table)} components")
    means, covs = class_statistics(stacked)
    return table[:, 1].astype(np.float64), means, covs, table[:, 0]
