"""The registry of space kinds: what each kind of good-enough space is, how a node finds
one for a linear layer, and how the server picks ``h_G`` among them.

Every place that depends on the kind (the node's search, the wire format's extra
record, the server's aggregation, the results' wording) dispatches through
:func:`space_kind`; nothing else compares kind names. Each kind declares the units its
radius is measured in and its own default upper bound for the radius bisection.

=============  =============================================  =======================
kind           space                                          radius units
=============  =============================================  =======================
``ball``       ``||w - w_k|| <= R`` (the paper)               parameter norm
``ellipsoid``  ``||(w - w_k) / a|| <= R``, Fisher axes ``a``  axis-scaled param. norm
``gram``       ``tr((W - W_k) G_k (W - W_k)^T) <= rho^2``     RMS logit change
=============  =============================================  =======================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry import choices
from gems_fl.geometry.certify import certified_gram_radius, certified_radius
from gems_fl.geometry.checks import check_option
from gems_fl.geometry.class_factors import class_factors, class_grams_from_factors, class_means
from gems_fl.geometry.components import component_grams
from gems_fl.geometry.fisher import diagonal_fisher, fisher_axes
from gems_fl.geometry.gram import (
    TOP_EIGEN_MIN_SIZE,
    FactoredGram,
    class_grams,
    float32_gram,
    from_factor,
    gram_matrix,
    label_moments,
    mean_columns,
    residual_diagonal,
    sent_factor,
    within_root,
)
from gems_fl.geometry.gram_search import search_gram_radius
from gems_fl.geometry.intersect import IntersectionResult, find_intersection
from gems_fl.geometry.points import GRAM_POINTS, aggregate_gram
from gems_fl.geometry.radius import search_radius
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.geometry.whitening import eigen_whitening, factor_whitening

__all__ = ["AggregateOptions", "LayerSpace", "SpaceKind", "SpaceOptions", "space_kind"]


@dataclass(frozen=True)
class SpaceOptions:
    """How a node finds the good-enough space of a linear layer.

    Parameters
    ----------
    kind : str
        ``"gram"`` (default), ``"ball"`` or ``"ellipsoid"``.
    eps : float
        Minimum validation accuracy of a good-enough model, in ``[0, 1]``.
    num_directions : int
        ``p``, surface samples per tested radius.
    r_max : float
        Upper end of the radius bisection in the kind's units; 0: the kind's own bound.
    delta : float
        Width at which the bisection stops.
    ellipsoid_c, ellipsoid_floor
        ``ellipsoid`` only: shortest relative axis and the Fisher floor rule.
    gram_rank : int or "auto"
        ``gram`` only: 0 keeps the full Gram matrix, ``r > 0`` its rank-r factor, ``"auto"``
        a rank that follows the matrix size (:func:`~gems_fl.geometry.choices.gram_rank_for`).
    label_moments : bool
        ``gram`` only: also compute the label moments and class counts (the pooled points).
    class_grams : str
        ``gram`` with label moments: ``"true"`` also computes the Gram matrix of each class
        the node holds (the ``gaussian`` point), ``"auto"`` where they travel small
        (:func:`~gems_fl.geometry.choices.class_grams_for`), ``"false"`` never. Above
        ``CLASS_GRAMS_AUTO_MAX`` with ``gram_rank`` they travel, and the space holds them,
        in factor form (:mod:`gems_fl.geometry.class_factors`).
    class_components : int
        Class Gram matrices sent whole: up to this many k-means components per class
        (:func:`~gems_fl.geometry.components.component_grams`); 1, and the factor form,
        one per class.
    linear_columns : int
        ``gram`` with label moments, the kernel model: the layer's first ``k`` inputs are
        the rows themselves, and the node also computes the class Gram matrices of those
        columns as the logistic model's layer would send them (whole, or in factor form
        past :data:`~gems_fl.geometry.choices.CLASS_GRAMS_AUTO_MAX`), for the logistic
        family's gaussian point. 0: none.
    """

    kind: str = "gram"
    eps: float = 0.4
    num_directions: int = 500
    r_max: float = 0.0
    delta: float = 0.01
    ellipsoid_c: float = 0.1
    ellipsoid_floor: str = "quantile"
    gram_rank: int | str = 0
    label_moments: bool = False
    class_grams: str = "false"
    class_components: int = 1
    linear_columns: int = 0

    @property
    def sends_class_grams(self) -> bool:
        """The plan resolved ``class_grams`` to ``true``: a node sends its class Gram
        matrices."""
        return self.class_grams == choices.ClassGrams.TRUE

    def __post_init__(self) -> None:
        check_option(self.kind, "kind", choices.SPACE_KINDS)
        check_option(str(self.class_grams).lower(), "class_grams", choices.CLASS_GRAMS)
        check_option(self.ellipsoid_floor, "ellipsoid_floor", choices.ELLIPSOID_FLOORS)

    @property
    def bound(self) -> float:
        """The bisection's upper end: ``r_max``, or the kind's own bound when 0."""
        return self.r_max or space_kind(self.kind).r_max


@dataclass(frozen=True)
class AggregateOptions:
    """How the server picks ``h_G`` among the accepted spaces of one linear layer.

    ``no_intersection`` and ``seed`` serve balls and ellipsoids (the fallback when they
    share no point); ``gram_ridge``, ``gram_point`` and ``pooled_ridge`` the Gram points
    (:mod:`gems_fl.geometry.points`: ``pooled_ridge`` is the point's regularisation).
    """

    kind: str = "gram"
    no_intersection: str = "min-penalty"
    seed: int = 0
    gram_ridge: float = 1e-6
    gram_point: str = "closed-form"
    pooled_ridge: float = choices.DEFAULT_POOLED_RIDGE
    #: the kernel model: its first ``linear_columns`` inputs are the rows themselves; the
    #: selection round also scores each point solved on them alone (the linear model)
    linear_columns: int = 0

    def __post_init__(self) -> None:
        for name, allowed in (("kind", choices.SPACE_KINDS),
                              ("no_intersection", choices.NO_INTERSECTION_FALLBACKS),
                              ("gram_point", GRAM_POINTS)):
            check_option(getattr(self, name), name, allowed)


@dataclass
class LayerSpace:
    """A linear layer's good-enough space and how it was found."""

    space: Space | GramSpace
    certified_radius: float
    center_accuracy: float
    factor: np.ndarray | None = None  # the rank-r factor of G sent instead of G
    residual: np.ndarray | None = None  # with it, diag(G - F F^T)
    # with a factor of the within-class scatter, the class-mean columns C the matrix adds
    factor_means: np.ndarray | None = None
    # the class Gram matrices' factor form sent instead of them (class_factors.class_factors)
    class_factors: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    # the kernel model: its leading columns' class Gram matrices as sent (whole, or factors)
    column_classes: np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


class SpaceKind:
    """One kind of good-enough space (subclasses below; one instance each)."""

    name: str
    units: str  # what a radius of this kind measures
    r_max: float  # default upper end of the radius bisection, in those units
    extra_records: tuple[str, ...] = ()  # the wire records sent beside the center
    optional_records: tuple[str, ...] = ()  # records sent when the run asks for them
    needs_train_inputs = False  # whether build() reads the training inputs and labels
    # whether h_G outside a space is a fault worth a warning: the paper's spaces promise
    # the intersection; a Gram point is checked by the nodes themselves instead
    outside_is_fault = True

    def build(self, center: np.ndarray, train: tuple[np.ndarray, np.ndarray] | None,
              val_inputs: np.ndarray, y_val: np.ndarray, options: SpaceOptions,
              seed: int, gram: np.ndarray | None = None) -> LayerSpace:
        """The space around ``center``; ``gram``: the training inputs' exact Gram matrix,
        where the caller holds it already (a kind built from it skips computing it)."""
        raise NotImplementedError

    def make(self, center: np.ndarray, radius: float, certified: float,
             extras: dict) -> Space | GramSpace:
        """The space from what a reply carries (``extras``: this kind's extra records)."""
        raise NotImplementedError

    def aggregate(self, spaces: Sequence, num_train: Sequence[float],
                  options: AggregateOptions) -> IntersectionResult:
        """The verified intersection (Dykstra, then the ``no-intersection`` fallback)."""
        return find_intersection(list(spaces), fallback=options.no_intersection,
                                 seed=options.seed)

    def report(self, result: IntersectionResult, options: AggregateOptions) -> str:
        """The server's log line on the aggregation."""
        n = len(result.inside)
        if result.found:
            return f"Intersection found ({result.method}): h_G lies in all {n} spaces"
        return (f"NO INTERSECTION of the {n} spaces; fallback '{result.method}' used; h_G "
                f"misses {sum(not i for i in result.inside)} space(s), total miss "
                f"{result.objective:.4g}")

    def where(self, found: bool, method: str, inside: list[bool]) -> str:
        """Where ``h_G`` ended up, in words (the results' note)."""
        if found:
            return "h_G inside every space (verified intersection)"
        return f"NO INTERSECTION: fallback '{method}'"


class _Parameter(SpaceKind):
    """The paper's parameter-space spaces: the batched bisection over random directions."""

    units = "parameter norm"

    @property
    def r_max(self) -> float:
        return choices.SPACE_R_MAX[self.name]

    def _axes(self, center: np.ndarray, val_inputs: np.ndarray,
              options: SpaceOptions) -> np.ndarray | None:
        return None

    def build(self, center, train, val_inputs, y_val, options, seed, gram=None) -> LayerSpace:
        center = np.asarray(center, dtype=np.float64)
        axes = self._axes(center, val_inputs, options)
        search = search_radius(center, val_inputs, y_val, eps=options.eps,
                               num_directions=options.num_directions, r_max=options.bound,
                               delta=options.delta, seed=seed, axes=axes)
        cert = certified_radius(center, val_inputs, y_val, options.eps, axes)
        return LayerSpace(Space(center.reshape(-1), search.radius, axes), cert,
                          search.center_accuracy)

    def make(self, center, radius, certified, extras) -> Space:
        return Space(center=center, radius=radius, axes=extras.get("axes"))


class Ball(_Parameter):
    name = "ball"


class Ellipsoid(_Parameter):
    name = "ellipsoid"
    units = "axis-scaled parameter norm"
    extra_records = ("axes",)

    def _axes(self, center, val_inputs, options) -> np.ndarray:
        return fisher_axes(diagonal_fisher(center, val_inputs), options.ellipsoid_c,
                           options.ellipsoid_floor)


class Gram(SpaceKind):
    name = "gram"
    outside_is_fault = False
    units = "RMS logit change"
    r_max = choices.SPACE_R_MAX["gram"]  # gram_search.DEFAULT_R_MAX (100) is the library call's
    extra_records = ("gram",)
    optional_records = ("labels",)  # the label moments, sent with label-moments=true
    needs_train_inputs = True

    def build(self, center, train, val_inputs, y_val, options, seed, gram=None) -> LayerSpace:
        center = np.asarray(center, dtype=np.float64)
        train_inputs, train_labels = train
        moments, counts = (label_moments(train_inputs, train_labels, center.shape[0])
                           if options.label_moments else (None, None))
        gram, factor, residual = node_gram(
            train_inputs, options.gram_rank, exact=gram,
            classes=(train_labels, moments, counts) if options.label_moments else None)
        per_class, sent_classes, parts = None, None, None
        if options.label_moments and choices.class_grams_for(options.class_grams,
                                                             gram.shape[0], options.gram_rank):
            per_class, sent_classes, parts = class_statistics(
                train_inputs, train_labels, moments, counts, options.gram_rank,
                options.class_components, seed)
        column_grams, column_sent = None, None
        if options.label_moments and options.linear_columns:
            keep = np.r_[np.arange(options.linear_columns), gram.shape[0] - 1]
            # the logistic model's own rule (gram-rank auto), not the wider layer's rank
            column_grams, column_sent, _ = class_statistics(
                np.asarray(train_inputs)[:, :options.linear_columns], train_labels,
                moments[:, keep], counts, "auto", 1, seed)
            if column_sent is None:
                column_sent = column_grams
        # once, for both: from the factor form's structure (no n^3 step), else eigh
        means = mean_columns(moments, counts) if factor is not None and moments is not None else None
        white = (factor_whitening(_whole_factor(factor, means), residual)
                 if factor is not None else
                 eigen_whitening(torch.as_tensor(gram, dtype=torch.float64)))
        search = search_gram_radius(center, gram, val_inputs, y_val, eps=options.eps,
                                    num_directions=options.num_directions,
                                    r_max=options.bound, delta=options.delta, seed=seed,
                                    whitening=white)
        cert = certified_gram_radius(center, gram, val_inputs, y_val, options.eps,
                                     whitening=white)
        return LayerSpace(GramSpace(center.reshape(-1), gram, search.radius, cert, moments,
                                    counts, per_class, parts, column_grams), cert,
                          search.center_accuracy, factor, residual, means, sent_classes,
                          column_sent)

    def make(self, center, radius, certified, extras) -> GramSpace:
        moments, counts, per_class, parts = extras.get("labels", (None, None, None, None))
        return GramSpace(center, extras["gram"], radius, certified, moments, counts, per_class,
                         parts, extras.get("column-classes"))

    def aggregate(self, spaces, num_train, options) -> IntersectionResult:
        return aggregate_gram(list(spaces), list(num_train), ridge=options.gram_ridge,
                              point=options.gram_point, pooled_ridge=options.pooled_ridge,
                              seed=options.seed)

    def report(self, result: IntersectionResult, options: AggregateOptions) -> str:
        details = result.details
        shared = ""
        if "spaces_share_a_point" in details:
            verdict = details["spaces_share_a_point"]
            # None: the minimax search ran out of iterations inside its bracket
            text = ("may or may not share" if verdict is None else
                    "share" if verdict else "do not share")
            shared = (f"; the spaces {text} a point (minimax scaled distance between "
                      f"{details['minimax_lower_bound']:.3g} and "
                      f"{details['minimax_scaled_distance']:.3g})")
        return (f"Gram point ({result.method}, nodes weighted by their rows): h_G "
                f"inside {sum(result.inside)} of {len(result.inside)} spaces{shared}")

    def where(self, found, method, inside) -> str:
        # whether h_G lies inside each Gram space is the per-site table's detail: a point
        # solved from pooled statistics is usually outside every one and good enough all
        # the same, so the headline names how h_G was picked, not that stricter test
        return f"picked from the sites' pooled statistics ({method} point)"


def class_statistics(inputs: np.ndarray, labels: np.ndarray, moments: np.ndarray,
                     counts: np.ndarray, gram_rank: int | str, components: int, seed: int
                     ) -> tuple[np.ndarray, tuple | None, np.ndarray | None]:
    """A layer's class Gram matrices as its node sends them, ``(per_class, factors,
    parts)``: whole up to :data:`~gems_fl.geometry.choices.CLASS_GRAMS_AUTO_MAX` (with
    ``components`` > 1, one per k-means component of a class, ``parts`` ``[class, rows]``),
    else in factor form (``factors``; ``per_class`` then the matrices the server rebuilds
    from them). ``moments`` and ``counts``: the layer's label moments on ``inputs``."""
    size = np.asarray(inputs).shape[1] + 1
    num_classes = len(counts)
    rank = choices.class_gram_rank_for(gram_rank, size)
    parts, factors = None, None
    if rank == 0 and components > 1:
        per_class, parts = component_grams(inputs, labels, num_classes, components, seed)
        if len(parts) == len(np.unique(parts[:, 0])):
            parts = None  # no class was split: the class Gram matrices themselves
    else:
        per_class = class_grams(inputs, labels, num_classes)
    if rank > 0:  # the matrices the server will build from the sent factors
        means = class_means(moments, counts)
        labels = np.asarray(labels)
        rows = [inputs[labels == c] for c in np.flatnonzero(counts > 0)]
        factors = class_factors(per_class, means, rank, rows)
        per_class = class_grams_from_factors(*factors, means)
    return per_class, factors, parts


def _whole_factor(factor: np.ndarray, means: np.ndarray | None) -> np.ndarray:
    """The factor of :func:`node_gram`'s matrix less its residual diagonal: the sent
    factor, beside the class-mean columns where label moments travel with it."""
    if means is None:
        return factor
    return np.concatenate([np.asarray(factor, dtype=np.float64), means], axis=1)


def node_gram(train_inputs: np.ndarray, gram_rank: int | str = 0,
              exact: np.ndarray | None = None, classes: tuple | None = None
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A node's Gram matrix as its space uses it, ``(gram, factor, residual)``: the
    exact matrix of ``[x, 1]`` over ``train_inputs`` (``exact``, where the caller
    computed it already), or with ``gram_rank`` the rank-r factor plus the residual
    diagonal (the form the server receives; ``factor`` and ``residual`` None for the
    whole matrix).

    ``classes``: ``(labels, moments, counts)`` where the label moments travel beside the
    factor. The factor is then of the within-class scatter ``G - C C^T`` and the matrix
    is ``F F^T + diag(r) + C C^T`` (:func:`~gems_fl.geometry.gram.mean_columns` ``C``, exact
    from the moments): a low-rank cut then drops only within-class variance, so every
    within-class matrix built from sums of such Gram matrices (the LDA point's) is
    positive semidefinite by construction, as it is for whole matrices. A node with fewer
    rows than inputs then gets ``gram`` as a :class:`FactoredGram` and forms no ``(n, n)``
    matrix (:func:`_rows_gram`)."""
    size = np.shape(train_inputs)[1] + 1
    rank = choices.gram_rank_for(gram_rank, size)
    if exact is None and classes is not None and 0 < len(train_inputs) < size and 0 < rank < size:
        return _rows_gram(train_inputs, rank, *classes)
    if exact is not None:
        gram = exact
    elif 0 < rank < size and size >= TOP_EIGEN_MIN_SIZE:  # travels as a float16 factor
        gram = float32_gram(train_inputs)
    else:
        gram = gram_matrix(train_inputs)
    if rank <= 0:
        return gram, None, None
    rank = min(rank, gram.shape[0])
    if classes is None:
        factor = sent_factor(gram, rank, train_inputs)
        residual = residual_diagonal(gram, factor)  # of the factor as sent: both ends agree
        return from_factor(factor, residual), factor, residual
    labels, moments, counts = classes
    means = mean_columns(moments, counts)
    # in place where the matrix is this function's own (140 MB at the kernel model's D)
    within = gram if exact is None else gram.copy()
    within -= means @ means.T
    root = (within_root(train_inputs, labels, means) if len(train_inputs) < gram.shape[0]
            else None)
    factor = sent_factor(within, rank, root=root)
    residual = residual_diagonal(within, factor)
    return from_factor(factor, residual, means), factor, residual


def _rows_gram(train_inputs: np.ndarray, rank: int, labels: np.ndarray, moments: np.ndarray,
               counts: np.ndarray) -> tuple[FactoredGram, np.ndarray, np.ndarray]:
    """:func:`node_gram`'s factor form for a node with fewer rows than inputs, from its
    class-centred rows alone: their thin SVD gives the factor (as it does in
    :func:`node_gram`), the rows' mean squares the diagonal (so that, as there, the matrix
    rebuilt keeps the node's own diagonal exactly). No ``(n, n)`` matrix is formed (at the
    kernel model's n = 4,252 the dense route held up to three of 72-145 MB in each
    ClientApp process), and the metric stays factored (:class:`FactoredGram`)."""
    means = mean_columns(moments, counts)
    root = within_root(train_inputs, labels, means)
    factor = sent_factor(None, rank, root=root)
    rows = torch.as_tensor(np.asarray(train_inputs), dtype=torch.float64)
    diagonal = torch.cat([rows.square().mean(dim=0), torch.ones(1, dtype=torch.float64)])
    within = diagonal - torch.as_tensor(means).square().sum(dim=1)
    kept = torch.as_tensor(factor, dtype=torch.float64).square().sum(dim=1)
    residual = (within - kept).clamp_min(0.0).numpy().astype(np.float32)
    return FactoredGram(factor, residual, means), factor, residual


_KINDS: dict[str, SpaceKind] = {k.name: k for k in (Ball(), Ellipsoid(), Gram())}
assert tuple(sorted(_KINDS)) == tuple(sorted(choices.SPACE_KINDS)), "choices.SPACE_KINDS is the registry's names"


def space_kind(name: str) -> SpaceKind:
    """The registered kind called ``name`` (``ValueError`` naming the known ones)."""
    try:
        return _KINDS[name]
    except KeyError:
        raise ValueError(f"space kind {name!r} is not one of {', '.join(_KINDS)}") from None


def build_layer_space(center: np.ndarray, train: tuple[np.ndarray, np.ndarray] | None,
                      val_inputs: np.ndarray, y_val: np.ndarray, options: SpaceOptions,
                      seed: int, gram: np.ndarray | None = None) -> LayerSpace:
    """The good-enough space of the ``(C, n)`` layer ``center`` (bias last) on the node's
    inputs to that layer: ``train = (inputs (M, n - 1), labels (M,))`` for the Gram matrix
    and label moments (``None`` for the other kinds), ``val_inputs`` ``(N, n - 1)`` and
    ``y_val`` ``(N,)`` for the radius search and the certified radius; ``gram``: the
    training inputs' exact Gram matrix where the caller holds it (the exact solve's)."""
    return space_kind(options.kind).build(center, train, val_inputs, y_val, options, seed,
                                          gram=gram)
