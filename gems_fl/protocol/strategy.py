"""The GEMS Flower strategy (convex protocol: one round).

Round 1 sends every node the run settings; each node replies with its good-enough
space. :meth:`GEMS.aggregate_train` validates every reply, drops the bad ones with a
log line naming the node, and intersects the rest. The spaces, the rejections and the
intersection report stay on the strategy (:attr:`GEMS.outcome`) for the results.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from gems_fl.geometry.gram_merge import aggregate_gram
from gems_fl.geometry.intersect import IntersectionResult, find_intersection
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.models import vector_to_state
from gems_fl.protocol import wire
from gems_fl.protocol.wire import content_bytes
from gems_fl.settings import Settings


class NotEnoughRepliesError(RuntimeError):
    """Fewer valid replies than ``min-replies``: no aggregate can be formed."""


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


def validate_replies(
    replies: Iterable[Message],
    sent_to: Iterable[int],
    decode: Callable[[RecordDict], tuple[Any, ...]],
    log_prefix: str = "",
    names: Mapping[int, str] | None = None,
    messages: Iterable[Message] | None = None,
) -> tuple[list[tuple[int, tuple[Any, ...]]], list[dict[str, object]]]:
    """Decode every reply; reject the bad and the missing with a log line naming the node.

    ``decode`` raises :class:`gems_fl.protocol.wire.ReplyError` for a bad reply; its result's
    first item is a :class:`Space` or an array. Accepted replies come back as
    ``(node_id, decoded)`` in a canonical order (a hash of that first item), not by
    random node id or arrival, so the aggregate and every number stay reproducible.
    ``names`` maps node ids to the nodes' stable names (their node config's
    ``node-name``) for the log lines and the rejection records.

    ``messages`` (the messages sent, their ids set by the Grid) maps each reply to the
    node it answers for: an error the SuperLink itself returns for a dead node (Flower's
    ``NODE_UNAVAILABLE``, sent from the SuperLink's own id) is recorded against that
    node. Each node gets at most one rejection entry.
    """
    names = names or {}
    by_message = {m.metadata.message_id: m.metadata.dst_node_id for m in messages or []
                  if m.metadata.message_id}
    accepted: list[tuple[int, tuple[Any, ...]]] = []
    rejected: list[dict[str, object]] = []
    seen: set[int] = set()
    sent_to = list(sent_to)
    for reply in replies:
        node_id = reply_node(reply, by_message)
        if node_id in seen:
            continue
        seen.add(node_id)
        try:
            if reply.has_error():
                raise wire.ReplyError(error_reason(reply))
            accepted.append((node_id, decode(reply.content)))
        except wire.ReplyError as exc:
            entry = _rejection(node_id, names, str(exc))
            if exc.node_name and "node_name" not in entry:
                entry["node_name"] = exc.node_name
            log(WARNING, "%sRejected reply from node %s: %s", log_prefix,
                describe_node(node_id, {node_id: str(entry["node_name"])}
                              if "node_name" in entry else names), exc)
            rejected.append(entry)
    for node_id in sent_to:
        if node_id not in seen:
            log(WARNING, "%sNo reply from node %s (timed out or lost)", log_prefix,
                describe_node(node_id, names))
            rejected.append(_rejection(node_id, names, "no reply"))
    accepted.sort(key=lambda item: _canonical_key(item[1][0]))
    log(INFO, "%sReplies from %d of %d nodes: accepted %s; rejected or missing %s", log_prefix,
        len(accepted), len(sent_to), describe_nodes([n for n, _ in accepted], names),
        ", ".join(describe_node(int(r["node_id"]), names) for r in rejected) or "none")
    return accepted, rejected


def reply_node(reply: Message, by_message: Mapping[str, int]) -> int:
    """The node a reply answers for: the destination of the message it replies to (the
    SuperLink answers for a dead node from its own id), else its source."""
    return int(by_message.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id))


def error_reason(reply: Message) -> str:
    """A reply's error in words; Flower's NODE_UNAVAILABLE says what it means here."""
    if reply.error.code == ErrorCode.NODE_UNAVAILABLE:
        return ("node unavailable: the SuperLink got no heartbeat from it (SuperNode stopped "
                "or disconnected)")
    return f"client error {reply.error.code}: {reply.error.reason}"


def dedupe_rejections(entries: Iterable[dict[str, object]]) -> list[dict[str, object]]:
    """One entry per node (the first), so a node is never counted twice."""
    out: list[dict[str, object]] = []
    seen: set[int] = set()
    for entry in entries:
        node_id = int(entry["node_id"])
        if node_id in seen:
            continue
        seen.add(node_id)
        out.append(entry)
    return out


def describe_node(node_id: int, names: Mapping[int, str]) -> str:
    """``123 ('site-a')`` if the node's name is known, else its id."""
    return f"{node_id} ('{names[node_id]}')" if node_id in names else str(node_id)


# Above this many nodes log lines and printed tables count or summarise the nodes instead
# of naming each one (results.json names every node; rejected nodes are always named).
MAX_NODES_NAMED = 10


def describe_nodes(node_ids: list[int], names: Mapping[int, str]) -> str:
    """Each node described, or a count when there are more than ``MAX_NODES_NAMED``."""
    if not node_ids:
        return "none"
    if len(node_ids) > MAX_NODES_NAMED:
        return f"{len(node_ids)} nodes (named in results.json)"
    return ", ".join(describe_node(n, names) for n in node_ids)


def _rejection(node_id: int, names: Mapping[int, str], reason: str) -> dict[str, object]:
    entry: dict[str, object] = {"node_id": node_id, "reason": reason}
    if node_id in names:
        entry["node_name"] = names[node_id]
    return entry


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
            [_rejection(n, names, "disconnected before the round") for n in gone])


def _canonical_key(first: Any) -> str:
    array = first.center if isinstance(first, (Space, GramSpace)) else np.asarray(first)
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


def _share_text(shared: bool | None) -> str:
    if shared is None:  # the minimax search ran out of iterations inside its bracket
        return "may or may not share"
    return "share" if shared else "do not share"


def aggregate_layer_spaces(
    nodes: list[NodeReply], settings: Settings, names: Mapping[int, str]
) -> IntersectionResult:
    """``h_G`` for the accepted spaces of one linear layer, with membership per node.

    Gram spaces: the closed-form weighted center (:mod:`gems_fl.geometry.gram_merge`);
    the paper's balls and ellipsoids: the verified intersection (Dykstra, then the
    ``no-intersection`` fallback).
    """
    for reply in nodes:
        if reply.space.radius == 0.0:
            log(WARNING, "Node %s: its own model has validation accuracy %.3f < its eps=%s, "
                "so its space is the single point of its model (radius 0); lower eps "
                "to give it room.", describe_node(reply.node_id, names),
                reply.metrics["local-val-accuracy"], reply.metrics.get("eps", settings.eps))
    if settings.space == "gram":
        result = aggregate_gram(
            [r.space for r in nodes], [r.metrics["num-train-examples"] for r in nodes],
            weighting=settings.gram_weighting, ridge=settings.gram_ridge, point=settings.gram_point)
        log(INFO if result.found else WARNING, "Gram center (%s, weights by %s): h_G inside "
            "%d of %d spaces%s", result.method, settings.gram_weighting, sum(result.inside),
            len(nodes), "" if "spaces_share_a_point" not in result.details else
            f"; the spaces {_share_text(result.details['spaces_share_a_point'])}"
            f" a point (minimax scaled distance between "
            f"{result.details['minimax_lower_bound']:.3g} and "
            f"{result.details['minimax_scaled_distance']:.3g})")
        return result
    result = find_intersection([r.space for r in nodes], fallback=settings.no_intersection,
                               seed=settings.seed)
    if result.found:
        log(INFO, "Intersection found (%s): h_G lies in all %d spaces", result.method, len(nodes))
    else:
        log(WARNING, "NO INTERSECTION of the %d spaces; fallback '%s' used; h_G misses "
            "%d space(s), total miss %.4g", len(nodes), result.method,
            sum(not i for i in result.inside), result.objective)
    return result


class GEMS(Strategy):
    """Aggregate nodes' good-enough model spaces by intersecting them.

    Parameters
    ----------
    settings : Settings
        Validated run settings; sent to every node in the train message.
    shapes : dict[str, tuple[int, ...]]
        ``state_dict`` shapes of the model every reply must match.

    participants : list of int, optional
        Node ids to send to (those that passed the server's identity check); None
        sends to every connected node.
    names : dict, optional
        Node id -> stable node name, for logs and results.
    extra_config : dict, optional
        Keys added to the settings in every train message (the identity round's
        :class:`gems_fl.data.agreement.DataAgreement`).
    """

    def __init__(self, settings: Settings, shapes: dict[str, tuple[int, ...]],
                 participants: list[int] | None = None,
                 names: Mapping[int, str] | None = None,
                 extra_config: Mapping[str, Any] | None = None) -> None:
        self.settings = settings
        self.extra_config = dict(extra_config or {})  # the data agreement, for every node
        self._messages: list[Message] = []
        self.shapes = shapes
        self.participants = participants
        self.names = dict(names or {})
        self.outcome: ConvexOutcome | None = None
        self.rounds: list[dict[str, Any]] = []
        self._sent_to: list[int] = []
        self._gone: list[dict[str, object]] = []
        self._t0 = 0.0

    def summary(self) -> None:
        """Log the strategy's settings."""
        s = self.settings
        log(INFO, "\t├── space: %s, eps=%s, p=%d directions", s.space, s.eps, s.num_directions)
        log(INFO, "\t├── radius bisection over [0, %s] to width %s", s.r_max, s.delta)
        log(INFO, "\t└── min valid replies: %d, no-intersection fallback: %s",
            s.min_replies, s.no_intersection)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per participating node, carrying the run settings.

        Each message lives ``round-timeout`` seconds (its TTL), so work for a slow or
        dead node does not stay queued after the round gave up on it.
        """
        self._t0 = time.perf_counter()
        self._sent_to, self._gone = select_nodes(grid, self.participants, self.names)
        content = wire.encode_config({**self.settings.to_config(), **self.extra_config})
        self.rounds.append({"round": server_round, "nodes": list(self._sent_to),
                            "bytes_sent": content_bytes(content) * len(self._sent_to)})
        self._messages = [
            Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node_id,
                    group_id=str(server_round), ttl=self.settings.round_timeout)
            for node_id in self._sent_to
        ]
        return self._messages

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
        result = aggregate_layer_spaces(accepted, self.settings, self.names)
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
            lambda content: wire.decode_reply(content, self.shapes, self.settings.space,
                                              self.settings.gram_rank),
            log_prefix=f"Round {len(self.rounds)}: ", names=self.names, messages=self._messages)
        return [NodeReply(node, space, metrics) for node, (space, metrics) in decoded], rejected

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """GEMS evaluates on the server; nodes get no evaluate message."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None
