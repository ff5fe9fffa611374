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

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from gems_fl.geometry._linalg import _center_for, _matrix, _solve_right, _square
from gems_fl.geometry.choices import GRAM_POINTS as POINTS
from gems_fl.geometry.gram import expanded_sq_distances
from gems_fl.geometry.choices import GRAM_WEIGHTINGS as WEIGHTINGS
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.pooled import best_point, pooled_lda, pooled_point
from gems_fl.geometry.spaces import GramSpace
from gems_fl.geometry.components import mixture_moments
from gems_fl.geometry.virtual import gaussian_point, pooled_class_moments

def _node_inputs(centers: Sequence, grams: Sequence, what: str = "grams"):
    if len(centers) == 0:
        raise ValueError("no nodes: pass at least one center and Gram matrix")
    if len(centers) != len(grams):
        raise ValueError(f"got {len(centers)} centers but {len(grams)} {what}; "
                         "pass one of each per node")
    ws = [_matrix(f"centers[{i}]", c) for i, c in enumerate(centers)]
    shape = tuple(ws[0].shape)
    for i, w in enumerate(ws):
        if tuple(w.shape) != shape:
            raise ValueError(f"centers[{i}] has shape {tuple(w.shape)} but centers[0] has "
                             f"{shape}; every node must share the layer shape (C, d + 1)")
    # Shapes only: finiteness and PSD are check_gram's job when a reply arrives; a full
    # scan of 100 Gram matrices here would cost as much as the aggregation itself.
    gs = [_square(f"grams[{i}]", g, shape[1], finite=False) for i, g in enumerate(grams)]
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
    ws, gs = _node_inputs(centers, grams)
    k = len(ws)
    lw = _weights("weights", np.ones(k) if weights is None else weights, k)
    total = float(lw.sum())
    if total <= 0:
        raise ValueError("weights sum to 0; at least one node needs a positive weight")
    lw = lw / total
    ridge = float(ridge)
    if not (math.isfinite(ridge) and ridge >= 0):
        raise ValueError(f"ridge must be finite and >= 0; got {ridge}")
    n = gs[0].shape[0]
    a = torch.zeros(n, n, dtype=torch.float64)
    b = torch.zeros(ws[0].shape, dtype=torch.float64)
    for lk, wk, gk in zip(lw.tolist(), ws, gs):
        if lk == 0.0:
            continue
        a.add_(gk, alpha=lk)
        b.addmm_(wk, gk, alpha=lk)
    a = 0.5 * (a + a.T)
    if ridge > 0:
        a.diagonal().add_(ridge)
    w = _solve_right(a, b)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the aggregated model is not finite: a center or Gram matrix holds "
                         "NaN/inf; validate each reply with check_gram first")
    return w.numpy()


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

    ``decide_at`` (e.g. 1.0: do the spaces share a point?) stops as soon as the bracket
    settles the question: the best point's maximum is <= ``decide_at`` (a point in
    every space is found), or the lower bound is above it (no such point exists). The
    returned maximum is then an upper bound on the optimum, not the optimum itself.

    Returns ``(W, max_scaled_distance)``; ``max_scaled_distance <= 1`` means ``W`` lies in
    every node's space. With ``return_info=True`` a third item, a dict with
    ``scaled_distances`` (per node), ``lower_bound`` (a certified lower bound on the
    optimum), ``iterations``, ``converged``, ``weights`` (dual weights, per node) and
    ``excluded`` (indices of nodes with radius 0 or inf).

    Method: the convex problem ``min_W max_k q_k(W)`` with ``q_k = ||W - W_k||^2 / rho_k^2``
    has the dual ``max_{lambda in simplex} g(lambda)``, ``g(lambda) = min_W sum_k
    lambda_k q_k(W)``, whose inner minimiser is the closed-form center with weights
    ``lambda_k / rho_k^2`` and whose gradient is ``q_k(W(lambda))``. Starting from the
    closed form with weights ``1 / rho_k^2`` (uniform ``lambda``), the weights are
    updated multiplicatively toward the worst nodes, ``lambda_k <- lambda_k
    (q_k / g)^beta``, with ``beta`` grown while the dual improves and halved when it
    does not. Weak duality brackets the optimum: ``sqrt(g) <= opt <= sqrt(max_k q_k)``;
    iteration stops when the relative gap is below ``tol`` (or after ``max_iter``) and
    the best primal point is returned.

    Nodes with ``rho_k = 0`` (center failed eps) have infinite scale: they are left out
    of the optimisation and their scaled distance is ``inf`` (0 only at exactly their
    center), so the returned maximum is ``inf``. Nodes with ``rho_k = inf`` impose no
    constraint. With no constrained node left, the equal-weight ``gram_center`` of all
    nodes is returned.
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
        ga = [gs[i] for i in active]
        wa = [ws[i] for i in active]
        inv_r2 = [1.0 / float(r[i]) ** 2 for i in active]
        h = [wk @ gk for wk, gk in zip(wa, ga)]  # W_k G_k, reused every iteration
        c = [float((hk * wk).sum()) for hk, wk in zip(h, wa)]  # tr(W_k G_k W_k^T)
        n = ga[0].shape[0]

        def solve(lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = torch.zeros(n, n, dtype=torch.float64)
            b = torch.zeros(wa[0].shape, dtype=torch.float64)
            for lk, s, gk, hk in zip(lam.tolist(), inv_r2, ga, h):
                if lk > 0.0:
                    a.add_(gk, alpha=lk * s)
                    b.add_(hk, alpha=lk * s)
            w = _solve_right(0.5 * (a + a.T), b)
            q = torch.tensor([qk * s for qk, s in zip(expanded_sq_distances(w, ga, h, c), inv_r2)],
                             dtype=torch.float64)
            return w, q

        lam = torch.full((len(active),), 1.0 / len(active), dtype=torch.float64)
        w, q = solve(lam)
        dual = float((lam * q).sum())
        w_best, primal = w, float(q.max())
        lower, beta = dual, 1.0
        info["converged"] = False
        for it in range(1, max_iter + 1):
            info["iterations"] = it
            if math.sqrt(primal) - math.sqrt(max(lower, 0.0)) <= tol * math.sqrt(primal):
                info["converged"] = True
                break
            if dual <= 0.0:  # every active center coincides with W: optimum 0
                info["converged"] = True
                break
            if decide_at is not None and (primal <= decide_at ** 2 or lower > decide_at ** 2):
                info["decided"] = True
                break
            trial = lam * (q / dual).clamp_min(1e-300) ** beta
            trial = trial / trial.sum()
            w_t, q_t = solve(trial)
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
        full = np.zeros(k)
        full[active] = lam.numpy()
        info["weights"] = full

    scaled = [_scaled(math.sqrt(_sq_dist(w_best, ws[i], gs[i])), float(r[i])) for i in range(k)]
    worst = max(scaled)
    info["scaled_distances"] = np.array(scaled)
    # A lower bound for the nodes with finite positive radius; adding the others only
    # raises the optimum, so it bounds the full problem too.
    info["lower_bound"] = math.sqrt(max(lower, 0.0))
    if return_info:
        return w_best.numpy(), worst, info
    return w_best.numpy(), worst


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
    wt = _center_for("W", w, ws[0].shape[1])
    if wt.shape != ws[0].shape:
        raise ValueError(f"W has shape {tuple(wt.shape)}; the nodes' models have "
                         f"{tuple(ws[0].shape)}")
    out = []
    for wk, gk, rk in zip(ws, gs, r.tolist()):
        dist = math.sqrt(_sq_dist(wt, wk, gk))
        out.append(Membership(dist, rk, dist <= rk * (1.0 + rtol), max(dist - rk, 0.0)))
    return out


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
    ridge: float = 1e-6, point: str = "closed-form", pooled_ridge: float = 1e-3, seed: int = 0,
) -> IntersectionResult:
    """Choose ``h_G`` for the Gram spaces and report membership in each of them.

    ``point``: ``closed-form`` (the weighted center), ``shared`` (the minimax point when
    the center misses a space and that point lies in all), ``pooled`` (the pooled ridge
    classifier from the label moments, :func:`gems_fl.geometry.pooled.pooled_point`) or
    ``best`` (the best pooled fit inside every space, :func:`~gems_fl.geometry.pooled.
    best_point`; the pooled point when the spaces share no point, and ``details`` says so)
    or ``lda`` (the pooled linear discriminant, :func:`~gems_fl.geometry.pooled.pooled_lda`,
    with ``pooled_ridge`` as its shrinkage) or ``gaussian`` (the softmax layer fitted to
    virtual rows of each class's pooled Gaussian, :func:`~gems_fl.geometry.virtual.
    gaussian_point`, with ``pooled_ridge`` as its L2 penalty and ``seed`` fixing the draw;
    it needs every node's class Gram matrices) or ``mixture`` (the same fit to virtual
    rows of every node's k-means components of each class, where nodes sent them).
    """
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
    if point == "lda":  # pooled_ridge is the LDA shrinkage
        chosen, method = _lda_choice(spaces, num_train, pooled_ridge, details), "lda"
    elif point in ("gaussian", "mixture"):  # pooled_ridge is the fit's L2 penalty
        chosen, method = _gaussian_choice(spaces, pooled_ridge, seed, details,
                                          mixture=point == "mixture"), point
    elif point in ("auto", "pooled", "best"):  # auto: the pooled point until the selection round
        chosen, method = _pooled_choice(spaces, num_train, "best" if point == "best" else "pooled",
                                        pooled_ridge, details)
    inside = [s.contains(chosen) for s in spaces]
    if not all(inside) and all(s.radius > 0 for s in spaces) and "spaces_share_a_point" not in details:
        shared, _ = _minimax(spaces, details)
        if point == "shared" and details["spaces_share_a_point"]:
            chosen, method = np.asarray(shared), "shared"
    return gram_result(spaces, chosen, method, details)


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


def _minimax(spaces: Sequence[GramSpace], details: dict) -> tuple[np.ndarray, float]:
    """The minimax point, with what it says about the spaces recorded in ``details``."""
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


def _lda_choice(spaces: Sequence[GramSpace], num_train: Sequence[float], shrinkage: float,
                details: dict) -> np.ndarray:
    """The pooled LDA point (:func:`gems_fl.geometry.pooled.pooled_lda`)."""
    missing = [k for k, s in enumerate(spaces) if s.moments is None]
    if missing:
        raise ValueError(f"gram-point='lda' needs every node's label moments; spaces "
                         f"{missing} have none")
    details["lda_shrinkage"] = float(shrinkage)
    return pooled_lda([s.gram for s in spaces], [s.moments for s in spaces], num_train,
                      shrinkage)


def has_class_grams(spaces: Sequence) -> bool:
    """Whether every space carries its node's class Gram matrices (the ``gaussian`` point)."""
    return all(getattr(s, "class_grams", None) is not None
               and getattr(s, "class_counts", None) is not None for s in spaces)


def has_class_components(spaces: Sequence) -> bool:
    """Whether every space carries class Gram matrices and some node split its classes
    into k-means components (the ``mixture`` point then differs from ``gaussian``)."""
    return has_class_grams(spaces) and any(getattr(s, "class_parts", None) is not None
                                           for s in spaces)


def _gaussian_choice(spaces: Sequence[GramSpace], l2: float, seed: int, details: dict, *,
                     mixture: bool = False) -> np.ndarray:
    """The ``gaussian`` point (:func:`gems_fl.geometry.virtual.gaussian_point`): one
    Gaussian per class over all nodes or, with ``mixture``, one per node's k-means
    component of a class (:mod:`gems_fl.geometry.components`)."""
    if not has_class_grams(spaces):
        missing = [k for k, s in enumerate(spaces) if getattr(s, "class_grams", None) is None]
        raise ValueError(f"gram-point='{'mixture' if mixture else 'gaussian'}' needs every "
                         f"node's class Gram matrices; spaces {missing} have none (set "
                         "class-grams=true)")
    details["gaussian_l2"] = float(l2)
    if mixture:
        counts, means, covs, classes = mixture_moments(
            [s.class_grams for s in spaces], [_parts(s) for s in spaces])
        details["gaussian_components"] = len(counts)
        return gaussian_point(counts, means, covs, l2=l2, seed=seed, classes=classes,
                              num_classes=len(spaces[0].class_counts))
    counts, means, covs = pooled_class_moments([s.per_class_grams for s in spaces],
                                               [s.class_counts for s in spaces])
    return gaussian_point(counts, means, covs, l2=l2, seed=seed)


def _parts(space: GramSpace) -> np.ndarray:
    """A space's components ``[class, rows]``: one per class held where it sent none."""
    if space.class_parts is not None:
        return space.class_parts
    counts = np.asarray(space.class_counts)
    held = np.flatnonzero(counts > 0)
    return np.stack([held, counts[held]], axis=1)


def _pooled_choice(spaces: Sequence[GramSpace], num_train: Sequence[float], point: str,
                   pooled_ridge: float, details: dict) -> tuple[np.ndarray, str]:
    """The ``pooled`` or ``best`` point, and the method that says which one was used."""
    missing = [k for k, s in enumerate(spaces) if s.moments is None]
    if missing:
        raise ValueError(f"gram-point='{point}' needs every node's label moments; spaces "
                         f"{missing} have none")
    grams, moments = [s.gram for s in spaces], [s.moments for s in spaces]
    pooled = pooled_point(grams, moments, num_train, pooled_ridge)
    details["pooled_ridge"] = float(pooled_ridge)
    if point == "pooled":
        return pooled, "pooled"
    if all(s.contains(pooled) for s in spaces):
        details["best"] = "the pooled point lies in every space"
        return pooled, "best"
    if not all(s.radius > 0 for s in spaces):
        details["best"] = "a node's radius is 0 (its model fails its eps): pooled point used"
        return pooled, "pooled"
    shared, _ = _minimax(spaces, details)
    if not details["spaces_share_a_point"]:
        details["best"] = "the spaces share no point (or it was not found): pooled point used"
        return pooled, "pooled"
    best, info = best_point([s.matrix for s in spaces], grams, [s.radius for s in spaces],
                            moments, num_train, ridge=pooled_ridge, feasible=shared)
    details["best"] = (f"best pooled fit inside every space ({info['iterations']} dual "
                       f"iterations, step {info['blend']:.3g} toward the minimax point)")
    details["multipliers"] = info["multipliers"]
    return best, "best"
