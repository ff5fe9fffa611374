"""Differentially private Gram statistics (``dp-epsilon``, ``dp-delta``, ``dp-clip``).

Under DP a node sends no model and no per-node matrix: only its sums over training rows

    S_G = sum_n x~_n x~_n^T   (packed upper triangle),   S_M = sum_n e_{y_n} x~_n^T,

with ``x~ = [clip(x), 1]`` (each row's features scaled down to norm at most ``clip``),
each with Gaussian noise added on the node before anything leaves it. The last column
of ``S_M`` is the class counts, so they are noised too. The server sums the nodes'
noised statistics; the pooled ridge and LDA points need nothing else
(:mod:`gems_fl.geometry.gram_sums`). The closed-form center needs ``W_k G_k`` and is
not offered.

Neighbouring datasets differ in **one training row replaced by another** (the node's
row count ``n_k`` is public: it weights the sums). Replacing ``a`` by ``b`` moves

- ``S_G`` by ``a~a~^T - b~b~^T``, Frobenius norm at most ``sqrt(2) (clip^2 + 1)``
  (``||a~||^2 <= clip^2 + 1``; the packed triangle holds each entry at most once);
- ``S_M`` by ``e_a a~^T - e_b b~^T``, norm at most ``2 sqrt(clip^2 + 1)``,

so the released vector has L2 sensitivity ``sqrt(2 (clip^2+1)^2 + 4 (clip^2+1))``. The
noise's standard deviation is the smallest one for which one Gaussian release of that
sensitivity is ``(epsilon, delta)``-DP, from the exact (analytic) privacy loss of the
Gaussian mechanism (Balle & Wang 2018) as Google's ``dp_accounting`` computes it; the
same library reports the epsilon spent at ``delta``.

The noise comes from the operating system's entropy unless ``seeded`` (``dp-seeded-noise``,
for repeatable experiments): a seed the server knows lets it subtract the noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from gems_fl.geometry.gram import pack_triangle


def row_sensitivity(clip: float) -> float:
    """L2 sensitivity of ``(S_G triangle, S_M)`` to replacing one training row."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be a positive row norm; got {clip}")
    q = clip * clip + 1.0
    return math.sqrt(2.0 * q * q + 4.0 * q)


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The smallest noise std for one ``(epsilon, delta)``-DP Gaussian release."""
    from dp_accounting.pld import accountant, common

    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be positive; got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1); got {delta}")
    return float(accountant.get_smallest_gaussian_noise(
        common.DifferentialPrivacyParameters(float(epsilon), float(delta)), 1,
        float(sensitivity)))


def epsilon_spent(sigma: float, sensitivity: float, delta: float) -> float:
    """The accountant's epsilon at ``delta`` for one release with noise ``sigma``."""
    from dp_accounting.pld import privacy_loss_distribution

    pld = privacy_loss_distribution.from_gaussian_mechanism(float(sigma),
                                                            sensitivity=float(sensitivity))
    return float(pld.get_epsilon_for_delta(float(delta)))


@dataclass(frozen=True)
class DPSpec:
    """A node's DP release: target ``(epsilon, delta)``, row clip, and the noise it implies."""

    epsilon: float
    delta: float
    clip: float

    @property
    def sensitivity(self) -> float:
        return row_sensitivity(self.clip)

    @property
    def sigma(self) -> float:
        return _sigma(self.epsilon, self.delta, self.clip)

    def report(self, seeded: bool) -> dict:
        """What the results record of the release (the accountant's epsilon included)."""
        return {"epsilon": self.epsilon, "delta": self.delta, "clip": self.clip,
                "sensitivity": self.sensitivity, "noise_std": self.sigma,
                "epsilon_spent": epsilon_spent(self.sigma, self.sensitivity, self.delta),
                "releases_per_node": 1, "adjacency": "one training row replaced",
                "mechanism": "Gaussian, analytic calibration (dp_accounting PLD)",
                "noise_source": "seeded from the run seed (no protection from whoever "
                                "knows it)" if seeded else "operating-system entropy"}


@lru_cache(maxsize=32)  # every node of a process asks for the same one
def _sigma(epsilon: float, delta: float, clip: float) -> float:
    return gaussian_sigma(epsilon, delta, row_sensitivity(clip))


def clip_rows(x: np.ndarray, clip: float) -> np.ndarray:
    """``x`` with each row scaled down to L2 norm at most ``clip`` (shorter rows kept)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def noised_statistics(x: np.ndarray, y: np.ndarray, num_classes: int, spec: DPSpec,
                      rng: np.random.Generator) -> dict[str, np.ndarray]:
    """This node's DP release: ``gram`` (``S_G``'s packed upper triangle) and ``moments``
    (``S_M``, ``(C, d + 1)``), sums over its clipped training rows plus Gaussian noise of
    std ``spec.sigma`` on every entry sent."""
    y = np.asarray(y, dtype=np.int64)
    if len(x) != len(y) or len(y) == 0:
        raise ValueError(f"need as many labels as rows, at least one; got {len(x)} rows and "
                         f"{len(y)} labels")
    xt = np.hstack([clip_rows(x, spec.clip), np.ones((len(x), 1))])
    gram = pack_triangle(xt.T @ xt)
    moments = np.eye(int(num_classes))[y].T @ xt
    sigma = spec.sigma
    return {"gram": gram + rng.normal(0.0, sigma, gram.shape),
            "moments": moments + rng.normal(0.0, sigma, moments.shape)}
