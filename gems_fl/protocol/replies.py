"""Every reply the server receives, checked before any of it is used.

Each round has its decoder: the spaces round's in :mod:`gems_fl.protocol.space_replies`,
the identity round's in :mod:`gems_fl.protocol.identity_replies`, and here the layer
round's (:func:`decode_neuron_reply`), the selection round's and the refinement round's,
with what they share (:func:`read_state`, :func:`read_metrics`). A decoder turns one
reply's records into spaces, arrays and counts, or raises :class:`ReplyError` saying what
is wrong with it. :func:`validate_replies` runs a decoder over a round's replies, rejects
the bad and the missing with a log line naming the node, and returns the rest in a
canonical order; every round uses it. The record layout is in :mod:`gems_fl.protocol.wire`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from gems_fl.learning.models import state_to_vector
from gems_fl.naming import describe_node, describe_nodes
from gems_fl.protocol.wire import (
    GRADIENT_KEY,
    GRADIENT_METRIC_KEYS,
    METRIC_KEYS,
    METRICS_KEY,
    NEURON_METRIC_KEYS,
    NEURONS_KEY,
    SELECTION_METRIC_KEYS,
    SOLVE_METRIC_KEYS,
)


class ReplyError(ValueError):
    """A client reply that the server cannot use; the message says why.

    ``node_name`` is set when the reply itself said who sent it (the identity round),
    so the rejection can name a node the server does not know yet.
    """

    def __init__(self, message: str, node_name: str | None = None) -> None:
        super().__init__(message)
        self.node_name = node_name


class NotEnoughRepliesError(RuntimeError):
    """Fewer valid replies than ``min-replies``: no aggregate can be formed."""


def decode_gradient_reply(content: RecordDict, shapes: dict[str, tuple[int, ...]]
                          ) -> tuple[np.ndarray, dict[str, float]]:
    """Validate a refinement reply: ``(gradient (C, d + 1), metrics)``."""
    expected = {GRADIENT_KEY, METRICS_KEY}
    present = set(content.keys())
    if present != expected:
        raise ReplyError(f"reply records {sorted(present)}: missing {sorted(expected - present)}, "
                         f"unexpected {sorted(present - expected)}")
    gradient = state_to_vector(read_state(content, GRADIENT_KEY, shapes))
    record = content.metric_records.get(METRICS_KEY)
    if record is None or set(record.keys()) != set(GRADIENT_METRIC_KEYS):
        raise ReplyError(f"'{METRICS_KEY}' must hold exactly {', '.join(GRADIENT_METRIC_KEYS)}")
    metrics = {k: record[k] for k in GRADIENT_METRIC_KEYS}
    if any(isinstance(v, (list, bool)) or not math.isfinite(v) for v in metrics.values()):
        raise ReplyError(f"refinement metrics {metrics} must be finite numbers")
    if metrics["loss"] < 0:
        raise ReplyError(f"loss={metrics['loss']} is negative")
    if metrics["num-train-examples"] < 1 or not float(metrics["num-train-examples"]).is_integer():
        raise ReplyError(f"num-train-examples={metrics['num-train-examples']} must be a "
                         "positive integer")
    return gradient.reshape(shapes["weight"][0], -1), {k: float(v) for k, v in metrics.items()}


def decode_selection_reply(content: RecordDict, num_candidates: int, num_scales: int
                           ) -> tuple[np.ndarray, np.ndarray, int]:
    """Validate a selection round's reply: ``(validation losses (m, T), correct
    predictions (m,), validation rows)``."""
    record = content.metric_records.get(METRICS_KEY)
    if set(content.keys()) != {METRICS_KEY} or record is None or \
            set(record.keys()) != set(SELECTION_METRIC_KEYS):
        raise ReplyError(f"a selection reply holds only '{METRICS_KEY}' with "
                         f"{', '.join(SELECTION_METRIC_KEYS)}")
    rows = record["num-val-examples"]
    if isinstance(rows, (list, bool)) or rows < 1 or not float(rows).is_integer():
        raise ReplyError(f"num-val-examples={rows!r} must be a positive integer")
    losses = np.asarray(record["val-losses"], dtype=np.float64)
    if losses.shape != (num_candidates * num_scales,) or not np.all(np.isfinite(losses)) \
            or np.any(losses < 0):
        raise ReplyError(f"val-losses must be {num_candidates} x {num_scales} finite "
                         "non-negative numbers")
    correct = np.asarray(record["val-correct"], dtype=np.float64)
    if correct.shape != (num_candidates,) or np.any(correct < 0) or np.any(correct > rows) \
            or not np.all(correct == np.round(correct)):
        raise ReplyError(f"val-correct must be {num_candidates} whole counts in [0, {int(rows)}]")
    return losses.reshape(num_candidates, num_scales), correct.astype(np.int64), int(rows)


def read_state(content: RecordDict, key: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The arrays of record ``key``, exactly ``shapes``' names and shapes, float and finite."""
    record = content.array_records.get(key)
    if record is None:
        raise ReplyError(f"'{key}' is not an ArrayRecord")
    if set(record.keys()) != set(shapes):
        raise ReplyError(f"'{key}' holds arrays {sorted(record.keys())}, expected {sorted(shapes)}")
    state = {}
    for name, shape in shapes.items():
        try:
            arr = record[name].numpy()
        except Exception as exc:
            raise ReplyError(f"'{key}.{name}' cannot be decoded as a numpy array: {exc}") from exc
        if tuple(arr.shape) != tuple(shape):
            raise ReplyError(f"'{key}.{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ReplyError(f"'{key}.{name}' has dtype {arr.dtype}, expected a float type")
        if not np.all(np.isfinite(arr)):
            raise ReplyError(f"'{key}.{name}' contains NaN or infinite values")
        state[name] = arr
    return state


def read_metrics(content: RecordDict, keys: tuple[str, ...] = METRIC_KEYS,  # noqa: C901
                 optional: tuple[str, ...] = SOLVE_METRIC_KEYS) -> dict[str, float]:
    """The reply's metrics: every one of ``keys``, and ``optional`` all or none (the exact
    solve's report, from a node that solved its model exactly)."""
    record = content.metric_records.get(METRICS_KEY)
    if record is None:
        raise ReplyError(f"'{METRICS_KEY}' is not a MetricRecord")
    present = set(record.keys())
    if present & set(optional):
        keys = (*keys, *optional)
    if present != set(keys):
        missing = sorted(set(keys) - present)
        extra = sorted(present - set(keys))
        raise ReplyError(f"'{METRICS_KEY}' keys: missing {missing}, unexpected {extra}")
    metrics = {}
    for key in keys:
        value = record[key]
        if isinstance(value, list) or isinstance(value, bool) or not math.isfinite(value):
            raise ReplyError(f"metric '{key}'={value!r} is not a finite number")
        metrics[key] = float(value)
    if metrics.get("radius", 0.0) < 0:
        raise ReplyError(f"radius={metrics['radius']} is negative")
    if "eps" in metrics and not 0.0 <= metrics["eps"] <= 1.0:
        raise ReplyError(f"eps={metrics['eps']} is outside [0, 1]")
    if not 0.0 <= metrics["local-val-accuracy"] <= 1.0:
        raise ReplyError(f"local-val-accuracy={metrics['local-val-accuracy']} is outside [0, 1]")
    for key in ("num-train-examples", "num-val-examples"):
        if metrics[key] < 1 or not float(metrics[key]).is_integer():
            raise ReplyError(f"{key}={metrics[key]} must be a positive integer")
    return metrics


def decode_neuron_reply(
    content: RecordDict, width: int, fan_in: int
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Validate a layer-wise reply: ``(centers (width, fan_in + 1), radii, metrics)``."""
    expected = {NEURONS_KEY, METRICS_KEY}
    present = set(content.keys())
    if present != expected:
        raise ReplyError(f"reply records {sorted(present)}: missing {sorted(expected - present)}, "
                         f"unexpected {sorted(present - expected)}")
    shapes = {"weight": (width, fan_in), "bias": (width,), "radius": (width,)}
    state = read_state(content, NEURONS_KEY, shapes)
    if np.any(state["radius"] < 0):
        raise ReplyError("'neurons.radius' has negative entries")
    metrics = read_metrics(content, NEURON_METRIC_KEYS, optional=())
    centers = np.concatenate([state["weight"], state["bias"][:, None]], axis=1).astype(np.float64)
    return centers, state["radius"].astype(np.float64), metrics


def validate_replies(
    replies: Iterable[Message],
    sent_to: Iterable[int],
    decode: Callable[[RecordDict], tuple[Any, ...]],
    log_prefix: str = "",
    names: Mapping[int, str] | None = None,
    messages: Iterable[Message] | None = None,
) -> tuple[list[tuple[int, tuple[Any, ...]]], list[dict[str, object]]]:
    """Decode every reply; reject the bad and the missing with a log line naming the node.

    ``decode`` raises :class:`gems_fl.protocol.ReplyError` for a bad reply; its result's
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
    messages = list(messages or [])
    by_message: dict[str, int] = {}
    accepted: list[tuple[int, tuple[Any, ...]]] = []
    rejected: list[dict[str, object]] = []
    seen: set[int] = set()
    sent_to = list(sent_to)
    for reply in replies:
        if reply.metadata.reply_to_message_id not in by_message:
            # ``replies`` may push the messages as it goes (a grid that hands each reply
            # on as it arrives): their ids are set by then
            by_message = {m.metadata.message_id: m.metadata.dst_node_id for m in messages
                          if m.metadata.message_id}
        node_id = reply_node(reply, by_message)
        if node_id in seen:
            continue
        seen.add(node_id)
        try:
            if reply.has_error():
                raise ReplyError(error_reason(reply))
            accepted.append((node_id, decode(reply.content)))
        except ReplyError as exc:
            entry = rejection_record(node_id, names, str(exc))
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
            rejected.append(rejection_record(node_id, names, "no reply"))
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
    return f"client error {reply.error.code}: {node_error_message(reply.error.reason)}"


COLOUR = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
WRAPPED = re.compile(r"^<class '([\w.]+)'>:<'(.*)'>$", re.DOTALL)


def node_error_message(reason: str) -> str:
    """The message of the exception a node's ClientApp raised, from Flower's error reason.

    Flower's reason wraps it (``<class '...ClientAppException'>:<'... Message: <text>'>``,
    under Ray with the node's whole traceback and colour codes); the operator needs the
    innermost text, which the node's own log keeps with its traceback.
    """
    text = COLOUR.sub("", reason)
    if "Message: " in text:
        return text.rsplit("Message: ", 1)[1].removesuffix("'>").strip()
    wrapped = WRAPPED.match(text.strip())
    if wrapped:
        return f"{wrapped.group(1).rsplit('.', 1)[-1]}: {wrapped.group(2).strip()}"
    return text.strip()


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


def rejection_record(node_id: int, names: Mapping[int, str], reason: str) -> dict[str, object]:
    entry: dict[str, object] = {"node_id": node_id, "reason": reason}
    if node_id in names:
        entry["node_name"] = names[node_id]
    return entry


def _canonical_key(first: Any) -> str:
    if hasattr(first, "center"):  # a space; one without a center (secure): its radii
        array = (first.center if first.center is not None
                 else np.array([first.radius, first.certified_radius]))
    else:
        array = np.asarray(first)
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
