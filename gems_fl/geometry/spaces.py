"""Good-enough model spaces: balls and axis-aligned ellipsoids in parameter space.

A space is ``{w : || (w - center) / axes ||_2 <= radius}``. ``axes`` holds the
*relative* axis lengths in (0, 1] (the Fisher-based ratios of the paper's appendix A);
a ball has every axis equal to 1. Keeping the radius separate from the axis ratios
lets one bisection over ``radius`` serve both kinds, and makes the ball a special case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gems_fl.geometry.checks import check_scalar
from gems_fl.geometry.components import class_totals
from gems_fl.geometry.gram import FactoredGram

# Tolerances of the membership test: relative to the radius, and absolute.
CONTAINS_RTOL = 1e-9
CONTAINS_ATOL = 1e-12


def within_radius(distance, radius, rtol: float = CONTAINS_RTOL, atol: float = CONTAINS_ATOL):
    """``distance <= radius`` up to floating-point tolerance (elementwise on arrays).

    The one membership test: :meth:`Space.contains` and the vectorised screens over
    many spaces at once use it, so that they agree to the bit.
    """
    return distance <= radius * (1.0 + rtol) + atol


@dataclass(frozen=True)
class Space:
    """One node's good-enough model space.

    Parameters
    ----------
    center : np.ndarray
        The node's locally optimal parameters, flattened, shape ``(d,)``.
    radius : float
        Radius ``R >= 0`` in the (axis-scaled) norm.
    axes : np.ndarray or None
        Relative axis lengths, shape ``(d,)``, each in ``(0, 1]``. ``None`` for a ball.
    """

    center: np.ndarray
    radius: float
    axes: np.ndarray | None = None

    def __post_init__(self) -> None:
        center = np.asarray(self.center, dtype=np.float64).reshape(-1)
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "radius", check_scalar(self.radius, "radius", float, low=0))
        if self.axes is not None:
            axes = np.asarray(self.axes, dtype=np.float64).reshape(-1)
            if axes.shape != center.shape:
                raise ValueError(
                    f"axes has shape {axes.shape}, expected {center.shape} like center"
                )
            if not np.all(np.isfinite(axes)) or np.any(axes <= 0):
                raise ValueError("axes must be finite and > 0")
            object.__setattr__(self, "axes", axes)

    @property
    def kind(self) -> str:
        """``"ball"`` or ``"ellipsoid"``."""
        return "ball" if self.axes is None else "ellipsoid"

    @property
    def dim(self) -> int:
        """Number of parameters ``d``."""
        return int(self.center.shape[0])

    @property
    def semi_axes(self) -> np.ndarray:
        """Absolute semi-axis lengths ``radius * axes``, shape ``(d,)``."""
        rel = np.ones_like(self.center) if self.axes is None else self.axes
        return self.radius * rel

    def distance(self, w: np.ndarray) -> float:
        """Axis-scaled distance ``||(w - center) / axes||_2`` (Euclidean for a ball)."""
        diff = np.asarray(w, dtype=np.float64).reshape(-1) - self.center
        if self.axes is not None:
            diff = diff / self.axes
        return float(np.linalg.norm(diff))

    def penalty(self, w: np.ndarray) -> float:
        """``max(0, distance(w) - radius)``: the paper's per-node intersection term."""
        return max(0.0, self.distance(w) - self.radius)

    def contains(
        self, w: np.ndarray, rtol: float = CONTAINS_RTOL, atol: float = CONTAINS_ATOL
    ) -> bool:
        """Whether ``w`` lies in the space, up to floating-point tolerance."""
        return bool(within_radius(self.distance(w), self.radius, rtol, atol))


@dataclass(frozen=True)
class GramSpace:
    """A node's logit-space ellipsoid ``{W : tr((W - W_k) G_k (W - W_k)^T) <= radius^2}``.

    ``W`` is a linear layer's augmented ``(C, n)`` matrix ``[weight | bias]`` (``n`` =
    inputs + 1), flattened row-major like :class:`Space`'s center. ``G_k`` is the mean of
    ``x~ x~^T`` over the node's training inputs, so the distance is the root-mean-square
    change of the node's logits. ``certified_radius`` is the closed-form radius in the
    node's validation-logit metric within which no model can drop below eps.
    ``moments`` ``(C, n)`` and ``class_counts`` ``(C,)`` are the node's label moments
    (:func:`gems_fl.geometry.gram.label_moments`), which the pooled points need;
    ``class_grams`` ``(m, n, n)`` its Gram matrix of each class it holds (class order,
    :func:`gems_fl.geometry.gram.class_grams`), which the ``gaussian`` point needs; with
    ``class_parts`` ``(m, 2)`` (``[class, rows]``) they are one per k-means component of
    a class instead (:mod:`gems_fl.geometry.components`). ``column_class_grams`` ``(m, k +
    1, k + 1)``: the kernel model's, the class Gram matrices of the layer's first ``k``
    inputs (the rows themselves) and the bias, for the logistic family's gaussian point.
    """

    center: np.ndarray
    gram: np.ndarray | FactoredGram
    radius: float
    certified_radius: float = 0.0
    moments: np.ndarray | None = None
    class_counts: np.ndarray | None = None
    class_grams: np.ndarray | None = None
    class_parts: np.ndarray | None = None
    column_class_grams: np.ndarray | None = None

    def __post_init__(self) -> None:
        # a node's metric kept as its factor (fewer rows than inputs) stays factored
        gram = self.gram if isinstance(self.gram, FactoredGram) else np.asarray(self.gram,
                                                                                 dtype=np.float64)
        if len(gram.shape) != 2 or gram.shape[0] != gram.shape[1]:
            raise ValueError(f"gram has shape {gram.shape}; expected a square (n, n) matrix")
        center = np.asarray(self.center, dtype=np.float64).reshape(-1)
        if center.size % gram.shape[0]:
            raise ValueError(f"center has {center.size} entries, not a multiple of n={gram.shape[0]}")
        if not np.isfinite(self.radius) or self.radius < 0:
            raise ValueError(f"radius must be finite and >= 0, got {self.radius!r}")
        object.__setattr__(self, "center", center)
        object.__setattr__(self, "gram", gram)
        object.__setattr__(self, "radius", float(self.radius))
        object.__setattr__(self, "certified_radius", float(self.certified_radius))

    kind = "gram"
    axes = None

    @property
    def dim(self) -> int:
        return int(self.center.shape[0])

    @property
    def matrix(self) -> np.ndarray:
        """The center as the ``(C, n)`` matrix."""
        return self.center.reshape(-1, self.gram.shape[0])

    @property
    def per_class_grams(self) -> np.ndarray | None:
        """One Gram matrix per class held (components added up), or None."""
        if self.class_grams is None or self.class_parts is None:
            return self.class_grams
        return class_totals(self.class_grams, self.class_parts)

    def distance(self, w: np.ndarray) -> float:
        """``sqrt(tr((W - W_k) G_k (W - W_k)^T))``: RMS change of the node's logits."""
        diff = np.asarray(w, dtype=np.float64).reshape(self.matrix.shape) - self.matrix
        square = (self.gram.quadratic(diff) if isinstance(self.gram, FactoredGram)
                  else float(np.sum((diff @ self.gram) * diff)))
        return float(np.sqrt(max(0.0, square)))

    def penalty(self, w: np.ndarray) -> float:
        return max(0.0, self.distance(w) - self.radius)

    def contains(self, w: np.ndarray, rtol: float = CONTAINS_RTOL, atol: float = CONTAINS_ATOL) -> bool:
        return bool(within_radius(self.distance(w), self.radius, rtol, atol))


@dataclass(frozen=True)
class SummedGramSpace:
    """What the server keeps of a node's :class:`GramSpace` when it holds only the sums
    of the nodes' Gram statistics (:class:`gems_fl.geometry.gram_sums.GramSums`): the
    center, the radii and the matrix size. The Gram matrix itself went into the sums, so
    distances to this space are the node's to measure (the evaluate round)."""

    center: np.ndarray
    radius: float
    certified_radius: float
    size: int

    kind = "gram"
    axes = None

    @classmethod
    def of(cls, space: GramSpace) -> SummedGramSpace:
        return cls(space.center, space.radius, space.certified_radius, space.gram.shape[0])

    @classmethod
    def radii_only(cls, metrics: dict, size: int) -> SummedGramSpace:
        """A node's radii from its reply's metrics, without a center: under secure
        aggregation or DP the server never sees it (a certified radius of -1 on the wire
        means infinite)."""
        certified = float(metrics["certified-radius"])
        return cls(None, float(metrics["radius"]), math.inf if certified < 0 else certified,
                   int(size))

    @property
    def dim(self) -> int:
        return int(self.center.shape[0])

    @property
    def matrix(self) -> np.ndarray:
        """The center as the ``(C, n)`` matrix."""
        return self.center.reshape(-1, self.size)

    def distance(self, w: np.ndarray, *args, **kwargs) -> float:
        raise RuntimeError("the server holds only the sums of the nodes' Gram matrices "
                           "(server-grams=sums): each node measures its own distance in "
                           "the evaluate round")

    penalty = contains = distance
