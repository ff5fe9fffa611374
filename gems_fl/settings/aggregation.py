"""Settings of the server's aggregation: neuron clustering, the Gram point, and the
refinement rounds after the one-shot model.

One :func:`~gems_fl.settings.checks.setting` declaration per setting;
:class:`gems_fl.settings.Settings` combines the groups."""

from __future__ import annotations

from dataclasses import dataclass

from gems_fl.geometry.choices import (
    DEFAULT_REFINE_L2,
    NO_INTERSECTION_FALLBACKS,
    POOLED_RIDGES,
    REFINE_METHODS,
    SERVER_GRAMS,
    SERVER_MATRIX_BYTES,
    SERVER_NODE_MATRIX_BYTES,
    SUMS_ABOVE_NODES,
)
from gems_fl.geometry.points import GRAM_POINTS
from gems_fl.settings.checks import at_least, one_of, parses, positive, setting
from gems_fl.settings.values import parse_pooled_ridge, parse_refine_l2


@dataclass(frozen=True)
class AggregationSettings:
    """How the server combines the spaces into one model."""

    clusters: int = setting(
        75,
        'm_eps, k-means clusters over all neurons of all nodes',
        positive, lab=True)
    max_width: int = setting(
        0,
        'MLP: the most neurons a merged hidden layer may have (0: no bound). Above it, the '
        'neurons that merged with no other are clustered by k-means and each cluster keeps '
        'its member nearest the center, so every output neuron lies in some node\'s neuron '
        'space; the others are reported as dropped. 450 kept N=20 within 0.6 point of the '
        'unbounded merge (docs/scale.md)',
        at_least(0, "0: no bound on the merged width of a hidden layer"))
    gram_ridge: float = setting(
        1e-06,
        '`gram` only: ridge added to the weighted sum of Gram matrices in the closed-form '
        'center (relative to one mean Gram matrix)',
        at_least(0), lab=True)
    gram_point: str = setting(
        'auto',
        '`gram` only: `auto` (the default) lets the selection round choose, on the nodes\' '
        'validation data, among every registered point the nodes\' statistics allow '
        '(gems_fl/geometry/points.py): `pooled`, the ridge least-squares classifier of all '
        'nodes\' data, from their Gram matrices and label moments; `lda` the linear '
        'discriminant of the same sums (class means and shared within-class covariance); '
        '`gaussian` the softmax layer fitted to virtual rows drawn from each class\'s pooled '
        'mean and covariance (CCVR; needs class Gram matrices, `class-grams`); `mixture` the '
        'same fit to virtual rows of every node\'s k-means components of each class '
        '(`class-components`); `closed-form` the weighted center of the spaces (RegMean). A '
        'named point is used with its regularisation from `pooled-ridge` (the pooled ridge, '
        'the LDA shrinkage among 1e-3, 1e-2, 1e-1, or the gaussian fit\'s L2 among 1e-6, '
        '1e-5, 1e-4, 1e-3 with `pooled-ridge=auto`)',
        one_of(GRAM_POINTS), lab=True)
    pooled_ridge: str = setting(
        'auto',
        '`gram-point` `auto` and `pooled`: ridge of the pooled least-squares fit, '
        'relative to one mean Gram matrix; `auto` lets the nodes choose it: a selection round '
        'after the spaces sends the point for each of '
        + ', '.join(f'{r:g}' for r in POOLED_RIDGES)
        + ' and keeps the one with the best pooled validation accuracy',
        parses(parse_pooled_ridge), lab=True)
    no_intersection: str = setting(
        'min-penalty',
        "fallback when the spaces do not intersect: `min-penalty` (minimise the paper's "
        'objective) or `mean`',
        one_of(NO_INTERSECTION_FALLBACKS), lab=True)
    server_grams: str = setting(
        'auto',
        "`gram`, logistic model: what the server keeps of the nodes' Gram matrices. `nodes`: "
        "every node's matrix (the server checks h_G against every space itself). `sums`: only "
        'the sums the closed-form, pooled, LDA and gaussian points need (class Gram matrices '
        'summed per class), added in as each reply is decoded, so memory does not grow with '
        'the number of nodes; each node then checks h_G against its own space in the '
        'evaluate round. `sums` needs a gram-point solvable from sums (any but `mixture`). '
        '`auto`: `sums` above '
        f'{SUMS_ABOVE_NODES} nodes, or where the nodes\' matrices would take more than '
        f'{SERVER_MATRIX_BYTES // 2 ** 30} GiB, or one node\'s more than '
        f'{SERVER_NODE_MATRIX_BYTES // 2 ** 20} MiB (the kernel model), where the '
        'settings allow it, else `nodes`',
        one_of(SERVER_GRAMS), lab=True)
    refine_rounds: int = setting(
        0,
        '`gram`: R refinement rounds after the one-shot `h_G` (the logistic model, or the '
        'MLP\'s output layer): in each, every node sends its cross-entropy gradient at the '
        'current model (model-sized) and the server takes a curvature step. 0: one-shot',
        at_least(0), user=True,
        detail='The selection round first scales h_G by the logit scale with the lowest '
        'pooled validation cross-entropy; the curvature is the Gram matrices the server holds '
        '(`refine-method`; Bohning 1992)')
    refine_method: str = setting(
        'secant',
        '`refine-rounds`: `secant` divides each Bohning step by the curvature the objective '
        'showed along the last one, keeps a point only when the pooled objective the nodes '
        'report there did not rise, and otherwise goes back with a plain step; `monotone` '
        'takes plain Bohning steps from the current model (the pooled objective never '
        'increases)',
        one_of(REFINE_METHODS), lab=True)
    refine_l2: float | str = setting(
        'auto',
        '`refine-rounds`: the objective the steps minimise is the pooled cross-entropy plus '
        '`l2 / 2` times the squared norm of `W`, `l2` relative to the mean diagonal of the '
        'pooled Gram matrix (the server adds it; replies do not change); 0: the plain pooled '
        f'loss. `auto`: {DEFAULT_REFINE_L2:g} for the logistic model (the best pooled '
        "validation accuracy, README \"Refinement rounds\"), 0 for the MLP's output layer "
        '(not chosen there; that penalty lowered it in the run measured)',
        parses(parse_refine_l2), lab=True)
