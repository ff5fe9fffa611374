"""Before the first round: ask every node who it is and check its data fits the run.

The server sends each connected node a ``query`` message carrying the run settings;
the node answers with its stable name (``node-name`` in its node config) and the shape
of its data (:func:`gems_fl.protocol.node.handle_query`). A node whose data does not fit (a
wrong number of features or classes, an unreadable file) answers with an error that
names the problem; it is logged with its node id, recorded in the results and left
out of every round. The node names are used from then on in logs and results, since
Flower gives a restarted SuperNode a new node id.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

from flwr.app import Message, MessageType
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.protocol import wire
from gems_fl.settings import Settings
from gems_fl.protocol.strategy import validate_replies


@dataclass
class Roster:
    """The nodes that take part, their names, and the ones left out."""

    participants: list[int]
    names: dict[int, str]
    sources: dict[int, str] = field(default_factory=dict)
    counts: dict[int, dict[str, int]] = field(default_factory=dict)
    rejected: list[dict[str, object]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)

    def nodes_json(self) -> list[dict[str, Any]]:
        """One entry per participating node, for the results file."""
        return [{"node_id": int(n), "name": self.names[n], "data": self.sources.get(n, ""),
                 **self.counts.get(n, {})} for n in self.participants]


def identify_nodes(grid: Grid, node_ids: list[int], settings: Settings,
                   num_features: int, num_classes: int) -> Roster:
    """Query ``node_ids``; keep those whose data has the run's features and classes."""
    t0 = time.perf_counter()
    content = wire.encode_config(settings.to_config())
    messages = [Message(content=content, message_type=MessageType.QUERY, dst_node_id=n,
                        group_id="identify", ttl=settings.round_timeout) for n in node_ids]
    replies = list(grid.send_and_receive(messages, timeout=settings.round_timeout))
    bytes_received = sum(wire.content_bytes(r.content) for r in replies if not r.has_error())

    def check(reply_content):  # noqa: ANN001, ANN202
        name, source, counts = wire.decode_identity(reply_content)
        if counts["num-features"] != num_features or counts["num-classes"] != num_classes:
            raise wire.ReplyError(
                f"node '{name}' holds data with {counts['num-features']} features and "
                f"{counts['num-classes']} classes; the run's dataset '{settings.dataset}' has "
                f"{num_features} and {num_classes}")
        return name, source, counts

    accepted, rejected = validate_replies(replies, node_ids, check, log_prefix="Identify: ")
    roster = Roster(participants=[], names={}, rejected=rejected)
    duplicates = {name for name, k in Counter(d[0] for _, d in accepted).items() if k > 1}
    for node_id, (name, source, counts) in sorted(accepted, key=lambda item: item[1][0]):
        if name in duplicates:
            log(WARNING, "Identify: several nodes call themselves '%s'; give each SuperNode "
                "its own node-name (node config) so results can tell them apart", name)
        roster.participants.append(node_id)
        roster.names[node_id] = name
        roster.sources[node_id] = source
        roster.counts[node_id] = counts
        log(INFO, "Identify: node '%s' (id %d): %s, %d train / %d val", name, node_id, source,
            counts["num-train-examples"], counts["num-val-examples"])
    roster.report = {"bytes_sent": wire.content_bytes(content) * len(node_ids),
                     "bytes_received": bytes_received, "wall_s": time.perf_counter() - t0}
    return roster
