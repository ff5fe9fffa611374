"""The GEMS Flower strategy (convex protocol: one round).

Round 1 sends every node the node config; each node replies with its good-enough
space. :meth:`GEMS.aggregate_train` validates every reply, drops the bad ones with a
log line naming the node, and intersects the rest. The spaces, the rejections and the
intersection report stay on the strategy (:attr:`GEMS.outcome`) for the results.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.geometry.gram_sums import GramSums
from gems_fl.geometry.intersect import IntersectionResult
from gems_fl.geometry.points import aggregate_sums
from gems_fl.geometry.selection import TEMPERATURES
from gems_fl.geometry.spaces import SummedGramSpace
from gems_fl.learning.models import vector_to_state
from gems_fl.learning.threads import compute_threads
from gems_fl.naming import describe_node
from gems_fl.protocol import wire
from gems_fl.protocol.base import ConvexOutcome, GEMSBase, NodeReply, aggregate_layer_spaces, select_nodes
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.private import decode_release_reply
from gems_fl.protocol.replies import (
    NotEnoughRepliesError,
    ReplyError,
    rejection_record,
    validate_replies,
)
from gems_fl.protocol.rounds import Round, sent_bytes
from gems_fl.protocol.secure import (
    CLASS_GRAMS_BLOCK,
    SECURE_PREPARE_KEY,
    blocks_for,
    decode_prepare_reply,
    scales_from,
    secure_sums,
)
from gems_fl.protocol.selection_round import Refiner, candidate_points, select
from gems_fl.protocol.space_replies import decode_reply
from gems_fl.protocol.wire import content_bytes


class GEMS(GEMSBase):
    """Aggregate nodes' good-enough model spaces by intersecting them (one round).

    Parameters
    ----------
    options : ServerOptions
        What the strategy reads (:func:`gems_fl.settings.options.server_options`).
    shapes : dict[str, tuple[int, ...]]
        ``state_dict`` shapes of the model every reply must match.
    participants, names, extra_config
        See :class:`gems_fl.protocol.base.GEMSBase`.
    """

    def __init__(self, options: ServerOptions, shapes: dict[str, tuple[int, ...]],
                 participants: list[int] | None = None,
                 names: Mapping[int, str] | None = None,
                 extra_config: Mapping[str, Any] | None = None,
                 later_config: Mapping[str, Any] | None = None) -> None:
        super().__init__(options, participants, names, extra_config, later_config)
        self.shapes = shapes
        self.rounds: list[dict[str, Any]] = []
        self.point: np.ndarray | None = None  # h_G, then refined by each refinement round
        self._refiner: Refiner | None = None  # the refinement steps, from the first one
        self._sent_to: list[int] = []
        self._gone: list[dict[str, object]] = []
        # the selection round's candidates: (pooled ridge or None, the one-shot result)
        self._candidates: list[tuple[float | None, IntersectionResult]] = []
        # server-grams: the sums of the accepted nodes' Gram statistics, or None when the
        # server keeps every node's matrix
        self.sums: GramSums | None = None

    @property
    def selects(self) -> bool:
        """Whether a selection round follows the spaces: to choose the pooled ridge
        (``pooled-ridge=auto``) or the logit scale the refinement steps start from."""
        return self.options.selects

    @property
    def num_rounds(self) -> int:
        """The round of spaces, the selection round (:attr:`selects`), ``refine-rounds`` steps."""
        return 1 + int(self.selects) + self.options.refine_rounds

    def summary(self) -> None:
        """Log what the strategy does (its options)."""
        space = self.options.space
        log(INFO, "\t├── space: %s, eps=%s, p=%d directions", space.kind, space.eps,
            space.num_directions)
        log(INFO, "\t├── radius bisection over [0, %s] to width %s", space.bound, space.delta)
        log(INFO, "\t└── min valid replies: %d, no-intersection fallback: %s",
            self.options.min_replies, self.options.aggregate.no_intersection)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One train message per participating node, carrying the nodes' settings."""
        self._t0 = time.perf_counter()
        if server_round > 1:
            return self._configure_refine(server_round, grid)
        self._sent_to, self._gone = select_nodes(grid, self.participants, self.names)
        self._grid = grid  # secure aggregation runs SecAgg+ on it after round 1
        if self.options.holds_sums:
            num_classes, num_features = self.shapes["weight"]
            self.sums = GramSums(num_classes, num_features + 1)
            log(INFO, "Round 1: %d nodes; the server keeps only the sums of their Gram "
                "statistics (server-grams=%s), and each node checks h_G against its own "
                "space", len(self._sent_to), self.options.server_grams)
        config = self.node_config(first=True)
        if self.options.secure_aggregation:
            config[SECURE_PREPARE_KEY] = 1
        messages = self._send(Round.SPACES, wire.encode_config(config), self._sent_to,
                              server_round)
        self.rounds.append({"round": server_round, "nodes": list(self._sent_to),
                            "bytes_sent": sent_bytes(messages)})
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, intersect the accepted spaces, return ``h_G``."""
        if server_round > 1:
            return self._aggregate_refine(server_round, list(replies))
        accepted, rejected = self._validate(self._counted(replies))
        self.outcome = ConvexOutcome(accepted=accepted, rejected=self._gone + rejected)
        self.rounds[-1]["wall_s"] = time.perf_counter() - self._t0
        if len(accepted) < self.options.min_replies:
            raise NotEnoughRepliesError(
                f"only {len(accepted)} valid repl{'y' if len(accepted) == 1 else 'ies'} "
                f"from {len(self._sent_to)} nodes; min-replies={self.options.min_replies}. "
                "See the rejection log lines above, or lower min-replies."
            )
        if self.options.secure_aggregation:
            accepted = self._secure_sums(accepted)
        options = self.options.aggregate
        if self.sums is None:
            result = aggregate_layer_spaces(accepted, options, self.names)
        else:
            with compute_threads():
                result = aggregate_sums(self.sums, [r.space for r in accepted],
                                        [r.metrics["num-train-examples"] for r in accepted],
                                        point=options.gram_point, ridge=options.gram_ridge,
                                        pooled_ridge=options.pooled_ridge, seed=options.seed)
            log(INFO, "Gram sums of %d nodes (%d training rows, %.1f MB held): h_G is the "
                "%s point; the nodes check its membership", self.sums.nodes, self.sums.count,
                self.sums.nbytes / 1e6, result.method)
        self.outcome.intersection = result
        if self.selects:
            self._candidates = candidate_points(accepted, options, result,
                                                self.options.pooled_ridges, sums=self.sums)
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

    def _counted(self, replies: Iterable[Message]) -> Iterator[Message]:
        """``replies`` one at a time (each decoded and folded into the sums before the next
        is read), their bytes added to the round's record."""
        self.rounds[-1]["bytes_received"] = 0
        for reply in replies:
            if not reply.has_error():
                self.rounds[-1]["bytes_received"] += content_bytes(reply.content)
            yield reply

    def _validate(self, replies: Iterable[Message]) -> tuple[list[NodeReply], list[dict[str, object]]]:
        decoded, rejected = validate_replies(
            replies, self._sent_to, self._decode,
            log_prefix=f"Round {len(self.rounds)}: ", names=self.names, messages=self._messages)
        return [NodeReply(node, space, metrics) for node, (space, metrics) in decoded], rejected

    def _blocks(self) -> tuple[str, ...]:
        """The statistics SecAgg+ carries in this run (the nodes read the same config)."""
        return blocks_for(self.options.dp,
                          class_grams=self.node_config().get("class-grams") == "true")

    def _secure_sums(self, accepted: list[NodeReply]) -> list[NodeReply]:
        """SecAgg+ over the accepted nodes (:func:`gems_fl.protocol.secure.secure_sums`):
        the sums, and the nodes whose statistics are in them (the others are rejected,
        by name)."""
        t0 = time.perf_counter()
        dp = self.options.dp
        blocks = self._blocks()
        scales = scales_from([r.metrics for r in accepted], blocks)
        max_weight = max(r.metrics["num-train-examples"] for r in accepted)
        try:
            means, counts, traffic = secure_sums(
                self._grid, [r.node_id for r in accepted], {**self.node_config(), **scales},
                max_weight=max_weight, threshold=self.options.secure_threshold,
                timeout=self.options.round_timeout, blocks=blocks)
        except RuntimeError as exc:
            raise NotEnoughRepliesError(str(exc)) from None
        kept = self._in_the_sums(accepted, counts)
        if len(kept) < len(counts):
            raise NotEnoughRepliesError("secure aggregation: a node whose statistics are in "
                                        "the sums has a wrong weight; the sums cannot be used")
        if len(kept) < self.options.min_replies:
            raise NotEnoughRepliesError(f"secure aggregation: only {len(kept)} nodes' "
                                        f"statistics in the sums; min-replies="
                                        f"{self.options.min_replies}")
        self.outcome.accepted = kept
        total = sum(int(r.metrics["num-train-examples"]) for r in kept)
        if dp:  # SecAgg+ returns the n_k-weighted means of the per-row means: sums / total
            self.sums = GramSums.from_noised(total, len(kept), total * means["gram"],
                                             total * means["moments"])
        else:
            self.sums = GramSums.from_means(total, len(kept), means["gram"],
                                            means["center-gram"], means["moments"],
                                            means["class-shares"],
                                            class_grams=means.get(CLASS_GRAMS_BLOCK))
        self.rounds[-1]["secure_aggregation"] = {
            "nodes": len(kept), "wall_s": time.perf_counter() - t0,
            "max_weight": max_weight, "scales": scales,
            "threshold": self.options.secure_threshold, **traffic}
        # the round's traffic includes SecAgg+'s stages, which carry the statistics
        self.rounds[-1]["bytes_sent"] += traffic["bytes_sent"]
        self.rounds[-1]["bytes_received"] += traffic["bytes_received"]
        return kept

    def _in_the_sums(self, accepted: list[NodeReply], counts: dict[int, int]) -> list[NodeReply]:
        """The nodes whose SecAgg+ weight is their training count; the others rejected."""
        kept = []
        for reply in accepted:
            expected = int(reply.metrics["num-train-examples"])
            if counts.get(reply.node_id) == expected:
                kept.append(reply)
                continue
            reason = ("did not finish secure aggregation (SecAgg+)" if reply.node_id not in counts
                      else f"its SecAgg+ weight {counts[reply.node_id]} is not its training "
                           f"count {expected}")
            log(WARNING, "Secure aggregation: node %s left out: %s",
                describe_node(reply.node_id, self.names), reason)
            self.outcome.rejected.append(rejection_record(reply.node_id, self.names, reason))
        return kept

    def _decode(self, content) -> tuple[object, dict[str, float]]:
        """One reply's space; with sums, its Gram statistics are added in and only the
        center and radii are kept (:class:`~gems_fl.geometry.spaces.SummedGramSpace`);
        under secure aggregation the reply holds only metrics and bounds."""
        num_classes, num_features = self.shapes["weight"]
        if self.options.secure_aggregation:
            return decode_prepare_reply(content, num_features + 1, self._blocks())
        if self.options.dp:  # the node's noised sums, added in as they arrive
            space, metrics, gram_sum, moments_sum = decode_release_reply(
                content, num_classes, num_features + 1)
            try:
                self.sums.add_noised(int(metrics["num-train-examples"]), gram_sum, moments_sum)
            except ValueError as exc:
                raise ReplyError(f"its noised sums cannot be summed: {exc}") from None
            return space, metrics
        space, metrics = decode_reply(content, self.shapes, self.options.space.kind,
                                      self.options.space.gram_rank,
                                      labels=self.options.space.label_moments,
                                      columns=self.options.aggregate.linear_columns)
        if self.sums is None:
            return space, metrics
        try:
            self.sums.add(int(metrics["num-train-examples"]), space.matrix, space.gram,
                          space.moments, space.class_counts, space.per_class_grams,
                          column_class_grams=getattr(space, "column_class_grams", None))
        except ValueError as exc:
            raise ReplyError(f"its Gram statistics cannot be summed: {exc}") from None
        return SummedGramSpace.of(space), metrics

    # ---- the selection round and the refinement steps (space='gram') --------------------

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
            if self._refiner is None:
                self._refiner = Refiner.for_run(self.outcome.accepted, self.shapes,
                                                self.outcome.intersection, self.options,
                                                self.names, self.point, sums=self.sums)
            content = wire.encode_refine_round(
                self.node_config(), step,
                vector_to_state(self._refiner.query(), num_features, num_classes))
        messages = self._send(Round.REFINE if step else Round.SELECT, content, self._sent_to,
                              server_round)
        self.rounds.append({"round": server_round, "refine": step,
                            "nodes": list(self._sent_to), "rejected": gone,
                            "bytes_sent": sent_bytes(messages)})
        return messages

    def _aggregate_refine(self, server_round: int,
                          replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """Pool the nodes' gradients and take Bohning's step from the current model; in
        the selection round, keep the candidate and the scale the nodes' scores favour."""
        record = self.rounds[-1]
        record["bytes_received"] = sum(content_bytes(r.content) for r in replies
                                       if not r.has_error())
        if record["refine"] == 0:
            return self._select(server_round, record, replies)
        loss, nodes, rejected = self._refiner.step(
            record["refine"], server_round, replies, self._sent_to, self._messages)
        self.point = self._refiner.x
        record["rejected"] = record["rejected"] + rejected
        record.update({"nodes": nodes, "loss_before": loss, "step_report": self._refiner.last,
                       "wall_s": time.perf_counter() - self._t0})
        num_classes, num_features = self.shapes["weight"]
        state = vector_to_state(self.point, num_features, num_classes)
        return wire.array_record(state), MetricRecord({"loss": loss, "nodes": len(nodes)})

    def _select(self, server_round: int, record: dict[str, Any],
                replies: list[Message]) -> tuple[ArrayRecord, MetricRecord]:
        """The selection round's choice (:func:`gems_fl.protocol.selection_round.select`);
        the logit scale is applied to any point that refinement steps follow."""
        chosen = select(server_round, replies, self._sent_to, self._candidates,
                        self.outcome.accepted, scale_always=bool(self.options.refine_rounds),
                        min_replies=self.options.min_replies, names=self.names,
                        messages=self._messages)
        self.outcome.intersection = chosen.result
        self.point = np.asarray(chosen.result.point, dtype=np.float64)
        record["rejected"] = record["rejected"] + chosen.rejected
        record.update({"nodes": chosen.nodes, **chosen.regularisation(),
                       "temperature": chosen.scale, "val_accuracy": chosen.val_accuracy,
                       "val_losses": chosen.val_losses, "candidates": chosen.candidates,
                       "wall_s": time.perf_counter() - self._t0})
        num_classes, num_features = self.shapes["weight"]
        state = vector_to_state(self.point, num_features, num_classes)
        return wire.array_record(state), MetricRecord({"temperature": chosen.scale})
