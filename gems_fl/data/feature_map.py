"""What a model's fixed map of the rows is, and how the identity round agrees on one.

A convex model may fit its layer on ``z(x)`` instead of on the (scaled) rows ``x``: the
random-feature map, the kernel model's Nyström map, or a map a new model brings. Each
map is a :class:`FeatureMap` (built once by the server, sent with every later message,
saved with the model) and comes with a :class:`MapRule`, the model's word on how the
identity round builds it from what the nodes said (:class:`MapEvidence`). The registered
model names both (:class:`gems_fl.learning.model_kinds.ModelKind`); the protocol asks
them, and never which map it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gems_fl.data.site_files import combine_stats

__all__ = ["FeatureMap", "MapEvidence", "MapRound", "MapRule", "NodeEvidence"]

#: a node's per-feature sums ``(rows, sum, sum of squares)``
Stats = tuple[int, np.ndarray, np.ndarray]


class FeatureMap(Protocol):
    """What the package asks of a model's fixed map of the (scaled) rows. The class also
    reads one back: ``from_config(config)`` (a message's config keys) and
    ``from_saved(record, arrays)`` (a saved model), each None where it carries no such map.
    A map with a large part (the kernel map's landmarks) may declare ``LARGE_CONFIG = (the
    part's config key, its hash's key)``: ``to_config(whole=False)`` then sends only the
    hash, and each node keeps the part from the run's first message
    (:func:`gems_fl.protocol.map_round.with_kept_map_part`)."""

    JSON_KEY: str  # results.json's dataset record names the map by it
    dim: int
    raw_columns: int  # the leading columns of z(x) that are the rows themselves

    def transform(self, x: np.ndarray) -> np.ndarray: ...
    def to_config(self, whole: bool = True) -> dict[str, Any]: ...
    def to_json(self) -> dict[str, Any]: ...
    def arrays(self) -> dict[str, np.ndarray]: ...
    def describe(self) -> str: ...


@dataclass(frozen=True)
class NodeEvidence:
    """One node that fits the run, as the identity round heard it: its per-feature sums in
    the run's column order (None where it sent none) and what it sent in the map's own
    round (None before that round, or where the map has none)."""

    stats: Stats | None
    sent: np.ndarray | None = None


@dataclass(frozen=True)
class MapEvidence:
    """What the identity round knows when it builds a model's map.

    ``nodes``: the nodes that fit, in name order. ``mean``/``std``: the run's shared
    scaling (None where each node scales its own rows, ``node_scaling``, or none does).
    ``public_rows``: the server's own public rows and labels, scaled as the nodes scale
    theirs, where the run builds the map from them (``dp-epsilon``), else None.
    """

    num_features: int
    nodes: tuple[NodeEvidence, ...]
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    node_scaling: bool = False
    public_rows: Callable[[], tuple[np.ndarray, np.ndarray]] | None = None

    def stats(self, nodes: tuple[NodeEvidence, ...] | None = None) -> list[Stats]:
        """The per-feature sums of ``nodes`` (default: all) that sent them."""
        return [n.stats for n in (self.nodes if nodes is None else nodes) if n.stats is not None]

    def scaling(self, stats: list[Stats]) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(mean, std)`` as the nodes will scale their rows: the run's shared scaling, or
        under ``node_scaling`` the pooled ``stats``' (each node's own, pooled: near enough)."""
        if self.std is None and self.node_scaling:
            return combine_stats(stats)
        return self.mean, self.std


class MapRule(Protocol):
    """How the identity round builds a model's map (the model's ``map_rule`` makes it from
    the settings)."""

    #: what the map's own round asks of the nodes in all (the kernel model's landmarks);
    #: 0: no such round
    round_asks: int

    def agree(self, evidence: MapEvidence) -> tuple[FeatureMap | None, str | None]:
        """The run's map (None where no node gave what it needs yet) and a line for the
        log saying how it was built (None: nothing worth a line)."""


class MapRound(Protocol):
    """A model's own round after the identity round (the kernel model's landmarks): each
    node that fits sends summaries of its rows, never a row, and the model's
    :class:`MapRule` builds the map from them (:attr:`NodeEvidence.sent`). The protocol
    carries the arrays (:mod:`gems_fl.protocol.map_round`); this object says what they are."""

    def summarize(self, x_train: np.ndarray, y_train: np.ndarray, share: float,
                  seed: int) -> dict[str, np.ndarray]:
        """A node's answer from its (scaled) training rows: about ``share`` summaries per
        row, as named arrays."""

    def check(self, arrays: Mapping[str, np.ndarray], num_features: int,
              most: int) -> np.ndarray:
        """The summaries a reply's ``arrays`` hold, checked (at most ``most`` of
        ``num_features`` each); ``ValueError`` saying what is wrong."""

    def report(self, kept: int, asked: int, rows: int) -> dict[str, Any]:
        """What results.json records of the round: ``kept`` summaries of ``asked``, from
        ``rows`` training rows in all."""

    def describe(self, kept: int, nodes: int) -> str:
        """The round's outcome in words, for the log."""
