"""Certified radii for the paper's balls and ellipsoids: closed form, no sampling.

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


def flips_needed(num_correct: int, num_samples: int, eps: float) -> int:
    """How many correct samples must flip before accuracy drops below ``eps``.

    Accuracy ``(num_correct - f) / num_samples < eps`` first holds at
    ``f = num_correct - ceil(eps * num_samples) + 1``; 0 when it already fails.
    """
    if num_samples <= 0:
        raise ValueError("num_samples must be > 0: a certified radius needs validation data")
    need = math.ceil(eps * num_samples - 1e-12)
    return max(0, int(num_correct) - need + 1)


def logit_margins(center: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Margins ``z_y - max_{c != y} z_c`` of every sample (ties count as correct: >= 0)."""
    w = np.asarray(center, dtype=np.float64)
    xa = np.hstack([np.asarray(x, dtype=np.float64), np.ones((len(x), 1))])
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
    xa = np.hstack([np.asarray(x, dtype=np.float64), np.ones((len(x), 1))])
    if axes is None:
        scale = np.linalg.norm(xa, axis=1)
    else:
        a2 = np.asarray(axes, dtype=np.float64).reshape(center.shape) ** 2
        scale = np.sqrt((xa**2 @ a2.T).max(axis=1))
    t = margins[correct] / (math.sqrt(2.0) * np.maximum(scale[correct], 1e-300))
    return float(np.partition(t, f - 1)[f - 1])
