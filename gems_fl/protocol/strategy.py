"""The GEMS Flower strategy (convex protocol: one round).

Round 1 sends every node the run settings; each node replies with its good-enough
space. :meth:`GEMS.aggregate_train` validates every reply, drops the bad ones with a
log line naming the node, and intersects the rest. The spaces, the rejections and the
intersection report stay on the strategy (:attr:`GEMS.outcome`) for the results.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from dataclasses import replace

from gems_fl.geometry.choices import POOLED_POINTS
from gems_fl.geometry.gram_merge import gram_result
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.kinds import AggregateOptions, SpaceOptions, space_kind
from gems_fl.learning.models import vector_to_state
from gems_fl.naming import describe_node
from gems_fl.protocol import wire
from gems_fl.protocol.base import ConvexOutcome, GEMSBase, NodeReply, aggregate_layer_spaces, select_nodes
from gems_fl.geometry.pooled import pooled_gram
from gems_fl.geometry.refine import bohning_step, pooled_gradient
from gems_fl.geometry.selection import TEMPERATURES, choose_candidate
from gems_fl.protocol.replies import (
    NotEnoughRepliesError,
    _rejection,
    decode_gradient_reply,
    decode_reply,
    decode_selection_reply,
    validate_replies,
)
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
        self.point: np.ndarray | None = None  # h_G, then refined by each refinement round
        self._pooled_gram: tuple[tuple[int, ...], np.ndarray | None] = ((), None)
        self._sent_to: list[int] = []
        self._gone: list[dict[str, object]] = []
        # the selection round's candidates: (pooled ridge or None, the one-shot result)
        self._candidates: list[tuple[float | None, IntersectionResult]] = []

    @property
    def selects(self) -> bool:
        """Whether a selection round follows the spaces: to choose the pooled ridge
        (``pooled-ridge=auto``) or the logit scale the refinement steps start from."""
        s = self.settings
        return bool(s.refine_rounds) or (s.space == "gram" and s.gram_point in POOLED_POINTS
                                         and len(s.pooled_ridges) > 1)

    @property
    def num_rounds(self) -> int:
        """The round of spaces, the selection round (:attr:`selects`), ``refine-rounds`` steps."""
        return 1 + int(self.selects) + self.settings.refine_rounds

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
        if server_round > 1:
            return self._configure_refine(server_round, grid)
        self._sent_to, self._gone = select_nodes(grid, self.participants, self.names)
        content = wire.encode_config(self.node_config())
        self.rounds.append({"round": server_round, "nodes": list(self._sent_to),
                            "bytes_sent": content_bytes(content) * len(self._sent_to)})
        return self._send(content, self._sent_to, server_round)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, intersect the accepted spaces, return ``h_G``."""
        if server_round > 1:
            return self._aggregate_refine(server_round, list(replies))
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
        options = AggregateOptions.from_settings(self.settings)
        result = aggregate_layer_spaces(accepted, options, self.names)
        self.outcome.intersection = result
        if self.selects:
            self._candidates = self._candidate_points(accepted, options, result)
        self.point = np.asarray(result.point, dtype=np.float64)
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

    # ---- the selection round and the refinement steps (space='gram') --------------------

    def _candidate_points(self, accepted: list[NodeReply], options: AggregateOptions,
                          result: IntersectionResult) -> list[tuple[float | None, IntersectionResult]]:
        """The one-shot point for each pooled ridge (``pooled-ridge=auto``), else ``h_G``."""
        ridges = self.settings.pooled_ridges
        if not (options.gram_point in POOLED_POINTS and len(ridges) > 1):
            return [(None, result)]
        kind = space_kind(options.kind)
        spaces = [r.space for r in accepted]
        counts = [r.metrics["num-train-examples"] for r in accepted]
        return [(r, result if r == options.pooled_ridge else
                 kind.aggregate(spaces, counts, replace(options, pooled_ridge=r)))
                for r in ridges]

    def _configure_refine(self, server_round: int, grid: Grid) -> Iterable[Message]:
        """Round 2, the selection round: the candidate models and the logit scales to score
        on every node's validation split. Later rounds: the current model, for a gradient.
        Sent to every node whose space was accepted and is still there."""
        accepted = [r.node_id for r in self.outcome.accepted]
        self._sent_to, gone = select_nodes(grid, accepted, self.names,
                                           log_prefix=f"Round {server_round}: ")
        num_classes, num_features = self.shapes["weight"]
        step = server_round - 2  # 0: the selection round
        if step == 0:
            points = np.stack([r.point.reshape(num_classes, -1) for _, r in self._candidates])
            content = wire.encode_selection_round(self.node_config(), points, TEMPERATURES)
        else:
            content = wire.encode_refine_round(
                self.node_config(), step, vector_to_state(self.point, num_features, num_classes))
        self.rounds.append({"round": server_round, "refine": step,
                            "nodes": list(self._sent_to), "rejected": gone,
                            "bytes_sent": content_bytes(content) * len(self._sent_to)})
        return self._send(content, self._sent_to, server_round)

    def _aggregate_refine(self, server_round: int,
                          replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Pool the nodes' gradients and take Bohning's step from the current model; in
        the selection round, keep the candidate and the scale the nodes' scores favour."""
        record = self.rounds[-1]
        record["bytes_received"] = sum(content_bytes(r.content) for r in replies
                                       if not r.has_error())
        if record["refine"] == 0:
            return self._select(server_round, record, replies)
        spaces = {r.node_id: r for r in self.outcome.accepted}
        decoded, rejected = validate_replies(
            replies, self._sent_to,
            lambda content: decode_gradient_reply(content, self.shapes),
            log_prefix=f"Round {server_round}: ", names=self.names, messages=self._messages)
        usable = []
        for node_id, (gradient, metrics) in decoded:
            expected = int(spaces[node_id].metrics["num-train-examples"])
            if int(metrics["num-train-examples"]) != expected:
                reason = (f"refinement reply counts {int(metrics['num-train-examples'])} "
                          f"training rows; its space was fitted on {expected}")
                log(WARNING, "Round %d: Rejected reply from node %s: %s", server_round,
                    describe_node(node_id, self.names), reason)
                rejected.append(_rejection(node_id, self.names, reason))
                continue
            usable.append((node_id, gradient, metrics))
        record["rejected"] = record["rejected"] + rejected
        if len(usable) < self.settings.min_replies:
            raise NotEnoughRepliesError(
                f"refinement step {record['refine']}: only {len(usable)} valid replies; "
                f"min-replies={self.settings.min_replies}")
        counts = [m["num-train-examples"] for _, _, m in usable]
        nodes = tuple(node_id for node_id, _, _ in usable)
        if self._pooled_gram[0] != nodes:  # the same nodes every step: sum their G_k once
            self._pooled_gram = (nodes, pooled_gram([spaces[n].space.gram for n in nodes],
                                                    counts).numpy())
        weights = np.asarray(counts) / np.sum(counts)
        gradient = pooled_gradient([g for _, g, _ in usable], counts)
        loss = float(np.dot(weights, [m["loss"] for _, _, m in usable]))
        num_classes = self.shapes["weight"][0]
        self.point = bohning_step(self.point.reshape(num_classes, -1), gradient,
                                  self._pooled_gram[1], self._step_ridge).reshape(-1)
        record.update({"nodes": [node_id for node_id, _, _ in usable], "loss_before": loss,
                       "wall_s": time.perf_counter() - self._t0})
        log(INFO, "Refinement step %d: pooled training loss %.4f at the model sent, %d nodes",
            record["refine"], loss, len(usable))
        state = vector_to_state(self.point, self.shapes["weight"][1], num_classes)
        return wire.array_record(state), MetricRecord({"loss": loss, "nodes": len(usable)})

    @property
    def _step_ridge(self) -> float:
        """The ridge of Bohning's step: the pooled ridge chosen (or set), else the default."""
        chosen = self.outcome.intersection.details.get("pooled_ridge")
        return float(chosen) if chosen is not None else AggregateOptions.from_settings(
            self.settings).pooled_ridge

    def _select(self, server_round: int, record: dict[str, Any],
                replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Keep the candidate with the best pooled validation accuracy; scale it by the
        logit scale with the lowest pooled validation cross-entropy when the model is the
        pooled point or is refined next (the closed-form and best points keep their scale,
        which places them in the spaces)."""
        m = len(self._candidates)
        decoded, rejected = validate_replies(
            replies, self._sent_to,
            lambda content: decode_selection_reply(content, m, len(TEMPERATURES)),
            log_prefix=f"Round {server_round}: ", names=self.names, messages=self._messages)
        record["rejected"] = record["rejected"] + rejected
        if len(decoded) < self.settings.min_replies:
            raise NotEnoughRepliesError(
                f"selection round: only {len(decoded)} valid replies; "
                f"min-replies={self.settings.min_replies}")
        choice = choose_candidate([v[0] for _, v in decoded], [v[1] for _, v in decoded],
                                  [v[2] for _, v in decoded], TEMPERATURES)
        ridge, result = self._candidates[choice.index]
        scale = (choice.temperature if self.settings.refine_rounds
                 or result.method == "pooled" else 1.0)
        details = dict(result.details)
        details["selection"] = {
            "candidates": [{"pooled_ridge": r, "val_accuracy": float(a),
                            "val_loss": float(min(loss))}
                           for (r, _), a, loss in zip(self._candidates, choice.val_accuracy,
                                                      choice.val_loss)],
            "temperature": choice.temperature, "scale_applied": scale}
        if scale != 1.0 or len(self._candidates) > 1:
            spaces = [r.space for r in self.outcome.accepted]
            result = gram_result(spaces, scale * result.point, result.method, details)
        else:
            result.details.update(details)
        self.outcome.intersection = result
        self.point = np.asarray(result.point, dtype=np.float64)
        best = choice.val_loss[choice.index]
        record.update({"nodes": [node_id for node_id, _ in decoded],
                       "pooled_ridge": ridge, "temperature": scale,
                       "val_accuracy": float(choice.val_accuracy[choice.index]),
                       "val_losses": dict(zip(map(str, TEMPERATURES), map(float, best))),
                       "candidates": details["selection"]["candidates"],
                       "wall_s": time.perf_counter() - self._t0})
        ridge_text = f"pooled ridge {ridge:g}, " if ridge is not None else ""
        log(INFO, "Selection round: %slogit scale %g (pooled validation accuracy %.4f, "
            "cross-entropy %.4f; %d nodes); h_G lies in %d of %d spaces", ridge_text, scale,
            choice.val_accuracy[choice.index], float(np.min(best)), len(decoded),
            sum(result.inside), len(result.inside))
        num_classes, num_features = self.shapes["weight"]
        state = vector_to_state(self.point, num_features, num_classes)
        return wire.array_record(state), MetricRecord({"temperature": scale})
