"""The aggregation points of the Gram spaces: each one registered object over one
statistics interface.

A point is a model the server can take as ``h_G`` from the nodes' Gram statistics. Each
is one :class:`Point` in :data:`POINTS`: its name, the statistics it needs, the name of
its regularisation and the values the selection round scores, whether the selection
round rescales its logits, and how it is solved from a :class:`Statistics` object. The
same solve serves the nodes' replies (:class:`NodeStatistics`) and the server's running
sums (:class:`~gems_fl.geometry.gram_sums.GramSums`), so each point is implemented once;
adding a point is one more :class:`Point` here (its solve may live in its own module).

``auto`` is no point: it lets the selection round choose, on the nodes' validation data,
among every registered point the statistics allow (:func:`auto_points`), in registry
order. Which points ``auto`` kept over the committed reproduction trials (Fashion-MNIST,
``gram-point=auto``): gaussian 150, mixture 64, pooled 47, lda 8, closed-form 6 (the
appendix's K=2 division, whose two nodes share their classes).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from gems_fl.geometry.choices import (
    DEFAULT_POOLED_RIDGE,
    GAUSSIAN_L2S,
    LDA_SHRINKAGES,
)

# The registry is read when run settings are checked, which must answer in a moment: the
# solvers (torch, scikit-learn's k-means) are imported where a point is solved.
if TYPE_CHECKING:
    import torch

    from gems_fl.geometry.gram_sums import GramSums
    from gems_fl.geometry.intersect import IntersectionResult

__all__ = ["AUTO", "GRAM_POINTS", "LeadingColumns", "NodeStatistics", "POINTS", "Point", "Statistics", "SummedStatistics",
           "aggregate_gram", "aggregate_sums", "auto_points", "point_named", "solvable_from_sums",
           "solve_point"]

AUTO = "auto"

#: what a set of statistics can hold, in the words a point's ``needs`` uses
LABELS, CENTERS, CLASS_GRAMS, COMPONENTS = "label moments", "centers", "class Gram matrices", \
    "class components"


class Statistics(Protocol):
    """What a point is solved from: the nodes' Gram statistics, per node or summed.

    ``provides`` names what the statistics hold (:data:`LABELS`, :data:`CENTERS`,
    :data:`CLASS_GRAMS`, :data:`COMPONENTS`); ``weights`` is each node's share of the
    training rows (the points weight nodes by their rows).
    """

    num_classes: int
    size: int  # the layer's inputs and bias
    weights: np.ndarray

    def provides(self) -> frozenset[str]: ...

    def pooled_inputs(self) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
        """``(grams, moments, counts)`` for :func:`~gems_fl.geometry.pooled.pooled_point`."""

    def center_system(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sum lambda_k G_k, sum lambda_k W_k G_k)``, float64 torch, the first symmetric."""

    def class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each class's row count, mean and covariance over all nodes."""

    def mixture_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every node's k-means components of each class as Gaussians, and their classes."""

    def column_class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """:meth:`class_moments` on the layer's leading columns (the kernel model's rows);
        None where the nodes sent none."""


class NodeStatistics:
    """:class:`Statistics` from every node's own space (the replies the server kept)."""

    def __init__(self, spaces: Sequence[Any], num_train: Sequence[float]) -> None:
        from gems_fl.geometry.gram_merge import merge_weights

        if not spaces:
            raise ValueError("no spaces to aggregate")
        shape = spaces[0].matrix.shape
        for k, s in enumerate(spaces):
            if s.matrix.shape != shape:
                raise ValueError(f"space {k} has a {s.matrix.shape} center; space 0 has {shape}")
        self.spaces, self.num_train = list(spaces), list(num_train)
        self.num_classes, self.size = shape[0], shape[1]  # the layer's inputs and bias
        self.weights = merge_weights(self.spaces, self.num_train)

    def provides(self) -> frozenset[str]:
        from gems_fl.geometry.gram_merge import has_class_components, has_class_grams

        held = {CENTERS}
        if all(s.moments is not None for s in self.spaces):
            held.add(LABELS)
        if has_class_grams(self.spaces):
            held.add(CLASS_GRAMS)
        if has_class_components(self.spaces):
            held.add(COMPONENTS)
        return frozenset(held)

    def pooled_inputs(self) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
        return [s.gram for s in self.spaces], [s.moments for s in self.spaces], self.num_train

    def center_system(self) -> tuple[torch.Tensor, torch.Tensor]:
        from gems_fl.geometry.gram_merge import center_system

        return center_system([s.matrix for s in self.spaces], [s.gram for s in self.spaces],
                             self.weights)

    def class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        from gems_fl.geometry.virtual import pooled_class_moments

        return pooled_class_moments([s.per_class_grams for s in self.spaces],
                                    [s.class_counts for s in self.spaces])

    def mixture_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        from gems_fl.geometry.components import mixture_moments
        from gems_fl.geometry.gram_merge import class_parts

        return mixture_moments([s.class_grams for s in self.spaces],
                               [class_parts(s) for s in self.spaces])

    def column_class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        from gems_fl.geometry.virtual import pooled_class_moments

        grams = [getattr(s, "column_class_grams", None) for s in self.spaces]
        if any(g is None for g in grams):
            return None
        return pooled_class_moments(grams, [s.class_counts for s in self.spaces])


class SummedStatistics:
    """:class:`Statistics` from the server's running sums (no node's matrix is held)."""

    def __init__(self, sums: GramSums, num_train: Sequence[float]) -> None:
        self.sums = sums
        self.num_classes, self.size = sums.num_classes, sums.size
        self.weights = np.asarray([float(n) / sums.count for n in num_train])
        self._pooled: tuple | None = None
        self._pooling = threading.Lock()

    def provides(self) -> frozenset[str]:
        held = set()
        if self.sums.has_labels:
            held.add(LABELS)
        if self.sums.has_centers:
            held.add(CENTERS)
        if self.sums.has_class_grams:
            held.add(CLASS_GRAMS)
        return frozenset(held)

    def pooled_inputs(self) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
        """Formed once from the sums and shared by every candidate solved from these
        statistics (the selection round solves several at once): the pooled Gram matrix
        is 145 MB at the kernel model's D = 4,252. Callers copy before they change it."""
        with self._pooling:
            if self._pooled is None:
                self._pooled = [self.sums.pooled_gram()], [self.sums.pooled_moments()], [1.0]
            return self._pooled

    def center_system(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.sums.center_system()

    def class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.sums.class_moments()

    def mixture_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise ValueError("the mixture point needs every node's class components; the sums "
                         "merge them")

    def column_class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        return self.sums.column_class_moments() if self.sums.has_column_class_grams else None


Solve = Callable[[Statistics, float, int, dict], np.ndarray]
#: a point's solve at several values at once (one shared draw, a continuation)
SolveMany = Callable[[Statistics, Sequence[float], int, dict, int], list[np.ndarray]]


class LeadingColumns:
    """:class:`Statistics` restricted to the first ``columns`` inputs (and the bias): the
    kernel model's rows, beside its kernel features. A point solved on them is the
    logistic model's, widened back with zero weights on the other inputs
    (:meth:`embed`), so the selection round can keep the linear model where the nodes'
    validation rows prefer it. The class statistics of the columns (the gaussian point's)
    are the ones the nodes sent for them, where they did."""

    def __init__(self, stats: Statistics, columns: int) -> None:
        self.stats, self.columns = stats, int(columns)
        self.num_classes, self.weights = stats.num_classes, stats.weights
        self.width = int(stats.size)  # the whole layer's inputs and bias
        self._class_moments = stats.column_class_moments()

    def provides(self) -> frozenset[str]:
        held = {LABELS} & self.stats.provides()
        return frozenset(held | ({CLASS_GRAMS} if self._class_moments is not None else set()))

    def _keep(self, width: int) -> np.ndarray:
        return np.r_[np.arange(self.columns), width - 1]

    def pooled_inputs(self) -> tuple[list[np.ndarray], list[np.ndarray], list[float]]:
        grams, moments, counts = self.stats.pooled_inputs()
        keep = self._keep(self.width)
        return ([np.asarray(g)[np.ix_(keep, keep)] for g in grams],
                [np.asarray(m)[:, keep] for m in moments], counts)

    def center_system(self):
        raise ValueError("the closed-form center is not restricted to the leading columns")

    def class_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._class_moments is None:
            raise ValueError("the nodes sent no class Gram matrices of their leading columns")
        return self._class_moments

    def column_class_moments(self):
        return self._class_moments

    def mixture_moments(self):
        raise ValueError("class components are not restricted to the leading columns")

    def embed(self, matrix: np.ndarray) -> np.ndarray:
        """``matrix`` ``(C, columns + 1)`` as a point of the whole layer: zeros elsewhere."""
        out = np.zeros((matrix.shape[0], self.width), dtype=np.float64)
        out[:, self._keep(self.width)] = matrix
        return out


@dataclass(frozen=True)
class Point:
    """One aggregation point.

    ``regularisation`` names the value the solve takes (``None``: the closed-form center,
    which takes the run's ``gram-ridge``); ``grid`` the values the selection round scores
    (``None``: the run's pooled ridges) and ``default`` the one used without that round.
    ``rescaled``: the selection round may scale its logits (the center keeps its scale,
    which places it in the spaces). ``solve_many``: the point at all of its grid's values
    in one call, cheaper than one at a time (the gaussian points' continuation, the LDA
    point's one decomposition); each
    value's result is that call's, whatever order the values come in.
    """

    name: str
    needs: frozenset[str]
    regularisation: str | None
    grid: tuple[float, ...] | None
    default: float | None
    rescaled: bool
    solve: Solve
    solve_many: SolveMany | None = None

    def missing(self, stats: Statistics) -> list[str]:
        """What the point needs that ``stats`` lacks, in words."""
        return sorted(self.needs - stats.provides())

    def values(self, pooled_ridges: Sequence[float], *, chosen: bool) -> tuple[float | None, ...]:
        """What the selection round scores: this point at each of these values.
        ``pooled_ridges`` are the run's (``pooled-ridge``: one, or the candidates of
        ``auto``); ``chosen``: the run named this point, so a single ``pooled-ridge`` is
        its value (under ``auto`` each point scores its own grid)."""
        if self.regularisation is None:
            return (None,)
        if self.grid is None or (chosen and len(pooled_ridges) == 1):
            return tuple(pooled_ridges)
        return self.grid

    def value(self, pooled_ridges: Sequence[float]) -> float:
        """The value a run without a selection round uses: a single ``pooled-ridge``, else
        the point's default (the closed-form center: unused)."""
        if len(pooled_ridges) == 1:
            return float(pooled_ridges[0])
        return DEFAULT_POOLED_RIDGE if self.default is None else self.default


def _pooled(stats: Statistics, ridge: float, seed: int, details: dict) -> np.ndarray:
    from gems_fl.geometry.pooled import pooled_point

    return pooled_point(*stats.pooled_inputs(), ridge)


def _lda(stats: Statistics, shrinkage: float, seed: int, details: dict) -> np.ndarray:
    from gems_fl.geometry.pooled import pooled_lda

    return pooled_lda(*stats.pooled_inputs(), shrinkage)


def _ldas(stats: Statistics, shrinkages: Sequence[float], seed: int, details: dict,
          workers: int = 1) -> list[np.ndarray]:
    from gems_fl.geometry.pooled import pooled_ldas

    return pooled_ldas(*stats.pooled_inputs(), shrinkages)


def _gaussian(stats: Statistics, l2: float, seed: int, details: dict) -> np.ndarray:
    return _gaussians(stats, [l2], seed, details)[0]  # the selection round's candidate


def _gaussians(stats: Statistics, l2s: Sequence[float], seed: int, details: dict,
               workers: int = 1) -> list[np.ndarray]:
    from gems_fl.geometry.virtual import gaussian_points

    return gaussian_points(*stats.class_moments(), l2s, seed=seed, workers=workers)


def _mixtures(stats: Statistics, l2s: Sequence[float], seed: int, details: dict,
              workers: int = 1) -> list[np.ndarray]:
    from gems_fl.geometry.virtual import gaussian_points

    counts, means, covs, classes = stats.mixture_moments()
    details["gaussian_components"] = len(counts)
    return gaussian_points(counts, means, covs, l2s, seed=seed, classes=classes,
                           num_classes=stats.num_classes, workers=workers)


def _mixture(stats: Statistics, l2: float, seed: int, details: dict) -> np.ndarray:
    return _mixtures(stats, [l2], seed, details)[0]  # the selection round's candidate


def _closed_form(stats: Statistics, ridge: float, seed: int, details: dict) -> np.ndarray:
    import torch

    from gems_fl.geometry.linalg import solve_right

    a, b = stats.center_system()
    if ridge > 0:
        a.diagonal().add_(float(ridge))
    w = solve_right(a, b)
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the aggregated model is not finite: a center or Gram matrix holds "
                         "NaN/inf; validate each reply with check_gram first")
    return w.numpy()


#: every point, in the order the selection round scores them under ``auto``
POINTS: dict[str, Point] = {p.name: p for p in (
    Point("pooled", frozenset({LABELS}), "pooled_ridge", None, DEFAULT_POOLED_RIDGE, True,
          _pooled),
    Point("lda", frozenset({LABELS}), "lda_shrinkage", LDA_SHRINKAGES, LDA_SHRINKAGES[0],
          True, _lda, _ldas),
    Point("gaussian", frozenset({LABELS, CLASS_GRAMS}), "gaussian_l2", GAUSSIAN_L2S,
          GAUSSIAN_L2S[0], True, _gaussian, _gaussians),
    Point("mixture", frozenset({LABELS, CLASS_GRAMS, COMPONENTS}), "gaussian_l2", GAUSSIAN_L2S,
          GAUSSIAN_L2S[0], True, _mixture, _mixtures),
    Point("closed-form", frozenset({CENTERS}), None, None, None, False, _closed_form),
)}


#: what ``gram-point`` may say: ``auto`` and every registered point
GRAM_POINTS = (AUTO, *POINTS)


def point_named(name: str) -> Point:
    """The registered point ``name`` (``auto``: the pooled point, which ``auto`` uses until
    its selection round); ``ValueError`` naming the known ones."""
    try:
        return POINTS["pooled" if name == AUTO else name]
    except KeyError:
        raise ValueError(f"point={name!r}; choose one of {', '.join((AUTO, *POINTS))}") from None


def solvable_from_sums(name: str) -> bool:
    """Whether point ``name`` (or ``auto``'s choice) can be solved from the server's running
    sums, which merge what a single node sent."""
    return COMPONENTS not in point_named(name).needs


def auto_points(stats: Statistics) -> list[Point]:
    """The points ``auto`` chooses among: every registered point ``stats`` can solve."""
    return [p for p in POINTS.values() if not p.missing(stats)]


def solve_point(stats: Statistics, spaces: Sequence[Any], name: str, value: float | None, *,
                ridge: float, seed: int = 0) -> IntersectionResult:
    """``h_G`` at point ``name`` with its regularisation ``value`` (the closed-form center:
    ``ridge``), and its membership in each space: checked here against per-node spaces, or
    left to the nodes when ``stats`` are sums (:func:`~gems_fl.geometry.gram_sums.
    summed_result`)."""
    point = _checked_point(stats, name)
    details = _details(stats, point, value, ridge)
    matrix = point.solve(stats, ridge if point.regularisation is None else float(value), seed,
                         details)
    return _result(stats, spaces, point, matrix, details)


def solve_points(stats: Statistics, spaces: Sequence[Any], name: str,
                 values: Sequence[float], *, ridge: float, seed: int = 0, workers: int = 1
                 ) -> list[IntersectionResult] | None:
    """``h_G`` at point ``name`` at each of ``values`` in one call, as the selection round
    scores them (``workers``: how many threads it may use, the same result whatever the
    count); None where the point has no such call (solve each with :func:`solve_point`)."""
    point = _checked_point(stats, name)
    if point.solve_many is None or point.regularisation is None or not values:
        return None
    shared: dict[str, object] = {}
    matrices = point.solve_many(stats, [float(v) for v in values], seed, shared, workers)
    return [_result(stats, spaces, point, matrix,
                    {**_details(stats, point, value, ridge), **shared})
            for value, matrix in zip(values, matrices)]


def _checked_point(stats: Statistics, name: str) -> Point:
    point = point_named(name)
    if missing := point.missing(stats):
        raise ValueError(f"gram-point='{point.name}' needs every node's {' and '.join(missing)}; "
                         "the statistics hold none (see class-grams and label-moments)")
    return point


def _details(stats: Statistics, point: Point, value: float | None, ridge: float) -> dict:
    details: dict[str, object] = {"weighting": "samples", "ridge": float(ridge),
                                  "weights": [float(v) for v in stats.weights]}
    if point.regularisation is not None:
        details[point.regularisation] = float(value)
    return details


def _result(stats: Statistics, spaces: Sequence[Any], point: Point, matrix: np.ndarray,
            details: dict) -> IntersectionResult:
    """The solved point as ``h_G``, with its membership in each space."""
    from gems_fl.geometry.gram_merge import gram_result, record_minimax
    from gems_fl.geometry.gram_sums import summed_result

    if isinstance(stats, LeadingColumns):
        matrix = stats.embed(matrix)
        details["columns"] = stats.columns
        stats = stats.stats
    if not isinstance(stats, NodeStatistics):
        return summed_result(spaces, matrix, point.name, details)
    inside = [s.contains(matrix) for s in spaces]
    if not all(inside) and all(s.radius > 0 for s in spaces):
        record_minimax(spaces, details)
    return gram_result(spaces, matrix, point.name, details)


def aggregate_gram(spaces: Sequence[Any], num_train: Sequence[float], *, ridge: float = 1e-6,
                   point: str = "closed-form", pooled_ridge: float = DEFAULT_POOLED_RIDGE,
                   seed: int = 0) -> IntersectionResult:
    """``h_G`` at ``point`` from every node's own space, with its membership in each.

    ``pooled_ridge`` is the point's regularisation (the pooled ridge, the LDA shrinkage or
    the gaussian fit's L2 penalty), ``ridge`` the closed-form center's; ``seed`` fixes the
    gaussian points' draw of virtual rows.
    """
    return solve_point(NodeStatistics(spaces, num_train), spaces, point, pooled_ridge,
                       ridge=ridge, seed=seed)


def aggregate_sums(sums: GramSums, spaces: Sequence[Any], num_train: Sequence[float], *,
                   point: str, ridge: float, pooled_ridge: float, seed: int = 0
                   ) -> IntersectionResult:
    """``h_G`` at ``point`` from the server's running sums alone (membership is then each
    node's own check)."""
    return solve_point(SummedStatistics(sums, num_train), spaces, point, pooled_ridge,
                       ridge=ridge, seed=seed)
