"""The GEMS Flower strategy (convex protocol: one round).

Round 1 sends every node the run settings; each node replies with its good-enough
space. :meth:`GEMS.aggregate_train` validates every reply, drops the bad ones with a
log line naming the node, and intersects the rest. The spaces, the rejections and the
intersection report stay on the strategy (:attr:`GEMS.outcome`) for the results.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.geometry.kinds import AggregateOptions, SpaceOptions
from gems_fl.learning.models import vector_to_state
from gems_fl.protocol import wire
from gems_fl.protocol.base import ConvexOutcome, GEMSBase, NodeReply, aggregate_layer_spaces, select_nodes
from gems_fl.protocol.replies import NotEnoughRepliesError, decode_reply, validate_replies
from gems_fl.protocol.wire import content_bytes
from gems_fl.settings import Settings


class GEMS(GEMSBase):
    """Aggregate nodes' good-enough model spaces by intersecting them (one round).

    Parameters
    ----------
    settings : Settings
        Validated run settings; the nodes' part goes to every node in the train message.
    shapes : dict[str, tuple[int, ...]]
        ``state_dict`` shapes of the model every reply must match.
    participants, names, extra_config
        See :class:`gems_fl.protocol.base.GEMSBase`.
    """

    def __init__(self, settings: Settings, shapes: dict[str, tuple[int, ...]],
                 participants: list[int] | None = None,
                 names: Mapping[int, str] | None = None,
                 extra_config: Mapping[str, Any] | None = None) -> None:
        super().__init__(settings, participants, names, extra_config)
        self.shapes = shapes
        self.rounds: list[dict[str, Any]] = []
        self._sent_to: list[int] = []
        self._gone: list[dict[str, object]] = []

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.settings
        log(INFO, "\t├── space: %s, eps=%s, p=%d directions", s.space, s.eps, s.num_directions)
        log(INFO, "\t├── radius bisection over [0, %s] to width %s",
            SpaceOptions.from_settings(s).bound, s.delta)
        log(INFO, "\t└── min valid replies: %d, no-intersection fallback: %s",
            s.min_replies, s.no_intersection)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per participating node, carrying the nodes' settings."""
        self._t0 = time.perf_counter()
        self._sent_to, self._gone = select_nodes(grid, self.participants, self.names)
        content = wire.encode_config(self.node_config())
        self.rounds.append({"round": server_round, "nodes": list(self._sent_to),
                            "bytes_sent": content_bytes(content) * len(self._sent_to)})
        return self._send(content, self._sent_to, server_round)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, intersect the accepted spaces, return ``h_G``."""
        replies = list(replies)
        self.rounds[-1]["bytes_received"] = sum(
            content_bytes(r.content) for r in replies if not r.has_error())
        accepted, rejected = self._validate(replies)
        self.outcome = ConvexOutcome(accepted=accepted, rejected=self._gone + rejected)
        self.rounds[-1]["wall_s"] = time.perf_counter() - self._t0
        if len(accepted) < self.settings.min_replies:
            raise NotEnoughRepliesError(
                f"only {len(accepted)} valid repl{'y' if len(accepted) == 1 else 'ies'} "
                f"from {len(self._sent_to)} nodes; min-replies={self.settings.min_replies}. "
                "See the rejection log lines above, or lower min-replies."
            )
        result = aggregate_layer_spaces(accepted, AggregateOptions.from_settings(self.settings),
                                        self.names)
        self.outcome.intersection = result
        num_classes, num_features = self.shapes["weight"]
        state = vector_to_state(result.point, num_features, num_classes)
        metrics = MetricRecord({
            "intersection-found": int(result.found),
            "objective": float(result.objective),
            "num-accepted": len(accepted),
            "num-rejected": len(rejected),
        })
        return wire.array_record(state), metrics

    def _validate(self, replies: Iterable[Message]) -> tuple[list[NodeReply], list[dict[str, object]]]:
        decoded, rejected = validate_replies(
            replies, self._sent_to,
            lambda content: decode_reply(content, self.shapes, self.settings.space,
                                         self.settings.gram_rank,
                                         labels=self.settings.label_moments),
            log_prefix=f"Round {len(self.rounds)}: ", names=self.names, messages=self._messages)
        return [NodeReply(node, space, metrics) for node, (space, metrics) in decoded], rejected
