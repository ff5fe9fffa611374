"""The option objects the protocol takes, each frozen and explicit: what the server's
strategies need (:class:`ServerOptions`, with :class:`Exchange` for every message they
send), what the identity round agrees on (:class:`AgreementRule`), and what a node's work
needs (:class:`NodeWork`).

They are built from the run settings and the run plan in
:mod:`gems_fl.settings.options`; the protocol never reads the settings themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gems_fl.data.feature_map import MapRound, MapRule
from gems_fl.data.feature_ranges import FeatureRanges
from gems_fl.geometry.dp import DPSpec
from gems_fl.geometry.kinds import AggregateOptions, SpaceOptions, space_kind
from gems_fl.geometry.neurons import NeuronSearch
from gems_fl.learning.recipe import LocalTraining

__all__ = ["AgreementRule", "Exchange", "NodeWork", "ServerOptions"]


@dataclass(frozen=True)
class Exchange:
    """How the server talks to the nodes in every round.

    ``node_config`` is what every message's config record carries: the settings this
    run's node code reads, with the server's ``auto`` choices resolved
    (:func:`gems_fl.settings.options.node_config`).
    """

    node_config: Mapping[str, Any]
    round_timeout: float
    min_replies: int


@dataclass(frozen=True)
class AgreementRule:
    """What the identity round agrees on (:func:`gems_fl.protocol.roster.agree`).

    ``dataset``: a named dataset fixes the features and classes; ``node-files`` lets the
    nodes' data decide. ``num_features`` 0: the count most nodes report. ``classes``: the
    ``classes`` setting's text (names, a count, or empty). ``standardize``: ``federated``
    combines the nodes' per-feature sums into one mean and std. ``min_rows``: a site with
    fewer training rows is left out.
    """

    dataset: str
    num_features: int = 0
    classes: str = ""
    standardize: str = "off"
    min_rows: int = 1  # node-files: a site with fewer training rows is left out
    ranges: FeatureRanges | None = None  # standardize='ranges': the declared feature ranges
    #: how the model's map of the rows is built (its ``map_rule``); None: no map
    map: MapRule | None = None
    #: the model's own round for its map (``map_round``), where ``map.round_asks`` asks one
    map_round: MapRound | None = None
    #: a map built from the nodes' rows, under dp-epsilon: ``agreement -> (rows, labels)``,
    #: the server's own public rows scaled as the nodes scale theirs; the map comes from
    #: them, and the map's own round does not run (nothing of a node's unnoised)
    public_rows: Callable[[Any], tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class ServerOptions:
    """What the GEMS strategies read, every ``auto`` already resolved by the run plan.

    ``space`` is how the nodes search (logged, and the Gram replies' form for decoding);
    ``aggregate`` how the server picks ``h_G``; ``pooled_ridges`` the regularisations the
    selection round scores; ``selects`` whether that round runs; ``holds_sums`` whether
    the server keeps only the sums of the nodes' Gram statistics. The last fields serve
    the layer-wise strategy (the MLP).
    """

    exchange: Exchange
    seed: int
    space: SpaceOptions
    aggregate: AggregateOptions
    pooled_ridges: tuple[float, ...] = ()
    selects: bool = False
    refine_rounds: int = 0
    refine_method: str = "secant"
    refine_l2: float = 0.0
    holds_sums: bool = False
    server_grams: str = "auto"
    secure_aggregation: bool = False
    secure_threshold: float = 0.5
    dp: bool = False
    hidden_widths: tuple[int, ...] = ()
    clusters: int = 0
    max_width: int = 0
    neuron_eps: float = 0.1
    neuron_criterion: str = "rms"

    @property
    def min_replies(self) -> int:
        return self.exchange.min_replies

    @property
    def round_timeout(self) -> float:
        return self.exchange.round_timeout


@dataclass(frozen=True)
class NodeWork:
    """What a node's work in the protocol needs to know, from the settings it received:
    how it trains (:class:`LocalTraining`), how it finds a linear layer's space
    (:class:`SpaceOptions`; ``space.eps`` is its target accuracy), how it searches its
    neurons' radii (MLP), and, under differential privacy, the release it makes."""

    training: LocalTraining
    space: SpaceOptions
    neuron_eps: float = 0.1
    neuron_delta: float = 0.01
    neuron_criterion: str = "rms"
    dp: DPSpec | None = None
    dp_seeded_noise: bool = False

    @property
    def eps(self) -> float:
        return self.space.eps

    def neuron_search(self, seed: int) -> NeuronSearch:
        """The per-neuron radius search: neuron balls live in parameter space."""
        return NeuronSearch(eps=self.neuron_eps, num_directions=self.space.num_directions,
                            r_max=self.space.r_max or space_kind("ball").r_max,
                            delta=self.neuron_delta, seed=seed,
                            criterion=self.neuron_criterion)
