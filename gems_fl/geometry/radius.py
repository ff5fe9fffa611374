"""Good-enough radius search for a linear softmax model (the paper's Algorithm 2).

For ``W`` the augmented ``[weight | bias]`` matrix and ``Xa = [X, 1]`` the validation
inputs, the logits of ``W + r U`` are ``Z0 + r (Xa U^T)``: a single matrix product
``Xa @ U^T`` over all ``p`` directions serves every radius of the bisection.

Along one direction the logit margins of sample ``n`` are affine in ``r``, so the set
of radii where ``n`` is classified correctly is an interval ``[lo, hi]``. We compute
those intervals once (a few passes over the ``(N, p, C)`` tensor) and each bisection
step then only compares ``(N, p)`` numbers. The accuracy this gives at radius ``r`` is
exactly the accuracy of the perturbed model ``W + r U`` (ties count as correct).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry.checks import check_scalar
from gems_fl.geometry.eps import check_eps, pass_count
from gems_fl.geometry.linalg import augment


@dataclass(frozen=True)
class RadiusResult:
    """Outcome of one radius search.

    ``radius`` is the largest radius that was tested and at which every sampled
    direction kept accuracy >= eps (0 when the center itself fails).
    """

    radius: float
    center_accuracy: float
    center_passes: bool
    min_accuracy_at_radius: float
    steps: int
    saturated: bool


def sample_directions(
    num_directions: int, shape: tuple[int, int], seed: int, axes: np.ndarray | None = None
) -> torch.Tensor:
    """``p`` directions ``axes * u`` with ``u`` uniform on the unit sphere.

    Points ``center + R * direction`` lie on the surface of the ball (``axes=None``)
    or of the axis-aligned ellipsoid with semi-axes ``R * axes``. Shape ``(p, *shape)``.
    """
    gen = torch.Generator().manual_seed(seed)
    # float32 draws are 3x cheaper than float64 and just as good as random directions.
    u = torch.randn(num_directions, shape[0] * shape[1], generator=gen).to(torch.float64)
    u /= torch.linalg.vector_norm(u, dim=1, keepdim=True)
    if axes is not None:
        u *= torch.as_tensor(axes, dtype=torch.float64).reshape(1, -1)
    return u.reshape(num_directions, *shape)


def correct_intervals(
    z0: torch.Tensor, slopes: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Radii ``[lo, hi]`` (``r >= 0``) where each sample stays correctly classified.

    Parameters
    ----------
    z0 : (N, C) logits at the center.
    slopes : (N, p, C) logit change per unit radius along each direction.
    y : (N,) labels.

    Returns
    -------
    lo, hi : (N, p) each; the sample is correct at ``r`` iff ``lo <= r <= hi``
        (an empty interval has ``lo > hi``).
    """
    idx = y.view(-1, 1)
    margin = z0.gather(1, idx) - z0  # (N, C): >= 0 means correct against class c
    slope = slopes.gather(2, idx.view(-1, 1, 1).expand(-1, slopes.shape[1], 1)) - slopes
    return margin_intervals(margin.unsqueeze(1), slope)  # margin broadcast over directions


def margin_intervals(margin: torch.Tensor, slope: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Radii ``[lo, hi]`` (``r >= 0``) where ``margin + r * slope >= 0`` for every class.

    ``margin`` is ``(N, 1, C)`` (the label's logit minus each class's at the center),
    ``slope`` ``(N, k, C)`` its change per unit radius along each of ``k`` directions.
    Returns ``lo, hi`` of shape ``(N, k)``; the sample is correct at ``r`` iff
    ``lo <= r <= hi`` (an empty interval has ``lo > hi``). Ties count as correct.
    """
    inf = torch.tensor(float("inf"), dtype=slope.dtype)
    # margin + r * slope >= 0: an upper bound where slope < 0, a lower bound where > 0.
    crossing = -margin / slope
    upper = torch.where(slope < 0, crossing, inf)
    lower = torch.where(slope > 0, crossing, torch.zeros((), dtype=slope.dtype))
    never = (slope == 0) & (margin < 0)
    hi = torch.where(never, -inf, upper).amin(dim=2)
    lo = lower.amax(dim=2).clamp_min(0.0)
    return lo, hi


def direction_intervals(
    xa: torch.Tensor, z0: torch.Tensor, y: torch.Tensor, directions: torch.Tensor,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Correct-radius intervals ``(N, p)`` for all directions ``(p, C, F + 1)``.

    The directions go through ``Xa @ U^T`` in chunks so that the ``(N, chunk, C)``
    temporaries stay in cache; the result is the same as one big product.
    """
    num, classes = len(xa), z0.shape[1]
    flat = directions.reshape(-1, xa.shape[1])  # (p * C, F + 1)
    lo = torch.empty(num, len(directions), dtype=torch.float64)
    hi = torch.empty_like(lo)
    for start in range(0, len(directions), chunk):
        stop = min(start + chunk, len(directions))
        slopes = (xa @ flat[start * classes : stop * classes].T).reshape(num, -1, classes)
        lo[:, start:stop], hi[:, start:stop] = correct_intervals(z0, slopes, y)
    return lo, hi


def direction_counts(lo: torch.Tensor, hi: torch.Tensor, radius: float) -> torch.Tensor:
    """Correct samples of every direction at ``radius`` from precomputed intervals: ``(p,)``."""
    return torch.count_nonzero((lo <= radius) & (radius <= hi), dim=0)


def direction_accuracies(lo: torch.Tensor, hi: torch.Tensor, radius: float) -> torch.Tensor:
    """Accuracy of every direction at ``radius`` from precomputed intervals: ``(p,)``."""
    return direction_counts(lo, hi, radius).to(torch.float64) / lo.shape[0]


def perturbed_accuracies(
    center: np.ndarray, x: np.ndarray, y: np.ndarray, directions: torch.Tensor, radius: float
) -> torch.Tensor:
    """Batched accuracy of every model ``center + radius * direction``: ``(p,)``.

    ``center`` is the augmented ``(C, F + 1)`` matrix; ``directions`` is ``(p, C, F+1)``.
    """
    xa = augment(x)
    z0 = xa @ torch.as_tensor(center, dtype=torch.float64).T
    lo, hi = direction_intervals(xa, z0, torch.as_tensor(y, dtype=torch.long), directions)
    return direction_accuracies(lo, hi, radius)


def search_radius(
    center: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    *,
    eps: float,
    num_directions: int,
    r_max: float,
    delta: float,
    seed: int,
    axes: np.ndarray | None = None,
) -> RadiusResult:
    """Largest radius ``R`` such that every sampled surface model has accuracy >= eps.

    Bisection over ``[0, r_max]`` down to width ``delta``; the ``p`` directions are
    drawn once and evaluated together at each tested radius. Returns the largest
    radius that was tested and passed (the upper end ``r_max`` is tested first).

    Parameters
    ----------
    center : (C, F + 1) augmented ``[weight | bias]`` matrix of the local optimum.
    x, y : the node's validation inputs ``(N, F)`` and labels ``(N,)``.
    eps : minimum accuracy of a good-enough model (Q = accuracy >= eps).
    num_directions : ``p``, surface samples per tested radius.
    r_max, delta : bisection range and stopping width.
    seed : seeds the directions.
    axes : relative ellipsoid axes, shape ``(C * (F + 1),)``; ``None`` for a ball.
    """
    eps = check_eps(eps)
    num_directions = check_scalar(num_directions, "num_directions", int, low=1)
    r_max = check_scalar(r_max, "r_max", float, low=0, closed="neither")
    delta = check_scalar(delta, "delta", float, low=0, closed="neither")
    seed = check_scalar(seed, "seed", int)
    center = np.asarray(center, dtype=np.float64)
    if center.ndim != 2 or center.shape[1] != np.shape(x)[1] + 1:
        raise ValueError(
            f"center has shape {center.shape}; expected (classes, features + 1) = "
            f"(C, {np.shape(x)[1] + 1})"
        )
    if len(y) == 0:
        raise ValueError("the validation set is empty: a radius needs validation data")
    xa = augment(x)
    yt = torch.as_tensor(y, dtype=torch.long)
    w = torch.as_tensor(center, dtype=torch.float64)
    z0 = xa @ w.T
    num, need = len(xa), pass_count(eps, len(xa))
    correct0 = int((z0.argmax(dim=1) == yt).sum())
    center_acc = correct0 / num
    if correct0 < need:
        return RadiusResult(0.0, center_acc, False, center_acc, 0, False)

    u = sample_directions(num_directions, tuple(center.shape), seed, axes)
    lo_r, hi_r = direction_intervals(xa, z0, yt, u)

    def min_count(radius: float) -> int:
        return int(direction_counts(lo_r, hi_r, radius).min())

    b = bisect_radius(min_count, lambda count: count >= need, r_max, delta, correct0)
    return RadiusResult(b.radius, center_acc, True, b.score / num, b.steps, b.saturated)


@dataclass(frozen=True)
class Bisection:
    """Outcome of :func:`bisect_radius`."""

    radius: float  # the largest radius tested and passed (0 when none was)
    score: float  # the score at ``radius``
    steps: int  # radii tested
    saturated: bool  # ``r_max`` itself passed
    failed_radius: float  # the smallest radius tested and failed (inf when saturated)


def bisect_radius(score: Callable[[float], float], passes: Callable[[float], bool],
                  r_max: float, delta: float, score_at_zero: float) -> Bisection:
    """The bisection every radius search shares: ``r_max`` is tested first, then
    ``[0, r_max]`` is halved down to width ``delta``; only tested radii are returned."""
    steps = 1
    top = score(r_max)
    if passes(top):
        return Bisection(r_max, top, steps, True, math.inf)
    lower, upper, score_lower = 0.0, r_max, score_at_zero
    while upper - lower > delta:
        mid = 0.5 * (lower + upper)
        value = score(mid)
        steps += 1
        if passes(value):
            lower, score_lower = mid, value
        else:
            upper = mid
    return Bisection(lower, score_lower, steps, False, upper)
