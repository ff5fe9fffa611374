"""What both GEMS strategies share: the accepted replies, the node selection, the
messages they send, and the choice of ``h_G`` for one linear layer.

:class:`GEMSBase` holds the state the convex (:class:`gems_fl.protocol.strategy.GEMS`)
and the layer-wise (:class:`gems_fl.protocol.layerwise.LayerwiseGEMS`) strategies
share; the replies themselves are checked in :mod:`gems_fl.protocol.replies`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from gems_fl.geometry.eps import zero_radius_reason
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.kinds import AggregateOptions, space_kind
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.threads import compute_threads
from gems_fl.naming import describe_node
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.replies import rejection_record
from gems_fl.protocol.rounds import Round, round_messages


@dataclass
class NodeReply:
    """One accepted reply."""

    node_id: int
    space: Space | GramSpace
    metrics: dict[str, float]


@dataclass
class ConvexOutcome:
    """Everything the convex round produced, for baselines and the results file."""

    accepted: list[NodeReply]
    rejected: list[dict[str, object]] = field(default_factory=list)
    intersection: IntersectionResult | None = None


def select_nodes(grid: Grid, participants: list[int] | None, names: Mapping[int, str],
                 log_prefix: str = "") -> tuple[list[int], list[dict[str, object]]]:
    """The participants still connected, and a rejection record for each one gone.

    ``participants`` None means every connected node.
    """
    connected = sorted(grid.get_node_ids())
    if participants is None:
        return connected, []
    now = set(connected)
    gone = [n for n in participants if n not in now]
    for node_id in gone:
        log(WARNING, "%sNode %s disconnected before the round; it gets no message",
            log_prefix, describe_node(node_id, names))
    return ([n for n in participants if n in now],
            [rejection_record(n, names, "disconnected before the round") for n in gone])


def aggregate_layer_spaces(
    nodes: list[NodeReply], options: AggregateOptions, names: Mapping[int, str]
) -> IntersectionResult:
    """``h_G`` for the accepted spaces of one linear layer, with membership per node.

    The kind decides how (:meth:`gems_fl.geometry.kinds.SpaceKind.aggregate`): Gram
    spaces the closed-form weighted center; the paper's balls and ellipsoids the
    verified intersection (Dykstra, then the ``no-intersection`` fallback).
    """
    for reply in nodes:
        if reply.space.radius == 0.0:
            log(WARNING, "Node %s: its space is the single point of its model (radius 0): %s.",
                describe_node(reply.node_id, names),
                zero_radius_reason(reply.metrics["local-val-accuracy"], reply.metrics.get("eps")))
    kind = space_kind(options.kind)
    with compute_threads():  # the thread count fixes the bits: as the selection round's
        result = kind.aggregate([r.space for r in nodes],
                                [r.metrics["num-train-examples"] for r in nodes], options)
    log(INFO if result.found or not kind.outside_is_fault else WARNING, "%s",
        kind.report(result, options))
    return result


class GEMSBase(Strategy):
    """The state and the steps both GEMS strategies share.

    Parameters
    ----------
    options : ServerOptions
        What the strategy reads (built from the settings and the run plan by
        :func:`gems_fl.settings.options.server_options`); ``options.exchange.node_config``
        goes to every node in every train message.
    participants : list of int, optional
        Node ids to send to (those that passed the server's identity check); None
        sends to every connected node.
    names : dict, optional
        Node id -> stable node name, for logs and results.
    extra_config : dict, optional
        Keys added to the node config in every train message (the identity round's
        :class:`gems_fl.data.agreement.DataAgreement`).
    later_config : dict, optional
        The same after round 1 (default: ``extra_config``): the kernel map's landmarks
        by their hash.
    """

    def __init__(self, options: ServerOptions, participants: list[int] | None = None,
                 names: Mapping[int, str] | None = None,
                 extra_config: Mapping[str, Any] | None = None,
                 later_config: Mapping[str, Any] | None = None) -> None:
        self.options = options
        self.extra_config = dict(extra_config or {})  # the data agreement, for every node
        # after round 1: the same agreement, the kernel map's landmarks by their hash only
        self.later_config = dict(self.extra_config if later_config is None else later_config)
        self.participants = participants
        self.names = dict(names or {})
        self.outcome: ConvexOutcome | None = None
        self._messages: list[Message] = []
        self._t0 = 0.0

    def node_config(self, first: bool = False) -> dict[str, Any]:
        """What every train message's config record carries: the nodes' settings and
        the data agreement (whole in round 1, ``first``; later the kernel map's landmarks
        by their hash, which the nodes keep from round 1)."""
        return {**self.options.exchange.node_config,
                **(self.extra_config if first else self.later_config)}

    def _send(self, round_name: Round, content: RecordDict, nodes: list[int],
              server_round: int) -> list[Message]:
        """One message of ``round_name`` per node; each lives ``round-timeout`` seconds (its
        TTL), so work for a slow or dead node does not stay queued after the round gave up
        on it."""
        self._messages = round_messages(round_name, content, nodes, group_id=str(server_round),
                                        ttl=self.options.round_timeout)
        return self._messages

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """No Flower evaluate round: the server evaluates, and the nodes check ``h_G`` in
        the run's own evaluate round (:mod:`gems_fl.protocol.verify`)."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None
