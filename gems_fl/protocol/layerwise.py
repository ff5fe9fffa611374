"""The layer-wise GEMS Flower strategy for MLPs: one round per hidden layer, then one.

Round ``j <= L``: every active node gets the node config and the aggregated layers
``1..j-1``; it replies one ball per neuron of its layer ``j``. The server clusters all
neurons of all nodes (k-means, ``clusters`` = m_eps), merges groups whose balls share a
verified point (:func:`gems_fl.geometry.layer_merge.merge_layer`) and keeps the rest, which fixes
the aggregated width ``H'_j``. Round ``L + 1``: the output layer on top of the
aggregated hidden layers comes back as a convex ball or ellipsoid and is intersected as
in the convex protocol. A node whose reply is rejected in some round takes no part in
later rounds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.geometry.layer_merge import bound_width, merge_layer
from gems_fl.geometry.selection import TEMPERATURES
from gems_fl.learning.models import vector_to_state
from gems_fl.protocol import wire
from gems_fl.protocol.base import (
    ConvexOutcome,
    GEMSBase,
    NodeReply,
    aggregate_layer_spaces,
    select_nodes,
)
from gems_fl.protocol.options import ServerOptions
from gems_fl.protocol.replies import (
    NotEnoughRepliesError,
    decode_neuron_reply,
    validate_replies,
)
from gems_fl.protocol.rounds import Round, sent_bytes
from gems_fl.protocol.selection_round import Refiner, candidate_points, select
from gems_fl.protocol.space_replies import decode_reply
from gems_fl.protocol.wire import content_bytes

Layer = tuple[np.ndarray, np.ndarray]
# A merged layer whose next-round downlink (float32, to every node) passes this many
# bytes gets a warning that names max-width: at N = 20 on Fashion-MNIST it is 42 MB
# (benchmarks/mlp_traffic.py), and it grows as N^2.
WIDE_LAYER_BYTES = 20e6


@dataclass
class LayerRound:
    """What one round did."""

    round: int
    layer: int | None  # hidden layer index (1-based); None for the output round
    nodes: list[int]
    width: int | None = None
    merge: dict[str, Any] = field(default_factory=dict)
    bytes_sent: int = 0
    bytes_received: int = 0
    wall_s: float = 0.0
    rejected: list[dict[str, object]] = field(default_factory=list)
    selection: dict[str, Any] = field(default_factory=dict)  # the selection round's choice
    refine: dict[str, Any] = field(default_factory=dict)  # a refinement step: index, loss


def nothing_merged(layer: int, width: int, nodes: int) -> str:
    """What a hidden merge in which no two neurons' balls met means, and what changes it."""
    return (f"Layer {layer}: no neurons merged: no two of the {nodes} nodes' neuron balls "
            f"intersect, so the merged layer is their layers side by side (width {width}) and "
            "aggregation happens only in the output layer. Neurons merge when their balls "
            "meet: a larger eps-neuron (each neuron's tolerance, default 0.1) gives larger "
            "balls; fewer clusters (m_eps) puts more neurons in each k-means group to test")


class LayerwiseGEMS(GEMSBase):
    """GEMS for MLPs: per-neuron spaces, k-means intersection, one round per layer."""

    def __init__(self, options: ServerOptions, num_features: int, num_classes: int,
                 participants: list[int] | None = None,
                 names: dict[int, str] | None = None,
                 extra_config: dict[str, Any] | None = None) -> None:
        super().__init__(options, participants, names, extra_config)
        self.num_features = num_features
        self.num_classes = num_classes
        self.widths = list(options.hidden_widths)
        self.layers: list[Layer] = []
        self.rounds: list[LayerRound] = []
        self.excluded: dict[int, str] = {}
        self.first_layer_centers: list[np.ndarray] = []
        self._candidates: list = []  # the selection round's (ridge, point) pairs
        self._refiner: Refiner | None = None
        self.point: np.ndarray | None = None  # the output layer: h_G, then refined

    @property
    def selects(self) -> bool:
        """Whether a selection round follows the output layer: to choose the pooled ridge
        (``pooled-ridge=auto``) or the logit scale the refinement steps start from."""
        return self.options.selects

    @property
    def num_rounds(self) -> int:
        """Hidden layers, the output layer, the selection round (:attr:`selects`) and
        ``refine-rounds`` steps on the output layer."""
        return len(self.widths) + 1 + int(self.selects) + self.options.refine_rounds

    @property
    def _output_shapes(self) -> dict[str, tuple[int, ...]]:
        fan_in = self.layers[-1][0].shape[0]
        return {"weight": (self.num_classes, fan_in), "bias": (self.num_classes,)}

    def summary(self) -> None:
        """Log what the strategy does (its options)."""
        o = self.options
        log(INFO, "\t├── MLP hidden widths %s, %d rounds", self.widths, self.num_rounds)
        log(INFO, "\t├── neurons: eps_j=%s (%s), m_eps=%d clusters", o.neuron_eps,
            o.neuron_criterion, o.clusters)
        log(INFO, "\t└── output layer: %s, eps=%s", o.space.kind, o.space.eps)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The node config plus the aggregated layers so far, to every node still taking
        part."""
        self._t0 = time.perf_counter()
        if server_round > len(self.widths) + 1:
            return self._configure_after_output(server_round, grid)
        connected, gone = select_nodes(grid, self.participants, self.names,
                                       log_prefix=f"Round {server_round}: ")
        nodes = [n for n in connected if n not in self.excluded]
        layer = server_round if server_round <= len(self.widths) else None
        self.rounds.append(LayerRound(server_round, layer, nodes))
        for item in gone:
            if item["node_id"] not in self.excluded:
                self.rounds[-1].rejected.append(item)
                self.excluded[item["node_id"]] = f"round {server_round}: {item['reason']}"
        content = wire.encode_layer_round(self.node_config(), server_round, self.layers)
        messages = self._send(Round.LAYER, content, nodes, server_round)
        self.rounds[-1].bytes_sent = sent_bytes(messages)
        return messages

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Merge one hidden layer, or intersect the output layer in the last round."""
        record = self.rounds[-1]
        replies = list(replies)
        record.bytes_received = sum(content_bytes(r.content) for r in replies if not r.has_error())
        if record.round == len(self.widths) + 2:
            self._select(record, replies)
        elif record.round > len(self.widths) + 2:
            self._step(record, replies)
        elif record.layer is not None:
            self._merge_hidden(record, replies)
        else:
            self._intersect_output(record, replies)
        record.wall_s = time.perf_counter() - self._t0
        arrays = {}
        for i, (w, b) in enumerate(self.layers):
            arrays[f"hidden.{i}.weight"], arrays[f"hidden.{i}.bias"] = w, b
        return wire.array_record(arrays), MetricRecord({"width": int(record.width or 0)})

    def _accept(self, record: LayerRound, replies: list[Message], decode) -> list[tuple[int, Any]]:
        accepted, rejected = validate_replies(replies, record.nodes, decode,
                                              log_prefix=f"Round {record.round}: ",
                                              names=self.names, messages=self._messages)
        for item in rejected:
            record.rejected.append(item)
            self.excluded[item["node_id"]] = f"round {record.round}: {item['reason']}"
        if rejected:
            log(WARNING, "Round %d: %d node(s) take no part in later rounds", record.round,
                len(rejected))
        if len(accepted) < self.options.min_replies:
            raise NotEnoughRepliesError(
                f"round {record.round}: only {len(accepted)} valid replies; "
                f"min-replies={self.options.min_replies}")
        return accepted

    def _merge_hidden(self, record: LayerRound, replies: list[Message]) -> None:
        j = record.layer - 1
        fan_in = self.num_features if j == 0 else self.layers[-1][0].shape[0]
        accepted = self._accept(
            record, replies, lambda c: decode_neuron_reply(c, self.widths[j], fan_in))
        node_neurons = [(centers, radii) for _, (centers, radii, _) in accepted]
        if j == 0:
            self.first_layer_centers = [centers for centers, _ in node_neurons]
        merged = merge_layer(node_neurons, num_clusters=self.options.clusters,
                             seed=self.options.seed)
        weights = merged.weights
        record.merge = merged.to_dict()
        log(INFO, "Layer %d: %d nodes x %d neurons -> width %d (%d merged groups, %d kept "
            "alone)", record.layer, len(accepted), self.widths[j], merged.width,
            merged.num_intersected_groups, merged.num_kept_alone)
        if merged.num_intersected_groups == 0 and len(accepted) > 1:
            record.merge["note"] = nothing_merged(record.layer, merged.width, len(accepted))
            log(WARNING, "%s", record.merge["note"])
        downlink = merged.weights.shape[0] * merged.weights.shape[1] * 4 * len(accepted)
        if self.options.max_width == 0 and downlink > WIDE_LAYER_BYTES:
            log(WARNING, "Layer %d: the merged layer (width %d) goes to each of %d nodes: "
                "%.0f MB down in the next round, and every node's next space grows with the "
                "width. Set max-width (e.g. max-width=150) to bound it; see README 'Speed'",
                record.layer, merged.width, len(accepted), downlink / 1e6)
        if 0 < self.options.max_width < merged.width:
            weights, bound = bound_width(merged, self.options.max_width, self.options.seed)
            record.merge["max_width"] = bound
            folded = (f" and {bound['groups_reduced']} merged groups"
                      if bound["groups_reduced"] else "")
            log(INFO, "Layer %d: max-width=%d: %d neurons kept alone%s reduced to %d of "
                "them (the one nearest each k-means center; %d nodes' neurons have no output "
                "neuron in their ball); width %d", record.layer, self.options.max_width,
                bound["kept_alone"], folded, bound["reduced_to"], bound["dropped"],
                bound["width"])
        self.layers.append((weights[:, :-1].copy(), weights[:, -1].copy()))
        record.width = int(weights.shape[0])

    def _intersect_output(self, record: LayerRound, replies: list[Message]) -> None:
        fan_in = self.layers[-1][0].shape[0]
        shapes = {"weight": (self.num_classes, fan_in), "bias": (self.num_classes,)}
        accepted = self._accept(
            record, replies,
            lambda c: decode_reply(c, shapes, self.options.space.kind,
                                   self.options.space.gram_rank,
                                   labels=self.options.space.label_moments))
        nodes = [NodeReply(node, space, metrics) for node, (space, metrics) in accepted]
        log(INFO, "Output layer:")
        options = self.options.aggregate
        result = aggregate_layer_spaces(nodes, options, self.names)
        self.outcome = ConvexOutcome(accepted=nodes, rejected=record.rejected, intersection=result)
        record.width = self.num_classes
        self.point = np.asarray(result.point, dtype=np.float64)
        if self.selects:
            self._candidates = candidate_points(nodes, options, result,
                                                self.options.pooled_ridges)

    def _configure_after_output(self, server_round: int, grid: Grid) -> list[Message]:
        """The selection round (the output layer's candidates, one per pooled ridge), then
        the refinement steps (the current output layer), each with the merged hidden
        layers beneath, to every node whose output space was accepted."""
        accepted = [r.node_id for r in self.outcome.accepted]
        nodes, gone = select_nodes(grid, accepted, self.names,
                                   log_prefix=f"Round {server_round}: ")
        self.rounds.append(LayerRound(server_round, None, nodes, rejected=list(gone)))
        step = server_round - len(self.widths) - 2  # 0: the selection round
        if step == 0:
            points = np.stack([r.point.reshape(self.num_classes, -1)
                               for _, r in self._candidates])
            content = wire.encode_selection_round(self.node_config(), points, TEMPERATURES,
                                                  self.layers)
        else:
            fan_in = self._output_shapes["weight"][1]
            if self._refiner is None:
                self._refiner = Refiner.for_run(self.outcome.accepted, self._output_shapes,
                                                self.outcome.intersection, self.options,
                                                self.names, self.point)
            content = wire.encode_refine_round(
                self.node_config(), step,
                vector_to_state(self._refiner.query(), fan_in, self.num_classes), self.layers)
        messages = self._send(Round.REFINE if step else Round.SELECT, content, nodes,
                              server_round)
        self.rounds[-1].bytes_sent = sent_bytes(messages)
        return messages

    def _select(self, record: LayerRound, replies: list[Message]) -> None:
        chosen = select(record.round, replies, record.nodes, self._candidates,
                        self.outcome.accepted, scale_always=bool(self.options.refine_rounds),
                        min_replies=self.options.min_replies, names=self.names,
                        messages=self._messages)
        self.outcome.intersection = chosen.result
        self.point = np.asarray(chosen.result.point, dtype=np.float64)
        record.rejected += chosen.rejected
        record.nodes = chosen.nodes
        record.width = self.num_classes
        record.selection = {**chosen.regularisation(), "temperature": chosen.scale,
                            "val_accuracy": chosen.val_accuracy, "candidates": chosen.candidates}

    def _step(self, record: LayerRound, replies: list[Message]) -> None:
        step = record.round - len(self.widths) - 2
        loss, nodes, rejected = self._refiner.step(step, record.round, replies, record.nodes,
                                                   self._messages)
        self.point = self._refiner.x
        record.rejected += rejected
        record.nodes = nodes
        record.width = self.num_classes
        record.refine = {"step": step, "loss_before": loss, **self._refiner.last}

    def round_reports(self) -> list[dict[str, Any]]:
        """JSON-friendly per-round records."""
        return [r.__dict__.copy() for r in self.rounds]

