"""The server's choice of ``h_G`` among logit-space (Gram) ellipsoids: the pieces the
aggregation points (:mod:`gems_fl.geometry.points`) share.

``h_G = argmin_W sum_k lambda_k tr((W - W_k) G_k (W - W_k)^T)`` has the closed form
``(sum_k lambda_k W_k G_k)(sum_k lambda_k G_k + ridge I)^-1`` (RegMean's merge): the
model whose logits on every node's inputs stay, in the weighted mean-square sense,
closest to that node's own. ``lambda_k`` is the node's share of the training rows.

Membership is then checked in every space. Where a point misses some space, the point
minimising the largest scaled distance ``max_k d_k(W) / rho_k`` is computed too: when that
maximum is <= 1 the spaces share a point (the results say so). The result says which
point was used and, per node, inside or by how much it misses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from gems_fl.geometry.gram import expanded_sq_distances
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.linalg import center_for, layer_matrix, solve_right, square_matrix
from gems_fl.geometry.spaces import GramSpace


def _node_inputs(centers: Sequence, grams: Sequence, what: str = "grams"):
    if len(centers) == 0:
        raise ValueError("no nodes: pass at least one center and Gram matrix")
    if len(centers) != len(grams):
        raise ValueError(f"got {len(centers)} centers but {len(grams)} {what}; "
                         "pass one of each per node")
    ws = [layer_matrix(f"centers[{i}]", c) for i, c in enumerate(centers)]
    shape = tuple(ws[0].shape)
    for i, w in enumerate(ws):
        if tuple(w.shape) != shape:
            raise ValueError(f"centers[{i}] has shape {tuple(w.shape)} but centers[0] has "
                             f"{shape}; every node must share the layer shape (C, d + 1)")
    # Shapes only: finiteness and PSD are check_gram's job when a reply arrives; a full
    # scan of 100 Gram matrices here would cost as much as the aggregation itself.
    gs = [square_matrix(f"grams[{i}]", g, shape[1], finite=False) for i, g in enumerate(grams)]
    return ws, gs


def _weights(name: str, values, k: int) -> torch.Tensor:
    w = torch.as_tensor(np.asarray(values, dtype=np.float64))
    if w.shape != (k,):
        raise ValueError(f"{name} must have one entry per node ({k}); got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
        raise ValueError(f"{name} must be finite and >= 0; got {w.tolist()}")
    return w


def gram_center(
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    weights: Sequence[float] | None = None,
    ridge: float = 0.0,
) -> np.ndarray:
    """Closed-form minimiser of ``sum_k l_k tr((W - W_k) G_k (W - W_k)^T) + ridge ||W||^2``.

    ``W = (sum_k l_k W_k G_k) (sum_k l_k G_k + ridge I)^-1``, computed by a Cholesky solve
    of the symmetric system (no explicit inverse). ``l = weights / sum(weights)``:
    normalised, so ``ridge`` is on the scale of one (mean) Gram matrix whatever the
    weights. Pass the nodes' training sample counts (then the objective is the squared
    logit change summed over all training inputs) or ``1 / rho_k^2`` (each node's
    distance relative to its radius); ``None`` means equal weights.

    With ``ridge=0`` and a singular ``sum_k l_k G_k`` (an input feature no node ever
    varies) the minimum-norm minimiser is returned -- the ``ridge -> 0+`` limit: it sets
    the components no node's logits depend on to 0.
    """
    ridge = float(ridge)
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be finite and >= 0; got {ridge}")
    a, b = center_system(centers, grams, weights)
    if ridge > 0:
        a.diagonal().add_(ridge)
    w = solve_right(a, b)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the aggregated model is not finite: a center or Gram matrix holds "
                         "NaN/inf; validate each reply with check_gram first")
    return w.numpy()


def center_system(centers: Sequence[np.ndarray], grams: Sequence[np.ndarray],
                  weights: Sequence[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sum_k l_k G_k, sum_k l_k W_k G_k)`` of :func:`gram_center`, float64 torch, the
    first symmetrised; ``l = weights / sum(weights)`` (``None``: equal weights)."""
    ws, gs = _node_inputs(centers, grams)
    k = len(ws)
    lw = _weights("weights", np.ones(k) if weights is None else weights, k)
    total = float(lw.sum())
    if total <= 0:
        raise ValueError("weights sum to 0; at least one node needs a positive weight")
    lw = lw / total
    n = gs[0].shape[0]
    a = torch.zeros(n, n, dtype=torch.float64)
    b = torch.zeros(ws[0].shape, dtype=torch.float64)
    for lk, wk, gk in zip(lw.tolist(), ws, gs):
        if lk == 0.0:
            continue
        a.add_(gk, alpha=lk)
        b.addmm_(wk, gk, alpha=lk)
    return 0.5 * (a + a.T), b


def _radii(radii, k: int) -> torch.Tensor:
    r = torch.as_tensor(np.asarray(radii, dtype=np.float64))
    if r.shape != (k,):
        raise ValueError(f"radii must have one entry per node ({k}); got shape {tuple(r.shape)}")
    if bool(torch.isnan(r).any()) or bool((r < 0).any()):
        raise ValueError(f"radii must be >= 0 (inf allowed: unconstrained); got {r.tolist()}")
    return r


def _sq_dist(w: torch.Tensor, wk: torch.Tensor, gk: torch.Tensor) -> float:
    d = w - wk
    return max(float(((d @ gk) * d).sum()), 0.0)


def _scaled(dist: float, rho: float) -> float:
    if math.isinf(rho):
        return 0.0
    if rho == 0.0:
        return 0.0 if dist == 0.0 else math.inf
    return dist / rho


def minimax_gram_point(
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    radii: Sequence[float],
    *,
    max_iter: int = 500,
    tol: float = 1e-6,
    return_info: bool = False,
    decide_at: float | None = None,
):
    """The point minimising ``max_k ||W - W_k||_{G_k} / rho_k``, and that maximum.

    Returns ``(W, max_scaled_distance)``: ``<= 1`` means ``W`` lies in every node's space.
    ``return_info=True`` adds a dict: ``scaled_distances`` (per node), ``lower_bound`` (a
    certified lower bound on the optimum), ``iterations``, ``converged``, ``weights`` (dual
    weights, per node), ``excluded`` (nodes with radius 0 or inf). ``decide_at`` (e.g. 1.0:
    do the spaces share a point?) stops once the bracket settles that question; the
    maximum returned is then an upper bound on the optimum, not the optimum itself.

    Method: the dual by multiplicative weights (:func:`_minimax_dual_ascent`). Nodes with
    ``rho_k = 0`` (center failed eps) are left out of it; their scaled distance is ``inf``
    (0 only at exactly their center), so the maximum is ``inf``. Nodes with ``rho_k = inf``
    impose no constraint; with no constrained node left, the equal-weight ``gram_center``.
    """
    ws, gs = _node_inputs(centers, grams)
    k = len(ws)
    r = _radii(radii, k)
    active = [i for i in range(k) if 0.0 < float(r[i]) < math.inf]
    excluded = [i for i in range(k) if i not in active]
    info: dict = {"iterations": 0, "converged": True, "excluded": excluded,
                  "weights": np.zeros(k)}
    if not active:
        w_best = torch.as_tensor(gram_center(ws, gs))
        lower = 0.0
    else:
        w_best, lower, lam = _minimax_dual_ascent(
            [ws[i] for i in active], [gs[i] for i in active],
            [1.0 / float(r[i]) ** 2 for i in active], max_iter, tol, decide_at, info)
        full = np.zeros(k)
        full[active] = lam.numpy()
        info["weights"] = full

    scaled = [_scaled(math.sqrt(_sq_dist(w_best, ws[i], gs[i])), float(r[i])) for i in range(k)]
    worst = max(scaled)
    # lower bound: for the nodes with finite positive radius; adding the others only
    # raises the optimum, so it bounds the full problem too
    info.update(scaled_distances=np.array(scaled), lower_bound=math.sqrt(max(lower, 0.0)))
    if return_info:
        return w_best.numpy(), worst, info
    return w_best.numpy(), worst


class _WeightedCenters:
    """The closed-form center of the constrained nodes for dual weights ``lambda`` and its
    scaled squared distances ``q_k = ||W - W_k||^2 / rho_k^2`` (``inv_r2``: the
    ``1 / rho_k^2``); ``W_k G_k`` and ``tr(W_k G_k W_k^T)`` computed once."""

    def __init__(self, wa: list[torch.Tensor], ga: list[torch.Tensor],
                 inv_r2: list[float]) -> None:
        self.wa, self.ga, self.inv_r2 = wa, ga, inv_r2
        self.h = [wk @ gk for wk, gk in zip(wa, ga)]
        self.c = [float((hk * wk).sum()) for hk, wk in zip(self.h, wa)]

    def solve(self, lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.ga[0].shape[0]
        a = torch.zeros(n, n, dtype=torch.float64)
        b = torch.zeros(self.wa[0].shape, dtype=torch.float64)
        for lk, s, gk, hk in zip(lam.tolist(), self.inv_r2, self.ga, self.h):
            if lk > 0.0:
                a.add_(gk, alpha=lk * s)
                b.add_(hk, alpha=lk * s)
        w = solve_right(0.5 * (a + a.T), b)
        sq = expanded_sq_distances(w, self.ga, self.h, self.c)
        return w, torch.tensor([qk * s for qk, s in zip(sq, self.inv_r2)], dtype=torch.float64)


def _dual_stop(primal: float, lower: float, dual: float, tol: float,
               decide_at: float | None) -> str | None:
    """Why the dual ascent stops now (``"converged"``, ``"decided"``), or None."""
    if math.sqrt(primal) - math.sqrt(max(lower, 0.0)) <= tol * math.sqrt(primal):
        return "converged"
    if dual <= 0.0:  # every active center coincides with W: optimum 0
        return "converged"
    if decide_at is not None and (primal <= decide_at ** 2 or lower > decide_at ** 2):
        return "decided"
    return None


def _minimax_dual_ascent(
    wa: list[torch.Tensor], ga: list[torch.Tensor], inv_r2: list[float], max_iter: int,
    tol: float, decide_at: float | None, info: dict,
) -> tuple[torch.Tensor, float, torch.Tensor]:
    """``min_W max_k q_k(W)`` over the constrained nodes: ``(best W, lower bound on the
    squared optimum, dual weights)``; ``info`` gets ``iterations``, ``converged`` and
    ``decided`` (where ``decide_at`` settled the question).

    The convex problem has the dual ``max_{lambda in simplex} g(lambda)``, ``g(lambda) =
    min_W sum_k lambda_k q_k(W)``, whose inner minimiser is the closed-form center with
    weights ``lambda_k / rho_k^2`` and whose gradient is ``q_k(W(lambda))``. From uniform
    ``lambda``, the weights move multiplicatively toward the worst nodes, ``lambda_k <-
    lambda_k (q_k / g)^beta``, ``beta`` grown while the dual improves and halved when it
    does not. Weak duality brackets the optimum: ``sqrt(g) <= opt <= sqrt(max_k q_k)``;
    iteration stops when the relative gap is below ``tol`` (or after ``max_iter``) and
    the best primal point is returned.
    """
    centers = _WeightedCenters(wa, ga, inv_r2)
    lam = torch.full((len(wa),), 1.0 / len(wa), dtype=torch.float64)
    w, q = centers.solve(lam)
    dual = float((lam * q).sum())
    w_best, primal = w, float(q.max())
    lower, beta = dual, 1.0
    info["converged"] = False
    for it in range(1, max_iter + 1):
        info["iterations"] = it
        stop = _dual_stop(primal, lower, dual, tol, decide_at)
        if stop is not None:
            info[stop] = True
            break
        trial = lam * (q / dual).clamp_min(1e-300) ** beta
        trial = trial / trial.sum()
        w_t, q_t = centers.solve(trial)
        dual_t = float((trial * q_t).sum())
        if float(q_t.max()) < primal:
            w_best, primal = w_t, float(q_t.max())
        if dual_t > dual:
            lam, w, q, dual = trial, w_t, q_t, dual_t
            lower = max(lower, dual)
            beta = min(beta * 1.5, 16.0)
        else:
            beta *= 0.5
            if beta < 1e-8:
                info["converged"] = True  # no ascent left at machine precision
                break
    return w_best, lower, lam


class Membership(NamedTuple):
    """One node's verdict on a model: its Gram distance, radius, and the shortfall."""

    distance: float
    radius: float
    inside: bool
    miss: float


def membership(
    w: np.ndarray,
    centers: Sequence[np.ndarray],
    grams: Sequence[np.ndarray],
    radii: Sequence[float],
    *,
    rtol: float = 1e-9,
) -> list[Membership]:
    """Per node: ``distance = ||W - W_k||_{G_k}``, ``radius = rho_k``,
    ``inside = distance <= rho_k (1 + rtol)`` (rtol absorbs rounding at a boundary point
    such as the minimax solution), ``miss = max(distance - rho_k, 0)``.
    """
    ws, gs = _node_inputs(centers, grams)
    r = _radii(radii, len(ws))
    wt = center_for("W", w, ws[0].shape[1])
    if wt.shape != ws[0].shape:
        raise ValueError(f"W has shape {tuple(wt.shape)}; the nodes' models have "
                         f"{tuple(ws[0].shape)}")
    out = []
    for wk, gk, rk in zip(ws, gs, r.tolist()):
        dist = math.sqrt(_sq_dist(wt, wk, gk))
        out.append(Membership(dist, rk, dist <= rk * (1.0 + rtol), max(dist - rk, 0.0)))
    return out


def merge_weights(spaces: Sequence[GramSpace], num_train: Sequence[float]) -> np.ndarray:
    """``lambda_k`` for every node: its share of the training rows (sums to 1)."""
    lam = np.asarray(num_train, dtype=np.float64)
    if lam.shape != (len(spaces),):
        raise ValueError(f"num_train has {lam.size} counts for {len(spaces)} spaces")
    return lam / lam.sum()


def gram_result(spaces: Sequence[GramSpace], point: np.ndarray, method: str,
                details: dict[str, object]) -> IntersectionResult:
    """``point`` as the run's ``h_G``: its membership in each space, and the distances."""
    point_vec = np.asarray(point, dtype=np.float64).reshape(-1)
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


def record_minimax(spaces: Sequence[GramSpace], details: dict) -> tuple[np.ndarray, float]:
    """The minimax point, with what it says about the spaces recorded in ``details``
    (``spaces_share_a_point``, the scaled distance and its certified lower bound)."""
    shared, worst, info = minimax_gram_point(
        [s.matrix for s in spaces], [s.gram for s in spaces], [s.radius for s in spaces],
        return_info=True, decide_at=1.0)
    # The search stops once its bracket settles "<= 1?": the distance reported is the
    # best point's (an upper bound on the optimum), with the certified lower bound.
    details["minimax_scaled_distance"] = float(worst)
    details["minimax_lower_bound"] = float(info["lower_bound"])
    details["spaces_share_a_point"] = (True if worst <= 1.0 else
                                       False if info["lower_bound"] > 1.0 else None)
    return np.asarray(shared), float(worst)


def has_class_grams(spaces: Sequence) -> bool:
    """Whether every space carries its node's class Gram matrices (the ``gaussian`` point)."""
    return all(getattr(s, "class_grams", None) is not None
               and getattr(s, "class_counts", None) is not None for s in spaces)


def has_class_components(spaces: Sequence) -> bool:
    """Whether every space carries class Gram matrices and some node split its classes
    into k-means components (the ``mixture`` point then differs from ``gaussian``)."""
    return has_class_grams(spaces) and any(getattr(s, "class_parts", None) is not None
                                           for s in spaces)


def class_parts(space: GramSpace) -> np.ndarray:
    """A space's components ``[class, rows]``: one per class held where it sent none."""
    if space.class_parts is not None:
        return space.class_parts
    counts = np.asarray(space.class_counts)
    held = np.flatnonzero(counts > 0)
    return np.stack([held, counts[held]], axis=1)
