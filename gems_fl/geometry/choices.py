"""The named choices of the geometry, as plain constants: settings validate against them
without importing numpy-heavy or torch modules."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class KindTraits:
    """What code outside the geometry asks of a space kind, without loading it (the kind
    itself, with its search and aggregation, is :func:`gems_fl.geometry.kinds.space_kind`,
    registered under the same names): code asks ``kind_traits(name).statistics``, never
    compares a kind's name.

    Attributes
    ----------
    name : str
        The ``space`` setting's value.
    statistics : bool
        Built from the layer's training statistics (Gram matrix, label moments): the server
        solves ``h_G`` from them as a point, the nodes check it against their own space, and
        the selection round, refinement, DP and secure sums apply.
    fisher_axes : bool
        Shaped by the diagonal Fisher information (``ellipsoid-c``, ``ellipsoid-floor``).
    """

    name: str
    statistics: bool = False
    fisher_axes: bool = False


SPACE_KIND_TRAITS = {t.name: t for t in (
    KindTraits("ball"),  # the paper's
    KindTraits("ellipsoid", fisher_axes=True),  # the paper's
    KindTraits("gram", statistics=True),
)}
SPACE_KINDS = tuple(SPACE_KIND_TRAITS)


def kind_traits(name: str) -> KindTraits:
    """The traits of the space kind ``name`` (``ValueError`` naming the known ones)."""
    try:
        return SPACE_KIND_TRAITS[str(name)]
    except KeyError:
        raise ValueError(f"space kind {name!r} is not one of {', '.join(SPACE_KINDS)}") from None

ELLIPSOID_FLOORS = ("quantile", "paper")
# gram-point gaussian / mixture / auto: the L2 penalties of the fit to the virtual rows the selection
# round scores (standardised units; the first is the one used without that round)
GAUSSIAN_L2S = (1e-6, 1e-5, 1e-4, 1e-3)
# class-grams: class Gram matrices travel whole (float32 triangles) for layers of at most
# this size (inputs + 1: the MLP's output layer up to width 256, digits); above it, as each
# class's covariance in gram-rank's factor form (gems_fl.geometry.class_factors), and
# class-grams=auto sends them only where that form applies (gram-rank > 0 or auto)
class ClassGrams(StrEnum):
    """``class-grams``: whether the nodes send their class Gram matrices (``auto``: where
    the run plan finds a form for them)."""

    AUTO = "auto"
    TRUE = "true"
    FALSE = "false"


CLASS_GRAMS = tuple(c.value for c in ClassGrams)
CLASS_GRAMS_AUTO_MAX = 257
# pooled-ridge=auto: the ridges the selection round scores on the nodes' validation data
# (relative to one mean Gram matrix), and the one a layer without that round uses.
POOLED_RIDGES = (1e-4, 1e-3, 1e-2, 1e-1)
#: ``pooled-ridge=auto`` under ``dp-epsilon``: the noised Gram sums need stronger ridges
#: (Fashion-MNIST K=5, benchmarks/dp.py: the selection round kept 1 at epsilon 0.5 and 1,
#: 0.1 at epsilon 4 and 8).
DP_POOLED_RIDGES = (1e-2, 1e-1, 1.0, 10.0)
DEFAULT_POOLED_RIDGE = 1e-3
# gram-point=auto: the LDA point's shrinkages the selection round also scores (relative to
# the mean eigenvalue of the pooled within-class covariance)
LDA_SHRINKAGES = (1e-3, 1e-2, 1e-1)
# refine-method: Bohning steps scaled by the secant curvature (checked, backtracking), or
# plain Bohning steps
class RefineMethod(StrEnum):
    """``refine-method``: Bohning steps scaled by a secant estimate of the curvature, or plain monotone ones."""

    SECANT = "secant"
    MONOTONE = "monotone"


REFINE_METHODS = tuple(m.value for m in RefineMethod)
# refine-l2: the L2 penalty of the refined objective, relative to the mean diagonal of the
# pooled Gram matrix (best pooled validation accuracy: results/benchmarks/refinement_offline.json,
# by refinement_offline.py, a benchmark retired after commit c4a7c72)
DEFAULT_REFINE_L2 = 3e-3
# refine-method=secant: the smallest curvature scale, so a step is at most 1/0.05 = 20
# Bohning steps long
SECANT_FLOOR = 0.05
# server-grams: what the server keeps of the nodes' Gram matrices; `auto` keeps the sums
# alone above SUMS_ABOVE_NODES nodes where the point needs nothing else
SERVER_GRAMS = ("auto", "nodes", "sums")
SUMS_ABOVE_NODES = 100
# ... and wherever the nodes' (D + 1)-square float64 matrices would take more than this: 100
# nodes of the kernel model (D = 4,246) would hold 14 GB, and the run was killed for memory
SERVER_MATRIX_BYTES = 4 * 2 ** 30
# ... and wherever one node's matrix would take more than this: the kernel model's (D + 1 of
# 3,000 to 5,000: 70-200 MB each) at any number of nodes, so the server's memory does not
# grow with nodes x D^2 and its points are solved from one pooled matrix; the logistic
# model's (5 MB) and random features' at D = 2,048 (34 MB) stay whole
SERVER_NODE_MATRIX_BYTES = 64 * 2 ** 20
NO_INTERSECTION_FALLBACKS = ("min-penalty", "mean")
# Each kind's default upper end of the radius bisection, in the units of its radius
# (gems_fl.geometry.kinds says which). 4000 is the paper's R_max; gram keeps the bound its
# runs have always used, so that a search still passing there is reported saturated.
SPACE_R_MAX = {"ball": 4000.0, "ellipsoid": 4000.0, "gram": 4000.0}

# gram-rank=auto: a size x size Gram matrix travels as a rank-r factor (float16) plus the
# diagonal of the rest, r = max(AUTO_GRAM_RANK_MIN, ceil(size / AUTO_GRAM_RANK_SHARE)), when
# size > 2 r + 1; else whole. Rank 50 of Fashion-MNIST's 785 is the smallest form measured
# within 0.5 point of the whole matrix at 5 seeds on the paper's K=5, Dirichlet(0.1) and
# Dirichlet(0.5) (results/benchmarks/gram_rank.json, by gram_rank.py, retired after commit
# c4a7c72; rank 25 lost 0.7 and 1.4 points).
AUTO_GRAM_RANK_MIN = 32
AUTO_GRAM_RANK_SHARE = 16


def gram_rank_for(setting: int | str, size: int, share: int = AUTO_GRAM_RANK_SHARE) -> int:
    """The rank a ``size x size`` Gram reply uses under ``gram-rank=setting``: 0 (the
    whole matrix) or r > 0 (a rank-r factor and the residual diagonal). ``auto`` compresses
    only where the factor form is smaller than the triangle (``size > 2 r + 1``), at rank
    ``size / share`` (the model's: :attr:`~gems_fl.learning.model_kinds.ModelKind.gram_rank_share`)."""
    if str(setting).strip().lower() == "auto":
        rank = max(AUTO_GRAM_RANK_MIN, -(-int(size) // int(share)))
        return rank if int(size) > 2 * rank + 1 else 0
    return int(setting)


def class_gram_rank_for(gram_rank: int | str, size: int) -> int:
    """The rank of the factor form class Gram matrices of a ``size x size`` layer travel
    in: 0 (whole) up to ``CLASS_GRAMS_AUTO_MAX``, else ``gram-rank``'s rank for the layer
    (:func:`gram_rank_for`; 0 with ``gram-rank=0``)."""
    if int(size) <= CLASS_GRAMS_AUTO_MAX:
        return 0
    return min(gram_rank_for(gram_rank, size), int(size) - 1)


def class_grams_for(setting: str, size: int, gram_rank: int | str = 0) -> bool:
    """Whether a node sends class Gram matrices for a ``size x size`` layer under
    ``class-grams=setting``: ``auto`` where they travel small, whole up to
    ``CLASS_GRAMS_AUTO_MAX`` or in the factor form of :func:`class_gram_rank_for`
    (``gram-point='gaussian'`` or ``'mixture'`` sends nodes ``true``)."""
    value = str(setting).strip().lower()
    if value == "auto":
        return int(size) <= CLASS_GRAMS_AUTO_MAX or class_gram_rank_for(gram_rank, size) > 0
    return value == "true"
