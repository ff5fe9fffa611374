"""Do balls share a point? Exact tests from squared center distances alone.

The pre-checks and the dual test of the layer merge's greedy pass
(:mod:`gems_fl.geometry.greedy_merge`): the squared distances of a set of centers with a
bound on their rounding error, the closed-form three-ball test, and the general dual
test over the simplex (Sion's minimax theorem), which either proves a set of balls
disjoint or yields a common point. Numpy only; no Space objects.
"""

from __future__ import annotations

import numpy as np


def squared_distances(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Squared distances between the rows of ``c`` and a bound on their error.

    From the Gram matrix of the centred rows (one ``(n, d) @ (d, n)`` product). The
    bound covers the dot products (``~d`` ulps of the squared norms) and the rounding
    of the centring itself (a vector error of at most ``delta = 4 sqrt(d) eps
    max|c|`` per difference, hence ``2 D delta + delta^2`` on ``D^2``), with a
    factor 2 of headroom.
    """
    n, d = c.shape
    eps = np.finfo(np.float64).eps
    c0 = c - c.mean(axis=0)
    sq = np.einsum("ij,ij->i", c0, c0)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (c0 @ c0.T), 0.0)
    np.fill_diagonal(d2, 0.0)
    norms = np.sqrt(sq)
    delta = 4.0 * np.sqrt(d) * eps * float(np.abs(c).max(initial=0.0))
    err2 = 2.0 * (
        (d + 2) * eps * (sq[:, None] + sq[None, :])
        + 2.0 * (norms[:, None] + norms[None, :]) * delta
        + delta * delta
    )
    return d2, err2 + np.finfo(np.float64).tiny


def three_balls_meet(
    d2_ab: np.ndarray,
    d2_aj: np.ndarray,
    d2_bj: np.ndarray,
    r_a: np.ndarray,
    r_b: np.ndarray,
    r_j: np.ndarray,
    err2: np.ndarray,
) -> np.ndarray:
    """Necessary test that three balls have a common point (broadcasts elementwise).

    The three-ball case of :func:`ball_dual`, in closed form: the balls are disjoint
    iff ``phi(l) = 1/2 l^T D2 l - l^T r^2 > 0`` for some ``l`` in the simplex. With
    ``l = (1 - s - t, s, t)``, ``phi`` is a quadratic in ``(s, t)`` whose Hessian
    ``[[-2 A, C - A - B], [C - A - B, -2 B]]`` (``A = d2_ab, B = d2_aj, C = d2_bj``) has
    determinant ``4 A B - (A + B - C)^2 = 16 area^2``: negative definite unless the
    centers are collinear. The stationary point, clipped to the simplex, is evaluated;
    a value above the error margin proves the three balls disjoint. (When every pair
    overlaps, the maximum of ``phi`` over the simplex is interior, so this finds every
    disjoint triple of non-collinear centers.)

    ``err2`` bounds the error of the squared distances: ``phi`` moves by at most
    ``err2 / 2`` (the weights of the three products sum to at most 1/3); the margin adds
    ``1e-12`` of the scale for the arithmetic. The test may answer True for three balls
    that do not meet, never False for three that do.
    """
    a, b, c = d2_ab, d2_aj, d2_bj
    ra2, rb2, rj2 = r_a * r_a, r_b * r_b, r_j * r_j
    gs = a - rb2 + ra2  # gradient of phi at l = (1, 0, 0) along s and t
    gt = b - rj2 + ra2
    m = a + b - c
    det = 4.0 * a * b - m * m
    with np.errstate(divide="ignore", invalid="ignore"):
        s = (2.0 * b * gs - m * gt) / det
        t = (2.0 * a * gt - m * gs) / det
    good = det > 0
    s = np.where(good, s, 1.0 / 3.0)
    t = np.where(good, t, 1.0 / 3.0)
    l0, l1, l2 = np.maximum(1.0 - s - t, 0.0), np.maximum(s, 0.0), np.maximum(t, 0.0)
    tot = l0 + l1 + l2
    l0, l1, l2 = l0 / tot, l1 / tot, l2 / tot
    phi = l0 * l1 * a + l0 * l2 * b + l1 * l2 * c - (l0 * ra2 + l1 * rb2 + l2 * rj2)
    scale = np.maximum(np.maximum(a, b), c) + np.maximum(np.maximum(ra2, rb2), rj2)
    return ~(phi > 0.5 * err2 + 1e-12 * scale)


def ball_dual(
    d2: np.ndarray,
    r2: np.ndarray,
    lam0: np.ndarray,
    err2: float,
    max_iter: int,
    optimize: bool = False,
) -> tuple[str, np.ndarray, int]:
    """Decide whether balls meet from their squared center distances alone.

    Balls ``B(c_k, r_k)`` have a common point iff

        ``max over lam in the simplex of  phi(lam) = 1/2 lam^T D2 lam - lam^T r^2 <= 0``

    (Sion's minimax theorem on ``sum_k lam_k (||w - c_k||^2 - r_k^2)``, convex in
    ``w`` and linear in ``lam``; for fixed ``lam`` the minimum over ``w`` is at the
    weighted mean ``w = sum_k lam_k c_k``). ``phi`` is concave on the simplex, since a
    Euclidean distance matrix is negative semidefinite on zero-sum vectors. Hence, for
    any ``lam``: ``phi(lam) > 0`` proves the balls disjoint, and the weighted mean,
    whose squared power distances ``||w - c_k||^2 - r_k^2 = (D2 lam)_k - 1/2 lam^T D2
    lam - r_k^2`` are known from ``D2`` alone, is a common point if their maximum
    ``P(lam)`` is negative. ``P(lam) - phi(lam)`` is the Frank-Wolfe gap, which pairwise
    Frank-Wolfe steps with exact line search (weight moved from the least to the most
    violated ball) drive to zero. Each step is ``O(g^2)`` for ``g`` balls, with no
    dependence on the dimension ``d``.

    ``err2`` bounds the error of the entries of ``d2``: ``phi`` and ``P`` are then off
    by at most ``err2 / 2`` and ``3 err2 / 2``; both tests keep that margin.

    With ``optimize`` the steps go on after the first weighted mean inside, until the
    gap is below ``1e-4`` of ``|phi|``: ``lam @ centers`` then approximates the
    *power center* ``argmin_w max_k (||w - c_k||^2 - r_k^2)``, the common point with
    the largest worst-case squared margin (its margin within 0.01 % of the best).

    Returns ``(verdict, lam, steps)`` with verdict ``"empty"`` (proven disjoint),
    ``"point"`` (the weighted mean ``lam @ centers`` should be inside every ball, to be
    verified by the caller) or ``"unknown"`` (within the error margin of tangency, or
    out of steps).
    """
    scale = float(d2.max(initial=0.0) + r2.max(initial=0.0))
    tol = 1e-12 * scale
    lam = lam0.astype(np.float64, copy=True)
    inside = False
    for step in range(max_iter):
        al = d2 @ lam
        q = 0.5 * float(lam @ al)
        grad = al - r2
        phi = q - float(lam @ r2)
        if phi > 0.5 * err2 + tol:
            return "empty", lam, step
        big = int(np.argmax(grad))
        inside = bool(grad[big] - q < -(1.5 * err2 + tol))
        if inside and not optimize:
            return "point", lam, step
        support = np.flatnonzero(lam > 0)
        small = int(support[np.argmin(grad[support])])
        gap = float(grad[big] - grad[small])
        if gap <= max(1e-15 * scale, (1e-4 * abs(phi)) if optimize else 0.0):
            break
        curv = float(d2[big, small])
        t = float(lam[small])
        if curv > 0:
            t = min(t, gap / (2.0 * curv))
        lam[big] += t
        lam[small] -= t
    else:
        step = max_iter
    if optimize:
        al = d2 @ lam
        inside = bool((al - r2).max() - 0.5 * float(lam @ al) < -(1.5 * err2 + tol))
    return ("point" if inside else "unknown"), lam, step
