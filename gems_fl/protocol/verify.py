"""The evaluate round: every node checks the aggregate on its own data.

After ``h_G`` is chosen the server sends it, in one ``evaluate`` message per node, with
any other models worth scoring on the nodes (Averaged, each node's Local model). Each
node answers with the accuracy of every model on its validation split (and on its own
test split where it holds one) and its ``eps``. ``h_G`` is *good enough* on a node when
its validation accuracy there is >= that node's eps: that check, made by the node on
its own data, is what the word means in the results.

Server -> node (message type ``evaluate``, TTL ``round-timeout``)::

    "config":       ConfigRecord  every run setting
    "model.<key>":  ArrayRecord   one state_dict per model (key: gems, averaged,
                                  local.<node name>; with public-data and no server
                                  test set also gems-tuned and raw)

    "own":          ArrayRecord   (convex model, Gram spaces) this node's own center,
                                  as the server received it; its radius in the config
                                  (``own-radius``)

Node -> server::

    "metrics": MetricRecord  eps, num-val-examples, num-test-examples,
                             val.<key> and (with a test split) test.<key> per model;
                             with "own": space.distance (h_G's Gram distance from the
                             center, on the node's own training inputs) and
                             space.inside (1 when it is within the radius)

The membership check is the node's own: with ``server-grams=sums`` the server holds no
node's Gram matrix, and what the node reports is the only check there is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from torch import nn

from gems_fl.learning.models import MLP
from gems_fl.learning.train import accuracy
from gems_fl.protocol import wire
from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.replies import ReplyError, error_reason, reply_node
from gems_fl.protocol.rounds import Round, round_messages, sent_bytes

if TYPE_CHECKING:
    from gems_fl.geometry.gram import FactoredGram

MODEL_PREFIX = "model."
GEMS_KEY = "gems"
OWN_KEY = "own"
OWN_RADIUS_KEY = "own-radius"
KEPT_KEY = "own-kept"  # config: check h_G against the space this node kept (secure runs)
OWN_FACTOR_STATE_KEY = "gems-own-gram-factor"  # node state: the factor form of G it sent


def keep_own_factor(context: Context, factor: np.ndarray | None,
                    residual: np.ndarray | None, means: np.ndarray | None = None) -> None:
    """Keep the factor form of this node's Gram matrix, as round 1 sent it (with the
    class-mean columns ``means`` of a within-class factor), in the node's state: the
    evaluate round checks h_G in that space, and rebuilding it there would repeat round
    1's eigendecomposition (a quarter of a random-feature run's time)."""
    if factor is None:
        return
    arrays = {"factor": np.asarray(factor, dtype=np.float32)}
    if residual is not None:
        arrays["residual"] = np.asarray(residual, dtype=np.float32)
    if means is not None:
        arrays["means"] = np.asarray(means, dtype=np.float64)
    NodeStore(context).keep(OWN_FACTOR_STATE_KEY, arrays)


def kept_gram(context: Context) -> FactoredGram | None:
    """The Gram matrix this node sent in round 1, as the factor it kept (None: none kept):
    the evaluate round measures h_G's distance through it without forming the matrix."""
    from gems_fl.geometry.gram import FactoredGram

    kept = NodeStore(context).kept(OWN_FACTOR_STATE_KEY)
    if kept is None:
        return None
    return FactoredGram(kept["factor"], kept.get("residual"), kept.get("means"))


def state_to_model(state: Mapping[str, np.ndarray]) -> nn.Module:
    """The model a state dict describes: logistic (``weight``, ``bias``) or an MLP
    (``hidden.<i>.weight``/``bias`` and ``output.weight``/``bias``), widths read from it."""
    if set(state) == {"weight", "bias"}:
        weight = np.asarray(state["weight"])
        model: nn.Module = nn.Linear(weight.shape[1], weight.shape[0])
    else:
        depth = sum(1 for k in state if k.startswith("hidden.") and k.endswith(".weight"))
        expected = {f"hidden.{i}.{p}" for i in range(depth) for p in ("weight", "bias")}
        expected |= {"output.weight", "output.bias"}
        if depth == 0 or set(state) != expected:
            raise ValueError(f"state dict keys {sorted(state)} describe neither the logistic "
                             "model nor an MLP")
        widths = [int(np.shape(state[f"hidden.{i}.weight"])[0]) for i in range(depth)]
        num_features = int(np.shape(state["hidden.0.weight"])[1])
        num_classes = int(np.shape(state["output.weight"])[0])
        model = MLP(num_features, widths, num_classes, dropout=0.0)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v), dtype=torch.float32)
                           for k, v in state.items()})
    return model


def encode_evaluate(config: dict[str, Any], models: Mapping[str, Mapping[str, np.ndarray]],
                    own: tuple[Mapping[str, np.ndarray], float] | None = None) -> RecordDict:
    """The server's evaluate instruction: settings and every model to score; ``own`` (the
    node's own center as a state dict, its radius) asks the node to check h_G's membership
    in its own Gram space; ``config[KEPT_KEY]`` asks it to check against the space it kept
    (secure aggregation: the server never saw it)."""
    records: dict[str, Any] = {wire.CONFIG_KEY: ConfigRecord(dict(config))}
    for key, state in models.items():
        records[MODEL_PREFIX + key] = wire.array_record(
            {k: np.asarray(v, dtype=np.float32) for k, v in state.items()})
    if own is not None:
        records[OWN_KEY] = wire.array_record({k: np.asarray(v) for k, v in own[0].items()})
        records[wire.CONFIG_KEY] = ConfigRecord({**dict(config), OWN_RADIUS_KEY: float(own[1])})
    return RecordDict(records)


def check_own_space(content: RecordDict, x_train: np.ndarray, gram_rank: int | str,
                    kept: tuple[np.ndarray, float] | None = None,
                    gram: np.ndarray | FactoredGram | None = None) -> dict[str, float]:
    """Node side: h_G's distance from this node's center in its Gram metric, on its own
    training inputs (the same matrix its space was built with: ``gram``, what it kept of
    round 1's, whole or as its factor, else rebuilt from ``x_train``), and whether it lies
    within the radius (:func:`within_radius`, the server's own test). The center and
    radius are the message's ``own`` record, else ``kept`` (what the node kept in round 1)."""
    from gems_fl.geometry.kinds import node_gram
    from gems_fl.geometry.spaces import GramSpace, within_radius

    gems = content.array_records[MODEL_PREFIX + GEMS_KEY]
    as_matrix = lambda r: np.concatenate(
        [r["weight"].numpy().astype(np.float64), r["bias"].numpy().astype(np.float64)[:, None]],
        axis=1)
    if OWN_KEY in content.array_records:
        center = as_matrix(content.array_records[OWN_KEY])
        radius = float(content.config_records[wire.CONFIG_KEY][OWN_RADIUS_KEY])
    else:
        center, radius = kept
    distance = GramSpace(center, node_gram(x_train, gram_rank)[0] if gram is None else gram,
                         radius).distance(as_matrix(gems))
    return {"space.distance": distance, "space.inside": int(within_radius(distance, radius))}


#: a node's verdict on h_G rests on at least this many of its rows: with fewer validation
#: rows it judges on its validation and training rows together (all its own data)
MIN_VERDICT_ROWS = 20
VERDICT_KEY = f"verdict.{GEMS_KEY}"
VERDICT_ROWS_KEY = "verdict-rows"


def score_models(content: RecordDict, eps: float, x_val: np.ndarray, y_val: np.ndarray,
                 x_test: np.ndarray | None = None, y_test: np.ndarray | None = None, *,
                 x_train: np.ndarray | None = None, y_train: np.ndarray | None = None,
                 gram_rank: int | str = 0,
                 kept: tuple[np.ndarray, float] | None = None,
                 gram: np.ndarray | None = None) -> RecordDict:
    """Node side: the accuracy of every received model on this node's data, and (when the
    server sent this node's own center) h_G's membership in its space, on ``x_train``.

    A node with fewer than :data:`MIN_VERDICT_ROWS` validation rows also scores h_G on its
    validation and training rows together (``verdict.gems``, ``verdict-rows``): its
    good-enough verdict rests on those, not on a handful of rows."""
    metrics: dict[str, float | int] = {
        "eps": float(eps), "num-val-examples": int(len(y_val)),
        "num-test-examples": 0 if y_test is None else int(len(y_test)),
    }
    config = content.config_records[wire.CONFIG_KEY]
    asked = OWN_KEY in content.array_records or (KEPT_KEY in config and kept is not None)
    if asked and x_train is not None:
        metrics.update(check_own_space(content, x_train, gram_rank, kept, gram))
    for name, record in content.array_records.items():
        if not name.startswith(MODEL_PREFIX):
            continue
        key = name[len(MODEL_PREFIX):]
        model = state_to_model({k: record[k].numpy() for k in record.keys()})
        metrics[f"val.{key}"] = accuracy(model, x_val, y_val)
        if y_test is not None and len(y_test):
            metrics[f"test.{key}"] = accuracy(model, x_test, y_test)
        if key == GEMS_KEY and len(y_val) < MIN_VERDICT_ROWS and y_train is not None \
                and x_train is not None and len(y_train):
            rows = np.concatenate([np.asarray(x_val), np.asarray(x_train)])
            labels = np.concatenate([np.asarray(y_val), np.asarray(y_train)])
            metrics[VERDICT_KEY] = accuracy(model, rows, labels)
            metrics[VERDICT_ROWS_KEY] = int(len(labels))
    return RecordDict({wire.METRICS_KEY: MetricRecord(metrics)})


@dataclass
class NodeCheck:
    """One node's verdict on the models it was sent."""

    node_id: int
    name: str
    eps: float
    num_val: int
    num_test: int
    val: dict[str, float] = field(default_factory=dict)
    test: dict[str, float] = field(default_factory=dict)
    space: dict[str, Any] | None = None  # the node's own membership check: distance, inside
    #: h_G's accuracy on the rows its verdict rests on, where the node held fewer than
    #: MIN_VERDICT_ROWS validation rows (its validation and training rows), and their count
    verdict: float | None = None
    verdict_rows: int | None = None

    @property
    def report_split(self) -> str:
        """``test`` where the node holds a test split, else ``val``."""
        return "test" if self.num_test > 0 and self.test else "val"

    @property
    def good_enough(self) -> bool:
        """Whether ``h_G`` reaches this node's eps on its validation data (with fewer than
        :data:`MIN_VERDICT_ROWS` of them: on its validation and training rows)."""
        if self.verdict is not None:
            return self.verdict >= self.eps
        return self.val.get(GEMS_KEY, -1.0) >= self.eps


@dataclass
class Verification:
    """The evaluate round's outcome: the nodes' checks and the nodes that did not answer."""

    checks: dict[int, NodeCheck]
    missing: list[dict[str, object]]
    bytes_sent: int = 0
    bytes_received: int = 0

    def pooled(self, split: str) -> dict[str, float]:
        """Per model, accuracy over all answering nodes' ``split`` samples pooled."""
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        for check in self.checks.values():
            n = check.num_val if split == "val" else check.num_test
            for key, acc in getattr(check, split).items():
                totals[key] = totals.get(key, 0.0) + acc * n
                counts[key] = counts.get(key, 0) + n
        return {k: totals[k] / counts[k] for k in totals if counts[k] > 0}

    def per_node(self) -> dict[str, dict[str, Any]]:
        """Per node (by name): the split it evaluated on (its test split where it holds
        one, else val), that split's size, and every model's accuracy there."""
        out = {}
        for check in sorted(self.checks.values(), key=lambda c: c.name):
            split = check.report_split
            out[check.name] = {"split": split,
                               "samples": check.num_test if split == "test" else check.num_val,
                               "accuracy": dict(getattr(check, split))}
            if check.space is not None:
                out[check.name]["own_space"] = dict(check.space)
        return out

    def pooled_report(self) -> dict[str, float]:
        """Per model, the accuracy over every node's report split, weighted by samples
        (the pooled figure of :meth:`per_node`)."""
        totals: dict[str, float] = {}
        counts: dict[str, int] = {}
        for entry in self.per_node().values():
            for key, acc in entry["accuracy"].items():
                totals[key] = totals.get(key, 0.0) + acc * entry["samples"]
                counts[key] = counts.get(key, 0) + entry["samples"]
        return {k: totals[k] / counts[k] for k in totals if counts[k] > 0}

    def to_dict(self) -> dict[str, Any]:
        per_node = {name: {**entry, "accuracy": in_model_order(entry["accuracy"])}
                    for name, entry in self.per_node().items()}
        spaces = [c.space for c in self.checks.values() if c.space is not None]
        return {
            "answered": len(self.checks),
            "good_enough": sum(c.good_enough for c in self.checks.values()),
            **({"inside_own_space": sum(bool(s["inside"]) for s in spaces)} if spaces else {}),
            "missing": self.missing,
            "pooled_val": in_model_order(self.pooled("val")),
            "pooled_test": in_model_order(self.pooled("test")),
            "per_node": per_node,
            "pooled": in_model_order(self.pooled_report()),
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }


def in_model_order(scores: dict[str, float]) -> dict[str, float]:
    """``scores`` with h_G first, then the other shared models as sent, then the Local
    models (``local.<name>``) sorted by node name: not in the order the replies came."""
    keys = list(scores)
    order = lambda k: (k != GEMS_KEY, k.startswith("local."),
                       k if k.startswith("local.") else f"{keys.index(k):06d}")
    return {k: scores[k] for k in sorted(keys, key=order)}


def decode_check(node_id: int, name: str, content: RecordDict) -> NodeCheck:  # noqa: C901
    """A node's evaluate reply as its :class:`NodeCheck`, every metric checked; raises
    ``ReplyError`` naming the first problem."""
    record = content.metric_records.get(wire.METRICS_KEY)
    if record is None:
        raise ReplyError(f"evaluate reply has no '{wire.METRICS_KEY}' MetricRecord")
    values: dict[str, float] = {}
    for key in record.keys():
        value = record[key]
        if isinstance(value, (list, bool)) or not math.isfinite(float(value)):
            raise ReplyError(f"evaluate metric '{key}'={value!r} is not a finite number")
        values[key] = float(value)
    for key in ("eps", "num-val-examples", "num-test-examples"):
        if key not in values:
            raise ReplyError(f"evaluate reply lacks '{key}'")
    check = NodeCheck(node_id, name, values["eps"], int(values["num-val-examples"]),
                      int(values["num-test-examples"]))
    if (VERDICT_KEY in values) != (VERDICT_ROWS_KEY in values):
        raise ReplyError(f"evaluate reply has one of '{VERDICT_KEY}' and '{VERDICT_ROWS_KEY}' "
                         "without the other")
    if VERDICT_KEY in values:
        rows = values[VERDICT_ROWS_KEY]
        if not 0.0 <= values[VERDICT_KEY] <= 1.0 or rows < 1 or not float(rows).is_integer():
            raise ReplyError(f"evaluate reply's verdict ({values[VERDICT_KEY]} on {rows} rows) "
                             "is not an accuracy on a positive count of rows")
        check.verdict, check.verdict_rows = values[VERDICT_KEY], int(rows)
    for key, value in values.items():
        split, _, model = key.partition(".")
        if split in ("val", "test") and model:
            if not 0.0 <= value <= 1.0:
                raise ReplyError(f"evaluate metric '{key}'={value} is outside [0, 1]")
            getattr(check, split)[model] = value
    if GEMS_KEY not in check.val:
        raise ReplyError(f"evaluate reply lacks 'val.{GEMS_KEY}'")
    if ("space.distance" in values) != ("space.inside" in values):
        raise ReplyError("evaluate reply has one of 'space.distance' and 'space.inside' "
                         "without the other")
    if "space.distance" in values:
        if values["space.distance"] < 0 or values["space.inside"] not in (0.0, 1.0):
            raise ReplyError(f"evaluate reply's space check (distance "
                             f"{values['space.distance']}, inside {values['space.inside']}) "
                             "is not a distance >= 0 and a 0/1 verdict")
        check.space = {"distance": values["space.distance"],
                       "inside": bool(values["space.inside"])}
    return check


def verify_on_nodes(
    grid: Grid, node_ids: list[int], names: Mapping[int, str], config: dict[str, Any],
    models: Mapping[str, Mapping[str, np.ndarray]], timeout: float,
    own_spaces: Mapping[int, tuple[Mapping[str, np.ndarray], float] | None] | None = None,
) -> Verification:
    """Send every model to every node; collect what each node measured on its own data.

    ``own_spaces`` (node id -> its center as a state dict, its radius): each of those nodes
    also checks whether h_G lies in its own Gram space (:func:`check_own_space`; a value of
    None: against the space the node kept, which the server never saw), and a node that
    was asked but does not answer that check is listed in ``missing``.

    A node that does not answer within ``timeout`` seconds (also each message's TTL),
    or answers with an error or a malformed reply, is listed in ``missing`` with the
    reason; the others are kept.
    """
    content = encode_evaluate(config, models)
    own_spaces = own_spaces or {}
    kept = (encode_evaluate({**config, KEPT_KEY: 1}, models)
            if any(v is None for v in own_spaces.values()) else None)
    contents = {n: (content if n not in own_spaces else kept if own_spaces[n] is None
                    else encode_evaluate(config, models, own_spaces[n])) for n in node_ids}
    messages = round_messages(Round.VERIFY, contents, node_ids, group_id="verify", ttl=timeout)
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    checks: dict[int, NodeCheck] = {}
    missing: list[dict[str, object]] = []
    received = 0
    by_message = {m.metadata.message_id: n for m, n in zip(messages, node_ids)}
    for reply in replies:
        node_id = reply_node(reply, by_message)
        if node_id in checks or any(m["node_id"] == node_id for m in missing):
            continue
        name = names.get(node_id, str(node_id))
        try:
            if reply.has_error():
                raise ReplyError(error_reason(reply))
            received += wire.content_bytes(reply.content)
            check = decode_check(node_id, name, reply.content)
            if node_id in own_spaces and check.space is None:
                raise ReplyError("evaluate reply lacks the node's own space check "
                                 "('space.distance', 'space.inside')")
            checks[node_id] = check
        except ReplyError as exc:
            log(WARNING, "Verify: rejected the answer of node %s ('%s'): %s", node_id, name, exc)
            missing.append({"node_id": node_id, "node_name": name, "reason": str(exc)})
    for node_id in node_ids:
        if node_id not in checks and all(m["node_id"] != node_id for m in missing):
            name = names.get(node_id, str(node_id))
            log(WARNING, "Verify: no answer from node %s ('%s') within %.0f s", node_id, name, timeout)
            missing.append({"node_id": node_id, "node_name": name, "reason": "no answer"})
    good = sum(c.good_enough for c in checks.values())
    log(INFO, "Verify: h_G is good enough (val accuracy >= the node's eps) on %d of %d nodes "
        "that answered; %d did not answer", good, len(checks), len(missing))
    if own_spaces:
        log(INFO, "Verify: h_G lies in the own Gram space of %d of %d nodes that answered "
            "(each node's check on its own training inputs)",
            sum(bool(c.space and c.space["inside"]) for c in checks.values()), len(checks))
    return Verification(checks, missing,
                        bytes_sent=sent_bytes(messages),
                        bytes_received=received)
