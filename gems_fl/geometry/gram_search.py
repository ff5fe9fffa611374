"""Radius search for a logit-space (Gram) space: the batched bisection in the metric ``G``.

Directions are drawn uniform on the surface of the node's own ellipsoid (whitened by
``G``, restricted to its range); every bisection step compares ``(N, p)`` numbers. Radii
are in logit units (RMS of the L2 change of the logit vector), not weight units: see
``DEFAULT_R_MAX``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from gems_fl.geometry.eps import check_eps, pass_count
from gems_fl.geometry.linalg import (
    EIGEN_FLOOR,
    augment,
    center_for,
    label_indices,
    metric_for,
    range_basis,
    square_matrix,
)
from gems_fl.geometry.radius import RadiusResult, bisect_radius, margin_intervals
from gems_fl.geometry.whitening import Whitening, eigen_whitening

#: Default upper end of the radius bisection, in logit units (RMS of the L2 logit
#: change). Trained softmax layers have logit margins of order 1 to 20; a change of
#: RMS 100 in every logit vector is far beyond what keeps any useful accuracy, so a
#: search that still passes at 100 is reported as ``saturated`` instead of guessed.
DEFAULT_R_MAX = 100.0
#: Default bisection width, in the same logit units: 1e-4 of ``DEFAULT_R_MAX``,
#: i.e. 14 bisection steps; each step costs an (N, p) comparison only.
DEFAULT_DELTA = 0.01
#: Default number of surface directions ``p`` (as in the weight-space search).
DEFAULT_NUM_DIRECTIONS = 500

def _whitened_draws(num: int, size: int, seed: int) -> torch.Tensor:
    """``(num, size)`` rows uniform on the unit sphere, seeded, float64."""
    gen = torch.Generator().manual_seed(int(seed))
    # float32 normal draws are cheaper and just as good as random directions.
    u = torch.randn(num, size, generator=gen).to(torch.float64)
    return u / torch.linalg.vector_norm(u, dim=1, keepdim=True)


def _check_search_ints(num_directions: int) -> None:
    if not isinstance(num_directions, (int, np.integer)) or num_directions < 1:
        raise ValueError(f"num_directions must be a positive integer; got {num_directions!r}")


def sample_gram_directions(
    num_directions: int, shape: tuple[int, int], g: np.ndarray, seed: int,
    *, floor: float = EIGEN_FLOOR,
) -> np.ndarray:
    """``p`` directions ``D`` with ``tr(D G D^T) = 1``, shape ``(p, C, n)``, float64.

    With ``G = V diag(lambda) V^T`` restricted to eigenvalues above ``floor * max``
    (``m`` of them), ``D = (U diag(lambda)^(-1/2)) V_m^T`` with ``U`` ``(C, m)`` uniform on
    the unit sphere. ``D G^(1/2)`` -- the logit change the direction causes, in the
    node's whitened input coordinates -- is thus uniform on the unit sphere: "uniform on
    the surface" in the geometry the space is defined by.

    Null space: along an eigenvector with (numerically) zero eigenvalue no logit on the
    node's training inputs changes, so the ellipsoid is unbounded there and there is no
    unit length to scale a direction by (``tr(D G D^T) = 0``). Such moves may well
    change logits on *other* inputs (the validation set, the test set); but the space is
    defined by the training inputs, and the boundary the radius search probes exists
    only in the range of ``G``. Directions therefore live in that range; the server's
    aggregation fixes the null-space components (ridge / minimum norm).

    Deterministic for a given ``seed`` (``torch.Generator``) and ``G``.
    """
    _check_search_ints(num_directions)
    classes, n = int(shape[0]), int(shape[1])
    gt = square_matrix("G", g, n)
    lam, vec = range_basis(gt, floor)
    u = _whitened_draws(num_directions, classes * len(lam), seed)
    u = u.reshape(num_directions, classes, len(lam)) / lam.sqrt()
    return (u @ vec.T).numpy()


# --------------------------------------------------------------------- radius search


@dataclass(frozen=True)
class GramRadiusResult(RadiusResult):
    """Outcome of one Gram radius search (radii in logit units, metric ``G``).

    ``radius`` is the largest radius that was tested and at which every sampled
    direction kept accuracy >= eps (0 when the center itself fails). ``saturated``:
    ``r_max`` itself passed, so the true radius may be larger. ``failed_radius`` is the
    smallest tested radius at which some direction failed (``inf`` when none failed), so
    ``failed_radius - radius <= delta`` when not saturated. ``rank`` is the number of
    eigen-directions of ``G`` the directions span, per class.
    """

    failed_radius: float = math.inf
    rank: int = 0


def _check_search_options(num_directions: int, r_max: float, delta: float) -> None:
    _check_search_ints(num_directions)
    if not (math.isfinite(r_max) and r_max > 0):
        raise ValueError(f"r_max must be a positive finite radius (logit units); got {r_max}")
    if not (math.isfinite(delta) and delta > 0):
        raise ValueError(f"delta must be a positive bisection width; got {delta}")


def _min_count(lo: torch.Tensor, hi: torch.Tensor, n_clean: int, radius: float) -> int:
    """The fewest validation rows correct at ``radius`` over the directions (the clean
    rows, the first ``n_clean``, have ``lo = 0``)."""
    count = torch.count_nonzero(hi[:, :n_clean] >= radius, dim=1)
    if n_clean < lo.shape[1]:
        rest = (lo[:, n_clean:] <= radius) & (hi[:, n_clean:] >= radius)
        count = count + torch.count_nonzero(rest, dim=1)
    return int(count.min())


def _sample_intervals(xw: torch.Tensor, z0: torch.Tensor, yt: torch.Tensor, u: torch.Tensor,
                      classes: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """For every direction (rows of ``u``, ``classes`` at a time) and validation row, the
    interval ``[lo, hi]`` of radii where the row stays correct, ``(p, N)`` each, rows
    reordered clean first; and the number of clean rows.

    "Clean" rows are correct at the center with every other class strictly behind. Their
    interval is ``[0, hi]`` with ``hi = 1 / max_c max(0, (s_c - s_y) / m_c)``, ``s`` the
    logit slope: one subtraction, one product and one max per entry. The others (wrong at
    the center, or tied) take the general interval computation.
    """
    num = xw.shape[0]
    num_directions = u.shape[0] // classes
    idx = yt.view(-1, 1)
    margin = z0.gather(1, idx) - z0  # (N, C): >= 0 means correct against class c
    off = torch.ones_like(margin, dtype=torch.bool).scatter_(1, idx, False)
    clean = torch.where(off, margin, torch.ones(())).gt(0).all(dim=1)
    # Clean rows first, so that both groups are contiguous slices (the accuracy counts
    # sum over rows and do not care about their order).
    order = torch.argsort((~clean).to(torch.uint8), stable=True)
    n_clean = int(clean.sum())
    xw, margin, off, idx = xw[order], margin[order], off[order], idx[order]
    inv_margin = torch.where(off, 1.0 / margin, torch.zeros(()))[:n_clean].unsqueeze(1)
    o_margin = margin[n_clean:].unsqueeze(1)
    # (p, N) layout: each bisection step reduces along contiguous rows.
    lo = torch.zeros(num_directions, num, dtype=torch.float64)
    hi = torch.empty_like(lo)
    for start in range(0, num_directions, chunk):
        stop = min(start + chunk, num_directions)
        slopes = (xw @ u[start * classes: stop * classes].T).reshape(num, -1, classes)
        at_y = slopes.gather(2, idx.view(-1, 1, 1).expand(-1, stop - start, 1))
        if n_clean:
            rate = ((slopes[:n_clean] - at_y[:n_clean]) * inv_margin).amax(dim=2)
            hi[start:stop, :n_clean] = (1.0 / rate.clamp_min(0.0)).T
        if n_clean < num:
            slope = at_y[n_clean:] - slopes[n_clean:]
            lo_o, hi_o = margin_intervals(o_margin, slope)
            lo[start:stop, n_clean:], hi[start:stop, n_clean:] = lo_o.T, hi_o.T
    return lo, hi, n_clean


def search_gram_radius(
    center: np.ndarray, g: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, *, eps: float,
    num_directions: int = DEFAULT_NUM_DIRECTIONS, r_max: float = DEFAULT_R_MAX,
    delta: float = DEFAULT_DELTA, seed: int = 0, floor: float = EIGEN_FLOOR, chunk: int = 64,
    eigen: tuple[torch.Tensor, torch.Tensor] | None = None, whitening: Whitening | None = None,
) -> GramRadiusResult:
    """Largest radius ``R`` in the metric ``G`` such that every sampled model
    ``center + R * D`` (``D`` from ``sample_gram_directions``) keeps validation
    accuracy >= eps.

    Bisection over ``[0, r_max]`` down to width ``delta``; ``r_max`` is tested first and,
    when it passes, returned with ``saturated=True``. Vectorised: the logits of
    ``W + r D`` are ``Z0 + r (Xa D^T)``, so the radii where a row stays correct form an
    interval, computed for all rows and directions in one batched pass
    (:func:`_sample_intervals`, ``chunk`` directions at a time); each bisection step is a
    comparison of ``(N, p)`` numbers. ``Xa D^T`` is ``(Xa W) U^T`` without materialising
    ``D``, ``W`` a whitening of ``G`` (:mod:`gems_fl.geometry.whitening`).

    ``center``: the node's ``(C, d + 1)`` augmented ``[weight | bias]`` matrix; ``g``: its
    ``(d + 1, d + 1)`` Gram matrix (training inputs); ``x_val, y_val``: validation inputs
    ``(N, d)`` and labels; ``eps``: the accuracy a good-enough model keeps;
    ``num_directions, r_max, delta, seed``: see the module defaults. ``eigen``:
    ``torch.linalg.eigh`` of ``g`` as float64 where the caller has it (the node's
    certified radius needs it too); ``whitening``: a whitening of ``g`` (e.g. from the
    factor form without an eigendecomposition), else one from ``eigen``/``eigh(g)``.
    """
    eps = check_eps(eps)
    _check_search_options(num_directions, r_max, delta)
    xa = augment(x_val)
    if len(xa) == 0:
        raise ValueError("the validation set is empty: a radius needs validation data")
    w = center_for("center", center, xa.shape[1])
    gt = metric_for("G", g, xa.shape[1], whitening is not None)
    yt = label_indices(y_val, len(xa), w.shape[0])
    num, classes = len(xa), w.shape[0]
    need = pass_count(eps, num)
    z0 = xa @ w.T
    correct0 = int((z0.argmax(dim=1) == yt).sum())
    center_acc = correct0 / num
    if correct0 < need:
        return GramRadiusResult(0.0, center_acc, False, center_acc, 0, False, 0.0, 0)

    white = whitening if whitening is not None else eigen_whitening(gt, floor, eigen)
    m = white.dim
    xw = white.apply(xa)  # (N, m): whitened inputs
    u = _whitened_draws(num_directions, classes * m, seed).reshape(-1, m)  # (p*C, m)
    lo, hi, n_clean = _sample_intervals(xw, z0, yt, u, classes, chunk)
    b = bisect_radius(partial(_min_count, lo, hi, n_clean), lambda count: count >= need, r_max, delta, correct0)
    return GramRadiusResult(b.radius, center_acc, True, b.score / num, b.steps, b.saturated,
                            b.failed_radius, m)
