"""The option objects the geometry and the protocol take, built from the run settings (and,
on the server, the run plan): neither package reads :class:`~gems_fl.settings.Settings`
itself. :func:`node_config` is what every message carries to the nodes."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from gems_fl.data import FeatureOptions
from gems_fl.data.agreement import Scaling
from gems_fl.data.feature_ranges import read_feature_ranges
from gems_fl.data.nodes import NodeDataOptions
from gems_fl.data.random_features import NORM_BOUND
from gems_fl.evaluation.baselines import ComparisonOptions
from gems_fl.evaluation.server_data import ServerDataOptions
from gems_fl.geometry.choices import SERVER_MATRIX_BYTES, SERVER_NODE_MATRIX_BYTES, SUMS_ABOVE_NODES
from gems_fl.geometry.dp import DPSpec
from gems_fl.geometry.kinds import AggregateOptions, SpaceOptions
from gems_fl.geometry.points import AUTO, point_named, solvable_from_sums
from gems_fl.learning.model_kinds import RANDOM_FEATURES_KIND
from gems_fl.protocol.options import AgreementRule, Exchange, NodeWork, ServerOptions
from gems_fl.settings.operation import Baselines
from gems_fl.settings.values import parse_rf_bandwidth

if TYPE_CHECKING:  # the package imports this module
    from gems_fl.settings import Settings

__all__ = ["READ_ONLY_WHEN", "agreement_rule", "aggregate_options", "comparison_options",
           "dp_spec", "exchange",
           "holds_sums", "node_config", "node_data_options", "node_work", "server_data_options",
           "server_options", "space_options", "wants_ridge_choice"]

_mlp = lambda s: s.model_kind.layerwise
_gram = lambda s: s.space_kind.statistics
_axes = lambda s: s.space_kind.fisher_axes
#: node settings that only some runs' node code reads, and the runs that read them; the
#: other runs' messages leave them out (a node then holds the default, which it never reads)
READ_ONLY_WHEN = {
    "hidden": _mlp, "dropout": _mlp, "eps-neuron": _mlp, "neuron-criterion": _mlp,
    "neuron-delta": _mlp, "local-solve": lambda s: s.model_kind.convex,
    "ellipsoid-c": _axes, "ellipsoid-floor": _axes,
    "gram-rank": _gram, "label-moments": _gram, "class-grams": _gram, "class-components": _gram,
    "dp-delta": lambda s: bool(s.dp_epsilon), "dp-clip": lambda s: bool(s.dp_epsilon),
    "dp-seeded-noise": lambda s: bool(s.dp_epsilon),
    "rf-map": lambda s: s.model_kind is RANDOM_FEATURES_KIND and bool(s.dp_epsilon),
    "ham10000-per-class": lambda s: s.dataset == "ham10000",
    "ham10000-cnn-epochs": lambda s: s.dataset == "ham10000",
}


def node_data_options(settings: Settings) -> NodeDataOptions:
    """What a node's data loading reads (:func:`gems_fl.data.nodes.load_node_data`)."""
    return NodeDataOptions(
        dataset=settings.dataset, seed=settings.seed, data_dir=settings.data_dir,
        label_division=settings.label_division, num_features=settings.num_features,
        classes=settings.classes, label_column=settings.label_column,
        id_columns=settings.id_columns, categories=settings.categories,
        private=bool(settings.dp_epsilon), val_fraction=settings.val_fraction,
        standardize=settings.standardize, features=FeatureOptions.from_settings(settings))


def comparison_options(settings: Settings) -> ComparisonOptions:
    """What the comparison rows read (:mod:`gems_fl.evaluation.baselines`)."""
    return ComparisonOptions(
        seed=settings.seed, rows=settings.baselines, training=settings.local_training,
        tune=settings.tune_recipe, tune_layers=settings.tune_layers,
        public_samples=settings.public_samples, public_data=settings.public_data)


def server_data_options(settings: Settings) -> ServerDataOptions:
    """What the server's data loading reads (:mod:`gems_fl.evaluation.server_data`)."""
    return ServerDataOptions(
        dataset=settings.dataset, seed=settings.seed, data_dir=settings.data_dir,
        features=FeatureOptions.from_settings(settings), public_samples=settings.public_samples,
        public_data=settings.public_data, label_column=settings.label_column,
        id_columns=settings.id_columns, standardize=settings.standardize,
        tunes_on_public=settings.baselines == Baselines.ALL)


def space_options(settings: Settings) -> SpaceOptions:
    """How a node finds its space; no class Gram matrices under DP, whose noised sums
    hold none (under secure aggregation they travel through SecAgg+ as sums per class)."""
    options = SpaceOptions(
        kind=settings.space, eps=settings.eps, num_directions=settings.num_directions,
        r_max=settings.r_max, delta=settings.delta, ellipsoid_c=settings.ellipsoid_c,
        ellipsoid_floor=settings.ellipsoid_floor, gram_rank=settings.gram_rank,
        label_moments=settings.label_moments, class_grams=settings.class_grams,
        class_components=settings.class_components)
    if settings.dp_epsilon:
        return replace(options, class_grams="false")
    return options


def aggregate_options(settings: Settings) -> AggregateOptions:
    """How the server picks ``h_G``: the point at its value without a selection round
    (``pooled-ridge=auto``: the point's default; the selection round scores the others)."""
    return AggregateOptions(
        kind=settings.space, no_intersection=settings.no_intersection, seed=settings.seed,
        gram_ridge=settings.gram_ridge, gram_point=settings.gram_point,
        pooled_ridge=point_named(settings.gram_point).value(settings.pooled_ridges))


def holds_sums(settings: Settings, num_nodes: int, layer_size: int = 0) -> bool:
    """Whether the server keeps only the sums of the nodes' Gram statistics
    (``server-grams``): ``sums``, or ``auto`` above ``SUMS_ABOVE_NODES`` nodes, or where
    the nodes' ``layer_size``-square matrices would take more than ``SERVER_MATRIX_BYTES``
    together or ``SERVER_NODE_MATRIX_BYTES`` each, when the point needs no single node's
    matrix; always under secure aggregation and DP."""
    if settings.server_grams == "nodes" or not settings.space_kind.statistics \
            or not settings.model_kind.convex:
        return False
    if settings.server_grams == "sums" or settings.secure_aggregation or settings.dp_epsilon:
        return True
    matrix = layer_size ** 2 * 8
    large = (num_nodes > SUMS_ABOVE_NODES or num_nodes * matrix > SERVER_MATRIX_BYTES
             or matrix > SERVER_NODE_MATRIX_BYTES)
    return large and solvable_from_sums(settings.gram_point)


def dp_spec(settings: Settings) -> DPSpec:
    """The release ``dp-epsilon``, ``dp-delta`` and ``dp-clip`` ask for. Random Fourier
    features have norm at most ``sqrt(2)`` whatever the row, so their clip is never above
    it: the noise is calibrated to the map's own bound (clipping there changes no row)."""
    clip = float(settings.dp_clip)
    if settings.model_kind is RANDOM_FEATURES_KIND:
        clip = min(clip, NORM_BOUND[settings.rf_map])
    return DPSpec(float(settings.dp_epsilon), float(settings.dp_delta), clip)


def node_work(settings: Settings) -> NodeWork:
    """What a node's work reads of the settings it received (with its own overrides)."""
    return NodeWork(
        training=settings.local_training, space=space_options(settings),
        neuron_eps=settings.eps_neuron, neuron_delta=settings.neuron_delta,
        neuron_criterion=settings.neuron_criterion,
        dp=dp_spec(settings) if settings.dp_epsilon else None,
        dp_seeded_noise=bool(settings.dp_seeded_noise))


def wants_ridge_choice(settings: Settings) -> bool:
    """Whether the settings leave a choice to the selection round: the point
    (``gram-point=auto``) or its regularisation (``pooled-ridge=auto``)."""
    return settings.space_kind.statistics and (settings.gram_point == AUTO or (
        point_named(settings.gram_point).regularisation is not None
        and len(settings.pooled_ridges) > 1))


def agreement_rule(settings: Settings) -> AgreementRule:
    """What the identity round agrees on (dataset, features, classes, scaling)."""
    ranges = (read_feature_ranges(settings.feature_ranges)
              if settings.standardize == Scaling.RANGES else None)
    map_rule = settings.model_kind.map_rule
    return AgreementRule(dataset=settings.dataset, num_features=int(settings.num_features or 0),
                         classes=settings.classes, standardize=settings.standardize,
                         min_rows=int(settings.min_rows), ranges=ranges,
                         map=(map_rule(settings, parse_rf_bandwidth(settings.rf_bandwidth))
                              if map_rule is not None else None),
                         map_round=settings.model_kind.map_round)


def exchange(settings: Settings, plan: Any = None) -> Exchange:
    """How the server talks to the nodes: the node config in every message (before the
    plan, the identity round's: :meth:`Settings.for_nodes`; after it, :func:`node_config`),
    ``round-timeout``, ``min-replies``."""
    config = settings.for_nodes() if plan is None else node_config(settings, plan)
    return Exchange(node_config=config,
                    round_timeout=float(settings.round_timeout),
                    min_replies=int(settings.min_replies))


def server_options(settings: Settings, plan: Any) -> ServerOptions:
    """What the strategies read: the settings with the run plan's resolved values (what
    the nodes receive, what the server holds, the refinement penalty)."""
    return ServerOptions(
        exchange=exchange(settings, plan), seed=int(settings.seed),
        # the rank the plan resolved, as the nodes send it (unread by spaces of other kinds)
        space=space_options(settings) if plan.layer_size is None
        else replace(space_options(settings), gram_rank=plan.gram_rank),
        aggregate=aggregate_options(settings),
        pooled_ridges=tuple(settings.pooled_ridges), selects=bool(settings.refine_rounds)
        or wants_ridge_choice(settings), refine_rounds=int(settings.refine_rounds),
        refine_method=settings.refine_method, refine_l2=float(plan.refine_l2),
        holds_sums=plan.server_holds == "sums", server_grams=settings.server_grams,
        secure_aggregation=bool(settings.secure_aggregation),
        secure_threshold=settings.secure_threshold, dp=bool(settings.dp_epsilon),
        hidden_widths=tuple(settings.hidden_widths) if settings.model_kind.layerwise else (),
        clusters=int(settings.clusters), max_width=int(settings.max_width),
        neuron_eps=float(settings.eps_neuron), neuron_criterion=settings.neuron_criterion)


def node_config(settings: Settings, plan: Any) -> dict[str, Any]:
    """What every message of the run carries to the nodes: the settings this run's node
    code reads (:data:`READ_ONLY_WHEN` leaves out the others), with the plan's choices
    for the logistic model's Gram layer (its ``gram-rank`` and whether class Gram
    matrices travel: under secure aggregation as SecAgg+ sums, whole) and none where the
    replies carry only noised sums (DP)."""
    out = {key: value for key, value in settings.for_nodes().items()
           if key not in READ_ONLY_WHEN or READ_ONLY_WHEN[key](settings)}
    if not settings.space_kind.statistics:
        return out
    if plan.layer_size is not None:  # the logistic model: the layer's size is known
        out["gram-rank"] = int(plan.gram_rank)
        out["class-grams"] = "true" if plan.class_grams is True else "false"
    elif settings.secure_aggregation or settings.dp_epsilon:
        out["class-grams"] = "false"
    return out
