"""Find the aggregate model ``h_G`` in the intersection of good-enough model spaces.

The paper (section 3.1, eq. 2) picks ``h_G = argmin_w sum_k max(0, ||c_k - w|| - r_k)``,
which is zero exactly on the intersection. Minimising that non-smooth objective by
gradient descent stops, at best, on the boundary of the intersection, where
floating-point membership checks can go either way, and which point it returns is an
accident of the optimiser's path.

Here the primary method is instead Dykstra's alternating projections onto the spaces
with radii shrunk by ``(1 - shrink)``: it converges to the point of the (shrunk)
intersection nearest to the mean of the centers, i.e. the model-averaging baseline moved
as little as possible to become good-enough for every node, and the shrinkage puts the
point strictly inside the true spaces so that :meth:`Space.contains` verifies it. The
paper's objective is kept as the fallback when no intersection is found.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gems_fl.geometry.checks import check_option, check_scalar
from gems_fl.geometry.choices import NO_INTERSECTION_FALLBACKS as FALLBACKS
from gems_fl.geometry.spaces import Space, within_radius

# Relative margin by which the emptiness certificate must be negative to count.
_CERTIFICATE_RTOL = 1e-9

# The first Dykstra attempt gives up (and hands over to the retry with a smaller
# shrink) when its best objective has not dropped by _STALL_GAIN (relative) over
# _STALL_WINDOW sweeps: the usual sign of a shrunk intersection that is empty or too
# thin to converge to, long before the emptiness certificate can prove it. The retry
# has no such test, because Dykstra can also sit on a plateau for hundreds of sweeps
# before moving on to a feasible point.
_STALL_WINDOW = 100
_STALL_GAIN = 1e-2

# The subgradient fallback stops once its best objective improved by less than
# _FALLBACK_STALL_GAIN (relative) over _FALLBACK_STALL_WINDOW steps: its diminishing
# steps then buy too little to be worth the time (measured against SLSQP on small
# disjoint problems, the objective is typically within 1e-5 relative of the optimum).
_FALLBACK_STALL_WINDOW = 500
_FALLBACK_STALL_GAIN = 1e-6

_RETRY_SHRINK_FACTOR = 1e-3

_NEWTON_MAX_ITER = 100
_NEWTON_RTOL = 1e-13


@dataclass
class IntersectionResult:
    """Outcome of :func:`find_intersection`.

    Attributes
    ----------
    point : np.ndarray
        The aggregate model ``h_G``, shape ``(d,)``.
    found : bool
        True only if ``point`` was verified with :meth:`Space.contains` to lie in every
        space.
    method : str
        ``"dykstra"`` or ``"min-penalty"`` when found; otherwise the fallback used
        (``"min-penalty"`` or ``"mean"``).
    objective : float
        The paper's objective ``sum_k penalty_k(point)``, exact (no tolerance), so it
        can be a rounding-level positive number even when ``found``.
    inside : list of bool
        Per space, whether ``point`` is in it (:meth:`Space.contains`).
    miss : list of float
        Per space, ``penalty_k(point) = max(0, distance_k - radius_k)``, reported as 0
        when ``inside`` (i.e. within :meth:`Space.contains`'s tolerance).
    iterations : int
        Dykstra sweeps run, plus the optimiser steps of the ``"min-penalty"`` fallback
        when it ran.
    """

    point: np.ndarray
    found: bool
    method: str
    objective: float
    inside: list[bool]
    miss: list[float]
    iterations: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly summary (plain Python types); ``point`` is omitted."""
        return {
            "found": bool(self.found),
            "method": str(self.method),
            # None: not known on the server (server-grams=sums and a node did not answer)
            "objective": None if math.isnan(self.objective) else float(self.objective),
            "inside": [None if v is None else bool(v) for v in self.inside],
            "miss": [None if v is None else float(v) for v in self.miss],
            "iterations": int(self.iterations),
            **self.details,
        }


class _Stacked:
    """The spaces as ``(K, d)`` arrays: distances to all of them in one numpy op."""

    def __init__(self, spaces: Sequence[Space]) -> None:
        self.spaces = list(spaces)
        self.centers = np.stack([s.center for s in spaces])
        self.axes = np.stack(
            [np.ones_like(s.center) if s.axes is None else s.axes for s in spaces]
        )
        self.radii = np.array([s.radius for s in spaces], dtype=np.float64)

    def diffs(self, w: np.ndarray) -> np.ndarray:
        # Divide (not multiply by reciprocals) to round like Space.distance does.
        return (w[None, :] - self.centers) / self.axes

    def distances(self, w: np.ndarray) -> np.ndarray:
        return np.linalg.norm(self.diffs(w), axis=1)

    def penalties(self, w: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, self.distances(w) - self.radii)

    def objective(self, w: np.ndarray) -> float:
        return float(self.penalties(w).sum())

    def likely_inside(self, dist: np.ndarray) -> bool:
        # Space.contains's test, for all spaces at once; the authoritative check is
        # verify(), this one only decides whether to run it.
        return bool(np.all(within_radius(dist, self.radii)))

    def verify(self, w: np.ndarray) -> bool:
        return all(s.contains(w) for s in self.spaces)


def _validate(spaces: Sequence[Space]) -> list[Space]:
    spaces = list(spaces)
    if not spaces:
        raise ValueError("spaces is empty: pass at least one Space to intersect")
    for i, s in enumerate(spaces):
        if not isinstance(s, Space):
            raise TypeError(
                f"spaces[{i}] is a {type(s).__name__}, expected gems_fl.geometry.spaces.Space"
            )
    shape0 = spaces[0].center.shape
    for i, s in enumerate(spaces):
        if s.center.shape != shape0:
            raise ValueError(
                f"spaces[{i}] has dimension {s.center.shape}, but spaces[0] has "
                f"{shape0}: all spaces must live in the same parameter space"
            )
        if not np.all(np.isfinite(s.center)):
            raise ValueError(
                f"spaces[{i}].center has non-finite values: the node's model diverged "
                "or was corrupted; drop that node or retrain it"
            )
    return spaces


def _project_ball(y: np.ndarray, center: np.ndarray, radius: float) -> np.ndarray:
    z = y - center
    norm = float(np.linalg.norm(z))
    if norm <= radius:
        return y
    return center + z * (radius / norm)


def _project_ellipsoid(
    y: np.ndarray, center: np.ndarray, semi: np.ndarray, lam0: float
) -> tuple[np.ndarray, float]:
    """Euclidean projection onto ``{x : sum_i ((x_i - c_i) / s_i)^2 <= 1}``.

    The projection is ``x_i = c_i + z_i s_i^2 / (s_i^2 + lam)`` with ``z = y - c`` and
    ``lam >= 0`` the root of ``||u(lam)|| = 1``, ``u_i = z_i s_i / (s_i^2 + lam)``.
    Newton is run on ``psi(lam) = 1 / ||u(lam)||`` (as in Moré-Sorensen's trust-region
    solver): ``psi`` is concave and increasing, nearly linear (exactly so for a ball),
    so Newton converges fast; a bracket ``[lo, hi]`` guards it and a step leaving the
    bracket is replaced by a bisection (geometric when ``lo > 0``). Each iteration is
    ``O(d)`` numpy work. ``lam0`` (the previous sweep's root) warm-starts the search.

    Returns the projection and the root ``lam`` (0 when ``y`` is already inside).
    """
    z = y - center
    if float(np.sum((z / semi) ** 2)) <= 1.0:
        return y, 0.0
    a2 = (z * semi) ** 2
    b = semi * semi
    znorm = float(np.linalg.norm(z))
    smin, smax = float(semi.min()), float(semi.max())
    # ||u(lam)|| <= ||z|| s_max / lam and >= ||z|| s_min / (s_max^2 + lam).
    lo = max(0.0, znorm * smin - smax * smax)
    hi = znorm * smax
    lam = min(max(lam0, lo), hi)
    for _ in range(_NEWTON_MAX_ITER):
        denom = b + lam
        n2 = float(np.sum(a2 / denom**2))
        psi = 1.0 / math.sqrt(n2)
        if abs(psi - 1.0) <= _NEWTON_RTOL:
            break
        if psi < 1.0:
            lo = lam
        else:
            hi = lam
        if hi - lo <= _NEWTON_RTOL * hi:
            break
        dpsi = float(np.sum(a2 / denom**3)) * n2**-1.5
        new = lam - (psi - 1.0) / dpsi if dpsi > 0 else -1.0
        if not lo < new < hi:
            new = math.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi)
        lam = new
    return center + z * (b / (b + lam)), lam


def _empty_certificate(
    stacked: _Stacked, normals: np.ndarray, radii: np.ndarray
) -> bool:
    """Whether ``normals`` (``(K, d)``) prove the spaces with ``radii`` disjoint.

    For any ``v_k`` summing to zero, a common point ``z`` would give
    ``0 = sum_k <v_k, z> <= sum_k sigma_k(v_k)`` with the support function
    ``sigma_k(v) = <v, c_k> + r_k ||a_k * v||``; a negative sum is therefore a proof of
    emptiness (``v_k`` is ``normals[k]`` minus their mean). Dykstra's corrections are
    outward normals of their spaces and, on disjoint spaces, grow along a separating
    pattern, so they or their change over a sweep turn the sum negative; on
    intersecting spaces no vectors can. ``O(K d)``.
    """
    v = normals - normals.mean(axis=0)
    lin = np.einsum("kd,kd->k", v, stacked.centers)
    spread = radii * np.linalg.norm(v * stacked.axes, axis=1)
    total = float(lin.sum() + spread.sum())
    # Margin for the rounding in the K * d products behind ``total``.
    scale = float(np.abs(lin).sum() + spread.sum())
    return total < -_CERTIFICATE_RTOL * scale


def _dykstra(
    stacked: _Stacked,
    x0: np.ndarray,
    shrink: float,
    max_iter: int,
    order: list[int],
    stall: bool,
) -> tuple[str, np.ndarray, int, np.ndarray, float]:
    """Dykstra's cyclic projections from ``x0`` onto the shrunk spaces.

    Returns ``(status, x, sweeps, best_x, best_objective)``. ``status`` is ``"found"``
    (``x`` verified inside every true space), ``"empty"`` (the true spaces are proven
    disjoint), ``"shrunk-empty"`` (only the shrunk ones are), ``"stalled"`` (only
    with ``stall``, see ``_STALL_WINDOW``) or ``"budget"``; ``best_x`` is the sweep end
    point with the smallest true objective seen.
    """
    spaces = stacked.spaces
    radii = stacked.radii * (1.0 - shrink)
    semis = [None if s.axes is None else s.axes * r for s, r in zip(spaces, radii)]
    lams = [0.0] * len(spaces)
    incr = np.zeros_like(stacked.centers)
    x = x0.copy()
    best_x, best_f = x0, stacked.objective(x0)
    history: list[float] = []
    for sweep in range(1, max_iter + 1):
        prev_incr = incr.copy()
        for k in order:
            y = x + incr[k]
            if radii[k] == 0.0:
                x = spaces[k].center.copy()
            elif semis[k] is None:
                x = _project_ball(y, spaces[k].center, float(radii[k]))
            else:
                x, lams[k] = _project_ellipsoid(y, spaces[k].center, semis[k], lams[k])
            incr[k] = y - x
        dist = stacked.distances(x)
        if stacked.likely_inside(dist) and stacked.verify(x):
            return "found", x, sweep, x, 0.0
        f = float(np.maximum(0.0, dist - stacked.radii).sum())
        if f < best_f:
            best_x, best_f = x, f
        # The change over a sweep drops the corrections' start-up transient, which
        # otherwise hides the separation of nearly touching spaces for ~1/gap sweeps.
        for normals in (incr, incr - prev_incr):
            if _empty_certificate(stacked, normals, radii):
                status = (
                    "empty"
                    if _empty_certificate(stacked, normals, stacked.radii)
                    else "shrunk-empty"
                )
                return status, x, sweep, best_x, best_f
        history.append(best_f)
        if (
            stall
            and len(history) > _STALL_WINDOW
            and best_f > (1.0 - _STALL_GAIN) * history[-1 - _STALL_WINDOW]
        ):
            return "stalled", x, sweep, best_x, best_f
    return "budget", x, max_iter, best_x, best_f


def _min_penalty(
    stacked: _Stacked, x0: np.ndarray, steps: int, shrink: float
) -> tuple[np.ndarray, float, int, bool]:
    """Subgradient descent on ``F(w) = sum_k max(0, distance_k(w) - r_k)``.

    Steps along the normalised subgradient with length
    ``min(alpha0 / sqrt(t + 1), (F(w) + delta) / ||g||)``: the diminishing term gives
    the classical convergence guarantee when the spaces are disjoint (``min F > 0``),
    and the Polyak term (target ``-delta``, a hair below the optimum 0 of a feasible
    problem) makes the steps shrink with ``F`` and overshoot slightly into the
    intersection. ``alpha0`` is half the spread of the centers around ``x0``. Keeps the
    best iterate.

    Returns ``(best_w, best_objective, steps_taken, verified_inside)``.
    """
    spread = float(np.max(np.linalg.norm(stacked.centers - x0[None, :], axis=1)))
    alpha0 = 0.5 * spread if spread > 0 else max(float(stacked.radii.max()), 1.0)
    pos = stacked.radii[stacked.radii > 0]
    delta = shrink * float(pos.min()) if pos.size else 0.0
    w = x0.copy()
    best_w, best_f = w, math.inf
    history: list[float] = []
    for t in range(steps):
        diff = stacked.diffs(w)
        dist = np.linalg.norm(diff, axis=1)
        active = dist > stacked.radii
        f = float((dist[active] - stacked.radii[active]).sum())
        if f < best_f:
            best_w, best_f = w, f
        if stacked.likely_inside(dist) and stacked.verify(w):
            return w, f, t, True
        history.append(best_f)
        window = _FALLBACK_STALL_WINDOW
        if (
            len(history) > window
            and best_f > (1.0 - _FALLBACK_STALL_GAIN) * history[-1 - window]
        ):
            return best_w, best_f, t, False
        # d/dw ||(w - c) / a|| = (w - c) / a^2 / distance, summed over violated spaces.
        g = np.sum(diff[active] / stacked.axes[active] / dist[active, None], axis=0)
        gnorm = float(np.linalg.norm(g))
        if gnorm == 0.0:  # 0 is a subgradient: w minimises F
            return best_w, best_f, t, False
        step = min(alpha0 / math.sqrt(t + 1.0), (f + delta) / gnorm)
        w = w - (step / gnorm) * g
    f = stacked.objective(w)
    if f < best_f:
        best_w, best_f = w, f
    return best_w, best_f, steps, bool(best_f == 0.0 and stacked.verify(best_w))


def _result(
    stacked: _Stacked, point: np.ndarray, found: bool, method: str, iterations: int
) -> IntersectionResult:
    inside = [s.contains(point) for s in stacked.spaces]
    penalties = [s.penalty(point) for s in stacked.spaces]
    return IntersectionResult(
        point=point,
        found=found,
        method=method,
        objective=float(sum(penalties)),
        inside=inside,
        miss=[0.0 if ins else pen for ins, pen in zip(inside, penalties)],
        iterations=iterations,
    )


def find_intersection(
    spaces: Sequence[Space],
    *,
    max_iter: int = 5000,
    shrink: float = 1e-3,
    fallback: str = "min-penalty",
    seed: int = 0,
) -> IntersectionResult:
    """Pick the aggregate model ``h_G`` in the intersection of ``spaces`` (the nodes'
    good-enough model spaces, all of dimension ``d``).

    1. The mean of the centers (model averaging), as is if it already lies in every space:
       it is its own nearest point of the intersection (``method="dykstra"``,
       ``iterations == 0``).
    2. Otherwise Dykstra's cyclic projections from that mean onto the spaces with radii
       scaled by ``1 - shrink`` (:func:`_dykstra_search`, at most ``max_iter`` sweeps);
       the first point found inside every *true* space (``method="dykstra"``). The
       ``shrink`` in ``[0, 1)`` lets the point survive floating-point verification; a
       space of radius 0 is the single point ``{center}`` regardless. ``seed`` sets the
       projections' cyclic order (:func:`_projection_order`): the limit point does not
       depend on it, only the path to it does.
    3. Otherwise the ``fallback``: ``"min-penalty"`` (:func:`_fallback_point`: at most
       ``max_iter`` subgradient steps, then the candidate with the smallest value of the
       paper's objective ``sum_k max(0, distance_k - r_k)``), ``"mean"`` the mean.

    Returns the point with per-space membership, deterministic for a given input and seed.
    ValueError: no spaces, dimensions differ, a center not finite, an option out of range;
    TypeError: an element not a :class:`Space`, an option not of its type.

    Cost: ``O(K d)`` a sweep for balls, ``O(K d n)`` for ellipsoids (``n`` Newton steps of
    the projection's multiplier), memory ``O(K d)``; a few dozen sweeps where the spaces
    meet comfortably (K=5, d=7850: milliseconds), up to about 1.5 s in the fallback.
    """
    spaces = _validate(spaces)
    check_option(fallback, "fallback", FALLBACKS)
    max_iter = check_scalar(max_iter, "max_iter", int, low=0)
    shrink = check_scalar(shrink, "shrink", float, low=0, high=1, closed="left")
    seed = check_scalar(seed, "seed", int)

    stacked = _Stacked(spaces)
    mean = stacked.centers.mean(axis=0)
    if stacked.verify(mean):
        return _result(stacked, mean, True, "dykstra", 0)
    found, x, sweeps, best_x, best_f = _dykstra_search(
        stacked, mean, shrink, max_iter, _projection_order(spaces, seed))
    if found:
        return _result(stacked, x, True, "dykstra", sweeps)
    if fallback == "mean":
        return _result(stacked, mean, False, "mean", sweeps)
    return _fallback_point(stacked, mean, max_iter, shrink, sweeps, best_x, best_f)


def _projection_order(spaces: Sequence[Space], seed: int) -> list[int]:
    """The cyclic order of the projections: ``seed`` 0 keeps the given order, any other
    value a fixed random permutation of it. Spaces of radius 0 always come last, so that a
    sweep ends exactly on their center."""
    order = list(range(len(spaces)))
    if seed != 0:
        order = [int(i) for i in np.random.default_rng(seed).permutation(len(spaces))]
    return [k for k in order if spaces[k].radius > 0] + [
        k for k in order if spaces[k].radius == 0
    ]


def _dykstra_search(
    stacked: _Stacked, mean: np.ndarray, shrink: float, max_iter: int, order: list[int]
) -> tuple[bool, np.ndarray, int, np.ndarray, float]:
    """Dykstra's cyclic projections, started at ``mean``, onto the spaces with radii scaled
    by ``1 - shrink``: ``(found, point, sweeps, best point, its objective)``.

    They converge to the point of the shrunk intersection nearest to the mean; after each
    sweep the current point is checked against the *true* spaces with
    :meth:`Space.contains`, and the first point inside all of them is returned. Also after
    each sweep, Dykstra's correction terms are tested as a certificate that the spaces are
    disjoint (``_empty_certificate``; on disjoint spaces it fires within a few sweeps).
    Proven-disjoint true spaces end the search. If only the shrunk spaces are proven
    disjoint, or the best objective has not dropped by 1% over 100 sweeps, the
    intersection may be thinner than ``shrink`` of a radius (near-tangent spaces), and
    Dykstra is restarted once with ``shrink * 1e-3``; that run stops only at a point
    inside, a certificate, or the budget. Both runs together make at most ``max_iter``
    sweeps.
    """
    sweeps, best_x, best_f = 0, mean, stacked.objective(mean)
    retry = shrink > 0
    for attempt_shrink in (shrink, shrink * _RETRY_SHRINK_FACTOR):
        status, x, used, cand_x, cand_f = _dykstra(
            stacked, mean, attempt_shrink, max_iter - sweeps, order, stall=retry
        )
        sweeps += used
        if status == "found":
            return True, x, sweeps, best_x, best_f
        if cand_f < best_f:
            best_x, best_f = cand_x, cand_f
        if not (retry and status in ("shrunk-empty", "stalled")):
            break
        retry = False
    return False, mean, sweeps, best_x, best_f


def _fallback_point(
    stacked: _Stacked, mean: np.ndarray, max_iter: int, shrink: float, sweeps: int,
    best_x: np.ndarray, best_f: float,
) -> IntersectionResult:
    """The ``"min-penalty"`` fallback: up to ``max_iter`` steps of subgradient descent on
    the paper's objective from the mean (stopping once 500 steps gain less than 1e-6
    relative); an iterate verified inside every space is returned with ``found=True``,
    otherwise the candidate (mean, best subgradient iterate, best Dykstra sweep end
    ``best_x``) with the smallest objective."""
    w, f, steps, inside = _min_penalty(stacked, mean, max_iter, shrink)
    if inside:
        return _result(stacked, w, True, "min-penalty", sweeps + steps)
    # Strict comparisons keep the earlier candidate on ties: mean, then subgradient.
    point, point_f = mean, stacked.objective(mean)
    for cand, cand_f in ((w, f), (best_x, best_f)):
        if cand_f < point_f:
            point, point_f = cand, cand_f
    return _result(stacked, point, False, "min-penalty", sweeps + steps)


def membership_report(
    spaces: Sequence[Space], point: np.ndarray
) -> list[dict[str, Any]]:
    """Per-space membership of ``point``.

    Parameters
    ----------
    spaces : sequence of Space
        Spaces of a common dimension ``d``.
    point : np.ndarray
        A model, shape ``(d,)`` (flattened if not).

    Returns
    -------
    list of dict
        Per space, in order: ``{"inside": bool, "distance": float, "radius": float,
        "miss": float}`` with ``miss = max(0, distance - radius)``, or 0 when
        ``inside`` (within :meth:`Space.contains`'s tolerance), as in
        :class:`IntersectionResult`.
    """
    spaces = _validate(spaces)
    w = np.asarray(point, dtype=np.float64).reshape(-1)
    if w.shape != spaces[0].center.shape:
        raise ValueError(
            f"point has {w.shape[0]} parameters but the spaces have "
            f"{spaces[0].dim}: pass a flattened model of the same architecture"
        )
    report = []
    for s in spaces:
        dist = s.distance(w)
        inside = bool(s.contains(w))
        report.append(
            {
                "inside": inside,
                "distance": dist,
                "radius": s.radius,
                "miss": 0.0 if inside else max(0.0, dist - s.radius),
            }
        )
    return report
