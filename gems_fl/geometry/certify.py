"""Certified radii of every space kind: closed form, no sampling.

One rule decides "accuracy >= eps" (:func:`gems_fl.geometry.eps.pass_count`), and one
count of flips (:func:`flips_needed`) serves the paper's balls and ellipsoids (parameter
space, below) and the logit-space Gram ellipsoids (:func:`certified_gram_radius`).

Balls and ellipsoids.
For the linear model ``W`` (``(C, F + 1)``, bias last) and a validation sample ``x~``
(with a 1 appended) whose logit margin is ``m = z_y - max_{c != y} z_c``, the sample
can only be misclassified once its logit vector moves by at least ``m / sqrt(2)``: the
gap between two logits changes by at most ``sqrt(2)`` times the L2 change of the logit
vector. A parameter change ``D`` moves the logits by ``D x~``, and

- for a ball, ``||D x~|| <= ||D||_F ||x~||``;
- for an ellipsoid with relative axes ``a`` (``D = a * U``, ``||U||_F <= R``),
  ``||D x~||^2 = sum_c (sum_i a_ci u_ci x_i)^2 <= ||U||^2 max_c sum_i a_ci^2 x_i^2``.

So sample ``n`` is safe for every radius below ``t_n = m_n / (sqrt(2) s_n)`` with
``s_n`` the factor above. Validation accuracy drops below ``eps`` only when at least
``f`` correct samples flip (:func:`flips_needed`), which needs a radius of at least the
``f``-th smallest ``t_n``: that is the certified radius. Every model strictly inside it
keeps validation accuracy >= eps, whatever the direction; the random-direction radius
of the paper's search is typically far larger and carries no such guarantee.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from gems_fl.geometry.eps import check_eps, pass_count
from gems_fl.geometry.linalg import EIGEN_FLOOR, augment, center_for, label_indices, metric_for
from gems_fl.geometry.whitening import Whitening, eigen_whitening


def flips_needed(num_correct: int, num_samples: int, eps: float) -> int:
    """How many correct samples must flip before accuracy drops below ``eps``.

    Accuracy ``(num_correct - f) / num_samples < eps`` first holds at
    ``f = num_correct - pass_count(eps, num_samples) + 1``; 0 when it already fails, and
    ``num_correct + 1`` (more than can flip) when ``eps`` is 0.
    """
    if num_samples <= 0:
        raise ValueError("num_samples must be > 0: a certified radius needs validation data")
    need = pass_count(check_eps(eps), num_samples)
    return max(0, int(num_correct) - need + 1)


def logit_margins(center: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Margins ``z_y - max_{c != y} z_c`` of every sample (ties count as correct: >= 0)."""
    w = np.asarray(center, dtype=np.float64)
    xa = augment(np.asarray(x, dtype=np.float64)).numpy()
    z = xa @ w.T
    y = np.asarray(y, dtype=np.int64)
    true = z[np.arange(len(y)), y]
    z[np.arange(len(y)), y] = -np.inf
    return true - z.max(axis=1)


def certified_radius(
    center: np.ndarray, x: np.ndarray, y: np.ndarray, eps: float, axes: np.ndarray | None = None
) -> float:
    """Certified radius of the ball (``axes=None``) or ellipsoid around ``center``.

    ``center`` is ``(C, F + 1)``; ``axes`` the relative axes, same size. Returns 0 when
    the center itself fails ``eps``, and ``inf`` when no number of flips can push
    accuracy below ``eps`` (``eps == 0``).
    """
    center = np.asarray(center, dtype=np.float64)
    margins = logit_margins(center, x, y)
    correct = margins >= 0
    f = flips_needed(int(correct.sum()), len(margins), eps)
    if f == 0:
        return 0.0
    if f > int(correct.sum()):
        return math.inf
    xa = augment(np.asarray(x, dtype=np.float64)).numpy()
    if axes is None:
        scale = np.linalg.norm(xa, axis=1)
    else:
        a2 = np.asarray(axes, dtype=np.float64).reshape(center.shape) ** 2
        scale = np.sqrt((xa**2 @ a2.T).max(axis=1))
    t = margins[correct] / (math.sqrt(2.0) * np.maximum(scale[correct], 1e-300))
    return float(np.partition(t, f - 1)[f - 1])


# ------------------------------------------------- logit-space (Gram) ellipsoids


def _margins(center, x_val, y_val) -> tuple[torch.Tensor, int]:
    xa = augment(x_val)
    if len(xa) == 0:
        raise ValueError("the validation set is empty: a radius needs validation data")
    w = center_for("center", center, xa.shape[1])
    if w.shape[0] < 2:
        raise ValueError("a classifier needs at least 2 classes (rows of center)")
    yt = label_indices(y_val, len(xa), w.shape[0])
    z = xa @ w.T
    zy = z.gather(1, yt.view(-1, 1)).squeeze(1)
    others = z.scatter(1, yt.view(-1, 1), -math.inf)
    return zy - others.amax(dim=1), len(xa)


def certified_radius_in_metric(center: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                               eps: float) -> float:
    """Certified radius ``rho`` in the metric of the validation inputs' own logits.

    Sound for ``G_val = mean over validation x~ x~^T``: every ``D`` with
    ``tr(D G_val D^T) <= rho^2`` keeps validation accuracy >= eps (ties count as
    correct). ``0`` when the center fails eps, ``inf`` when eps is 0.

    Proof. Sample ``n`` with margin ``m_n = z_y - max_{c != y} z_c >= 0`` becomes wrong
    only if some ``z_c`` strictly exceeds ``z_y``; the smallest L2 change of its logit
    vector that achieves that is (in the limit) ``m_n / sqrt(2)`` (half the margin off
    ``z_y``, half onto ``z_c``). With ``K`` samples correct and ``k = pass_count(eps, N)``,
    accuracy < eps needs at least ``f = K - k + 1`` currently-correct samples to flip
    (wrong samples turning correct only help). Since
    ``tr(D G_val D^T) = (1/N) sum_n ||D x~_n||^2``, flipping any ``f`` samples needs
    ``tr(D G_val D^T) > (1/N) * (sum of the f smallest m_n^2 / 2) = rho^2``.
    The bound is tight when the ``x~_n`` are linearly independent (``N <= d + 1``).
    """
    margin, num = _margins(center, x_val, y_val)
    correct = margin >= 0
    flips = flips_needed(int(correct.sum()), num, eps)
    if flips == 0:
        return 0.0
    if flips > int(correct.sum()):
        return math.inf
    cost = (margin[correct] ** 2 / 2).sort().values[:flips].sum()
    return math.sqrt(float(cost) / num)


def _largest_square_singular(b: torch.Tensor) -> float:
    """``lambda_max(B^T B)``, from whichever of ``B^T B`` and ``B B^T`` is smaller (the
    same nonzero eigenvalues): a node's few validation rows against D features."""
    small = b @ b.T if b.shape[0] < b.shape[1] else b.T @ b
    return float(torch.linalg.eigvalsh(small)[-1]) if small.numel() else 0.0


def certified_gram_radius(
    center: np.ndarray,
    g: np.ndarray | None,
    x_val: np.ndarray,
    y_val: np.ndarray,
    eps: float,
    *,
    floor: float = EIGEN_FLOOR,
    within_range: bool = False,
    eigen: tuple[torch.Tensor, torch.Tensor] | None = None,
    whitening: Whitening | None = None,
) -> float:
    """Certified radius (closed form) in the metric ``G`` -- the node's training Gram.

    ``g=None`` (or ``g = G_val``) returns ``certified_radius_in_metric``: the radius in
    the metric of the validation inputs. For another ``G`` the validation-metric radius
    ``rho_val`` is converted with the largest generalised eigenvalue

        mu = max_D tr(D G_val D^T) / tr(D G D^T) = lambda_max(G^(-1/2) G_val G^(-1/2)),

    (the quotient splits over the rows of ``D``, so the ``(d+1)``-dimensional problem
    suffices): ``tr(D G D^T) <= rho_val^2 / mu`` implies ``tr(D G_val D^T) <= rho_val^2``,
    so ``rho_val / sqrt(mu)`` is sound in the metric ``G``.

    If ``G_val`` has weight on ``G``'s null space (eigenvalues below ``floor * max``: an
    input feature constant on the training data but not on the validation data) the
    ``G``-ellipsoid contains unbounded moves that change validation logits, and the
    sound radius for the whole ellipsoid is 0. With ``within_range=True`` only
    perturbations in the range of ``G`` are certified -- exactly those that
    ``sample_gram_directions`` / ``search_gram_radius`` probe. ``eigen``:
    ``torch.linalg.eigh`` of ``G`` (float64) where the caller has it already;
    ``whitening``: a whitening of ``G`` (:mod:`gems_fl.geometry.whitening`) instead.
    """
    rho = certified_radius_in_metric(center, x_val, y_val, eps)
    if g is None or rho == 0.0 or math.isinf(rho):
        return rho
    xa_n = np.shape(x_val)[1] + 1
    gt = metric_for("G", g, xa_n, whitening is not None)
    # G_val = A^T A; every quadratic form of it below is a product with A's N_val rows
    rows = augment(x_val) / math.sqrt(len(x_val))
    white = whitening if whitening is not None else eigen_whitening(gt, floor, eigen)
    if not within_range and white.outside is not None:
        leak = _largest_square_singular(white.outside(rows))
        if leak > floor * _largest_square_singular(rows):
            return 0.0
    mu = _largest_square_singular(white.apply(rows))
    if mu <= 0.0:
        return math.inf  # no move in G's range changes any validation logit
    return rho / math.sqrt(mu)
