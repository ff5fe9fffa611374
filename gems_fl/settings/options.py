"""The option objects the geometry takes, built from the run settings: the geometry never
reads :class:`~gems_fl.settings.Settings` itself."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gems_fl.geometry.choices import SUMS_ABOVE_NODES
from gems_fl.geometry.kinds import AggregateOptions, SpaceOptions
from gems_fl.geometry.points import point_named, solvable_from_sums

__all__ = ["aggregate_options", "holds_sums", "space_options"]

#: a :class:`gems_fl.settings.Settings` (not imported: that package imports this module)
Settings = Any


def space_options(settings: Settings) -> SpaceOptions:
    """How a node finds its space; no class Gram matrices under secure aggregation or DP,
    whose replies carry only sums."""
    options = SpaceOptions(
        kind=settings.space, eps=settings.eps, num_directions=settings.num_directions,
        r_max=settings.r_max, delta=settings.delta, ellipsoid_c=settings.ellipsoid_c,
        ellipsoid_floor=settings.ellipsoid_floor, gram_rank=settings.gram_rank,
        label_moments=settings.label_moments, class_grams=settings.class_grams,
        class_components=settings.class_components)
    if settings.secure_aggregation or settings.dp_epsilon:
        return replace(options, class_grams="false")
    return options


def aggregate_options(settings: Settings) -> AggregateOptions:
    """How the server picks ``h_G``: the point at its value without a selection round
    (``pooled-ridge=auto``: the point's default; the selection round scores the others)."""
    return AggregateOptions(
        kind=settings.space, no_intersection=settings.no_intersection, seed=settings.seed,
        gram_ridge=settings.gram_ridge, gram_point=settings.gram_point,
        pooled_ridge=point_named(settings.gram_point).value(settings.pooled_ridges))


def holds_sums(settings: Settings, num_nodes: int) -> bool:
    """Whether the server keeps only the sums of the nodes' Gram statistics
    (``server-grams``): ``sums``, or ``auto`` above ``SUMS_ABOVE_NODES`` nodes for the
    logistic model when the point needs no single node's matrix; always under secure
    aggregation and DP."""
    if settings.server_grams == "nodes" or settings.space != "gram" \
            or settings.model != "logistic":
        return False
    if settings.server_grams == "sums" or settings.secure_aggregation or settings.dp_epsilon:
        return True
    return num_nodes > SUMS_ABOVE_NODES and solvable_from_sums(settings.gram_point)
