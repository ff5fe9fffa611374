"""The server's choice of ``h_G`` among logit-space (Gram) ellipsoids.

``h_G = argmin_W sum_k lambda_k tr((W - W_k) G_k (W - W_k)^T)`` has the closed form
``(sum_k lambda_k W_k G_k)(sum_k lambda_k G_k + ridge I)^-1`` (RegMean's merge): the
model whose logits on every node's inputs stay, in the weighted mean-square sense,
closest to that node's own. ``lambda_k`` is the node's training-sample count
(``weighting='samples'``) or ``1 / rho_k^2`` (``'radius'``, which scales each node's
distance by its own tolerance).

Membership is then checked in every space. Where the closed form misses some space,
the point minimising the largest scaled distance ``max_k d_k(W) / rho_k`` is computed
too: when that maximum is <= 1 the spaces share a point, and ``point='shared'`` uses it.
The result says which point was used and, per node, inside or by how much it misses.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gems_fl.geometry.choices import GRAM_POINTS as POINTS
from gems_fl.geometry.choices import GRAM_WEIGHTINGS as WEIGHTINGS
from gems_fl.geometry.gram import gram_center, minimax_gram_point
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.spaces import GramSpace


def merge_weights(spaces: Sequence[GramSpace], num_train: Sequence[float], weighting: str) -> np.ndarray:
    """``lambda_k`` for every node, normalised to sum 1."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting={weighting!r}; choose one of {', '.join(WEIGHTINGS)}")
    if weighting == "samples":
        lam = np.asarray(num_train, dtype=np.float64)
    else:
        radii = np.array([s.radius for s in spaces], dtype=np.float64)
        # A zero radius is a node that failed eps at its own model; it pins nothing.
        lam = np.where(radii > 0, 1.0 / np.maximum(radii, 1e-300) ** 2, 0.0)
        if not np.any(lam > 0):
            lam = np.ones(len(spaces))
    return lam / lam.sum()


def aggregate_gram(
    spaces: Sequence[GramSpace], num_train: Sequence[float], *, weighting: str = "samples",
    ridge: float = 1e-6, point: str = "closed-form",
) -> IntersectionResult:
    """Choose ``h_G`` for the Gram spaces and report membership in each of them."""
    if not spaces:
        raise ValueError("no spaces to aggregate")
    if point not in POINTS:
        raise ValueError(f"point={point!r}; choose one of {', '.join(POINTS)}")
    shape = spaces[0].matrix.shape
    for k, s in enumerate(spaces):
        if s.matrix.shape != shape:
            raise ValueError(f"space {k} has a {s.matrix.shape} center; space 0 has {shape}")
    lam = merge_weights(spaces, num_train, weighting)
    closed = gram_center([s.matrix for s in spaces], [s.gram for s in spaces], lam, ridge)
    chosen, method = closed, "closed-form"
    details: dict[str, object] = {"weighting": weighting, "ridge": float(ridge),
                                  "weights": [float(v) for v in lam]}
    inside = [s.contains(closed) for s in spaces]
    if not all(inside) and all(s.radius > 0 for s in spaces):
        shared, worst, info = minimax_gram_point(
            [s.matrix for s in spaces], [s.gram for s in spaces], [s.radius for s in spaces],
            return_info=True, decide_at=1.0)
        # The search stops once its bracket settles "<= 1?": the distance reported is the
        # best point's (an upper bound on the optimum), with the certified lower bound.
        details["minimax_scaled_distance"] = float(worst)
        details["minimax_lower_bound"] = float(info["lower_bound"])
        details["spaces_share_a_point"] = (True if worst <= 1.0 else
                                           False if info["lower_bound"] > 1.0 else None)
        if point == "shared" and worst <= 1.0:
            chosen, method = np.asarray(shared), "shared"
    point_vec = np.asarray(chosen, dtype=np.float64).reshape(-1)
    inside = [s.contains(point_vec) for s in spaces]
    penalties = [s.penalty(point_vec) for s in spaces]
    details["distance"] = [s.distance(point_vec) for s in spaces]
    details["certified_radius"] = [s.certified_radius for s in spaces]
    details["inside_certified"] = [s.distance(point_vec) < s.certified_radius for s in spaces]
    return IntersectionResult(
        point=point_vec, found=all(inside), method=method,
        objective=float(sum(penalties)), inside=inside,
        miss=[0.0 if ins else pen for ins, pen in zip(inside, penalties)],
        iterations=0, details=details,
    )
