"""Every reply the server receives, checked before any of it is used.

The decoders (:func:`decode_reply`, :func:`decode_neuron_reply`,
:func:`decode_identity_full`) turn one reply's records into spaces, arrays and counts,
or raise :class:`ReplyError` saying what is wrong with it. :func:`validate_replies`
runs a decoder over a round's replies, rejects the bad and the missing with a log line
naming the node, and returns the rest in a canonical order; both strategies, the
identity round and the evaluate round use it. The record layout is in
:mod:`gems_fl.protocol.wire`.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
from flwr.common.constant import ErrorCode
from flwr.common.logger import log

from gems_fl.data.categories import SEPARATOR
from gems_fl.geometry.choices import class_gram_rank_for, gram_rank_for
from gems_fl.geometry.class_factors import check_class_factors
from gems_fl.geometry.components import check_component_grams
from gems_fl.geometry.gram import (
    check_class_grams,
    check_gram,
    check_moments,
    from_factor,
    from_half,
    unpack_triangle,
)
from gems_fl.geometry.kinds import space_kind
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.models import state_to_vector
from gems_fl.naming import describe_node, describe_nodes
from gems_fl.protocol.wire import (
    AXES_KEY,
    CENTER_KEY,
    CLASS_FACTOR_KEYS,
    COLUMN_CLASSES_KEY,
    GRADIENT_KEY,
    GRADIENT_METRIC_KEYS,
    GRAM_KEY,
    IDENTITY_KEY,
    IDENTITY_METRIC_KEYS,
    IDENTITY_OPTIONAL_METRICS,
    LABELS_KEY,
    METRIC_KEYS,
    METRICS_KEY,
    NEURON_METRIC_KEYS,
    NEURONS_KEY,
    SELECTION_METRIC_KEYS,
    SOLVE_METRIC_KEYS,
    STATS_KEY,
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


def decode_reply(
    content: RecordDict, shapes: dict[str, tuple[int, ...]], kind: str, gram_rank: int | str = 0,
    *, labels: bool = False, columns: int = 0,
) -> tuple[Space | GramSpace, dict[str, float]]:
    """Validate a reply and turn it into a space of ``kind`` plus its metrics.

    The kind (:func:`gems_fl.geometry.kinds.space_kind`) says which records it sends
    beside the center (``axes``; ``gram``; or none); ``labels=True`` (``label-moments``)
    expects a Gram reply's ``labels`` too, and with ``columns`` (the kernel model's rows
    beside its features) the class Gram matrices of those leading columns
    (``column-classes``). :data:`_EXTRA_READERS` reads each.

    Raises
    ------
    ReplyError
        Missing or extra records/keys, a shape that does not match the model, a
        non-finite value, a negative radius, non-positive axes, a Gram matrix that is
        not symmetric positive semi-definite, or label moments inconsistent with the
        node's training-sample count.
    """
    space_type = space_kind(kind)
    records = space_type.extra_records + (space_type.optional_records if labels else ())
    with_columns = bool(columns) and labels and LABELS_KEY in records
    expected = {CENTER_KEY, METRICS_KEY} | set(records) | ({COLUMN_CLASSES_KEY} if with_columns else set())
    present = set(content.keys())
    if present != expected:
        missing, extra = sorted(expected - present), sorted(present - expected)
        raise ReplyError(f"reply records {sorted(present)}: missing {missing}, unexpected {extra}")
    center = _read_state(content, CENTER_KEY, shapes)
    metrics = read_metrics(content)
    extras = {key: _EXTRA_READERS[key](content, shapes, gram_rank, metrics)
              for key in records}
    if with_columns:
        extras[COLUMN_CLASSES_KEY] = _read_column_classes(content, extras[LABELS_KEY], columns)
    certified = metrics["certified-radius"]
    space = space_type.make(state_to_vector(center), metrics["radius"],
                            math.inf if certified < 0 else certified, extras)
    return space, metrics


def decode_gradient_reply(content: RecordDict, shapes: dict[str, tuple[int, ...]]
                          ) -> tuple[np.ndarray, dict[str, float]]:
    """Validate a refinement reply: ``(gradient (C, d + 1), metrics)``."""
    expected = {GRADIENT_KEY, METRICS_KEY}
    present = set(content.keys())
    if present != expected:
        raise ReplyError(f"reply records {sorted(present)}: missing {sorted(expected - present)}, "
                         f"unexpected {sorted(present - expected)}")
    gradient = state_to_vector(_read_state(content, GRADIENT_KEY, shapes))
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


def _read_axes(content: RecordDict, shapes: dict[str, tuple[int, ...]], rank: int,
               metrics: dict[str, float]) -> np.ndarray:
    """Relative ellipsoid axes, shaped like the model, all positive: as one vector."""
    axes = state_to_vector(_read_state(content, AXES_KEY, shapes))
    if np.any(axes <= 0):
        raise ReplyError("'axes' has entries <= 0; relative axes must be positive")
    return axes


def _read_gram_record(content: RecordDict, shapes: dict[str, tuple[int, ...]],
                      rank: int | str, metrics: dict[str, float]) -> np.ndarray:
    n = int(shapes["weight"][1]) + 1
    return _read_gram(content, n, gram_rank_for(rank, n))


def _read_labels(content: RecordDict, shapes: dict[str, tuple[int, ...]], rank: int | str,
                 metrics: dict[str, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
                                                     np.ndarray | None]:
    """Label moments, class counts and (when sent) class Gram matrices and their
    components' ``[class, rows]``, checked against the model, the node's count and each
    other. Class Gram matrices come whole (per class, or per k-means component with
    ``class-components``) or, where :func:`~gems_fl.geometry.choices.class_gram_rank_for`
    gives a rank, in factor form."""
    record = content.array_records.get(LABELS_KEY)
    if record is None:
        raise ReplyError(f"'{LABELS_KEY}' is not an ArrayRecord")
    classes, n = shapes["weight"][0], shapes["weight"][1] + 1
    class_rank = class_gram_rank_for(rank, n)
    per_class_keys = set(CLASS_FACTOR_KEYS) if class_rank > 0 else {"class-grams"}
    allowed = [{"moments", "counts"}, {"moments", "counts", *per_class_keys}]
    if class_rank == 0:
        allowed.append({"moments", "counts", "class-grams", "class-components"})
    if set(record.keys()) not in allowed:
        raise ReplyError(f"'{LABELS_KEY}' holds {sorted(record.keys())}, expected "
                         f"['counts', 'moments'] and optionally {sorted(per_class_keys)}"
                         + ("" if class_rank else " (with 'class-components')"))
    try:
        moments, counts = (np.asarray(record[k].numpy()) for k in ("moments", "counts"))
        moments, counts = check_moments(moments, counts, (classes, n),
                                        int(metrics["num-train-examples"]))
        per_class, parts = None, None
        if "class-components" in record:
            per_class, parts = check_component_grams(
                record["class-grams"].numpy(), record["class-components"].numpy(), counts,
                moments, n)
        elif "class-grams" in record:
            per_class = check_class_grams(record["class-grams"].numpy(), counts, moments, n)
        elif CLASS_FACTOR_KEYS[0] in record:
            per_class = check_class_factors(*(record[k].numpy() for k in CLASS_FACTOR_KEYS),
                                            record["moments"].numpy(), counts, n, class_rank)
        return moments, counts, per_class, parts
    except ReplyError:
        raise
    except Exception as exc:  # noqa: BLE001 - any decode or check failure is a bad reply
        raise ReplyError(f"'{LABELS_KEY}': {exc}") from None


def _read_column_classes(content: RecordDict, labels: tuple, columns: int) -> np.ndarray:
    """The kernel model's class Gram matrices of its first ``columns`` inputs and the bias,
    whole or in the logistic model's factor form, checked against the reply's label
    moments on those columns; float64 ``(m, columns + 1, columns + 1)``."""
    record = content.array_records.get(COLUMN_CLASSES_KEY)
    if record is None:
        raise ReplyError(f"'{COLUMN_CLASSES_KEY}' is not an ArrayRecord")
    moments, counts = labels[0], labels[1]
    n = int(columns) + 1
    if moments.shape[1] <= n - 1:
        raise ReplyError(f"'{COLUMN_CLASSES_KEY}': the layer has {moments.shape[1] - 1} inputs, "
                         f"not more than its {columns} leading columns")
    keep = np.r_[np.arange(columns), moments.shape[1] - 1]
    rank = class_gram_rank_for("auto", n)
    try:
        if rank == 0 and set(record.keys()) == {"class-grams"}:
            return check_class_grams(record["class-grams"].numpy(), counts, moments[:, keep], n)
        if rank > 0 and set(record.keys()) == set(CLASS_FACTOR_KEYS):
            return check_class_factors(*(record[k].numpy() for k in CLASS_FACTOR_KEYS),
                                       moments[:, keep], counts, n, rank)
    except ValueError as exc:
        raise ReplyError(f"'{COLUMN_CLASSES_KEY}': {exc}") from None
    raise ReplyError(f"'{COLUMN_CLASSES_KEY}' holds {sorted(record.keys())}, expected "
                     f"{['class-grams'] if rank == 0 else sorted(CLASS_FACTOR_KEYS)}")


def _read_gram(content: RecordDict, n: int, rank: int) -> np.ndarray:  # noqa: C901
    """The Gram matrix of a reply, checked: finite, the right shape, symmetric, PSD (a
    factor reply is both by its form once its parts are checked)."""
    record = content.array_records.get(GRAM_KEY)
    if record is None:
        raise ReplyError(f"'{GRAM_KEY}' is not an ArrayRecord")
    key = "vectors" if rank > 0 else "triangle"
    expected_keys = {"vectors", "scales", "residual"} if rank > 0 else {"triangle"}
    if set(record.keys()) != expected_keys:
        raise ReplyError(f"'{GRAM_KEY}' holds {sorted(record.keys())}, expected "
                         f"{sorted(expected_keys)} (gram-rank={rank})")
    try:
        arr = np.asarray(record[key].numpy(), dtype=np.float64)
    except Exception as exc:
        raise ReplyError(f"'{GRAM_KEY}.{key}' cannot be decoded: {exc}") from exc
    if not np.all(np.isfinite(arr)):
        raise ReplyError(f"'{GRAM_KEY}.{key}' contains NaN or infinite values")
    try:
        if rank > 0:
            expected = (n, min(rank, n))
            if arr.shape != expected:
                raise ValueError(f"vectors have shape {arr.shape}, expected {expected}")
            if np.abs(arr).max(initial=0.0) > 1:
                raise ValueError("vectors must lie in [-1, 1] (each column's scale is sent apart)")
            scales = np.asarray(record["scales"].numpy(), dtype=np.float64)
            if scales.shape != (expected[1],) or not np.all(np.isfinite(scales)) \
                    or scales.min(initial=1.0) <= 0:
                raise ValueError(f"scales must be {expected[1]} finite values > 0; got shape "
                                 f"{scales.shape}")
            residual = np.asarray(record["residual"].numpy(), dtype=np.float64)
            if residual.shape != (n,) or not np.all(np.isfinite(residual)) or residual.min() < 0:
                raise ValueError(f"residual must be {n} finite values >= 0 (the diagonal of "
                                 f"G - F F^T); got shape {residual.shape}")
            # F F^T + diag(r), r >= 0: symmetric and PSD by its form, so no proof is solved
            # for it (at D = 4,246 that Cholesky cost seconds per reply); a float32 F that
            # overflowed is refused by from_factor, and its square stays finite in float64
            return from_factor(from_half(arr, scales), residual)
        if arr.shape != (n * (n + 1) // 2,):
            raise ValueError(f"triangle has shape {arr.shape}, expected ({n * (n + 1) // 2},) "
                             f"for a {n} x {n} matrix")
        gram = unpack_triangle(arr, n)
        check_gram(gram, n)
    except ValueError as exc:
        raise ReplyError(f"'{GRAM_KEY}': {exc}") from None
    return gram


def _read_state(content: RecordDict, key: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
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
    state = _read_state(content, NEURONS_KEY, shapes)
    if np.any(state["radius"] < 0):
        raise ReplyError("'neurons.radius' has negative entries")
    metrics = read_metrics(content, NEURON_METRIC_KEYS, optional=())
    centers = np.concatenate([state["weight"], state["bias"][:, None]], axis=1).astype(np.float64)
    return centers, state["radius"].astype(np.float64), metrics


@dataclass
class Identity:
    """A node's answer to the identity query, checked."""

    name: str
    source: str
    counts: dict[str, int]
    labels: list[str] = field(default_factory=list)  # class names the node holds
    stats: tuple[int, np.ndarray, np.ndarray] | None = None  # (n, sum, sum of squares)
    num_test: int = 0
    columns: list[str] | None = None  # feature column names, in the node's order
    notes: list[str] = field(default_factory=list)  # how the node read its file
    categories: list[str] = field(default_factory=list)  # its category columns, by name
    landmarks: np.ndarray | None = None  # model='kernel': its class centres (landmark round)


def decode_identity_full(content: RecordDict) -> Identity:
    """Validate a ``query`` reply.

    Raises
    ------
    ReplyError
        The node reported an error about its data (``node_name`` set), or missing
        records or keys, an empty name, counts that are not positive integers, or
        statistics of the wrong shape or not finite.
    """
    record = content.config_records.get(IDENTITY_KEY)
    if record is None or not isinstance(record.get("node-name"), str) or not record["node-name"]:
        raise ReplyError(f"identity reply lacks a '{IDENTITY_KEY}' ConfigRecord with a non-empty "
                         "'node-name'")
    name = str(record["node-name"])
    if record.get("error"):
        raise ReplyError(str(record["error"]), node_name=name)
    metrics = content.metric_records.get(METRICS_KEY)
    keys = set(metrics.keys()) if metrics is not None else set()
    if metrics is None or not set(IDENTITY_METRIC_KEYS) <= keys <= \
            set(IDENTITY_METRIC_KEYS) | set(IDENTITY_OPTIONAL_METRICS):
        raise ReplyError(f"identity reply '{METRICS_KEY}' must hold exactly "
                         f"{', '.join(IDENTITY_METRIC_KEYS)}", node_name=name)
    counts = _identity_counts(metrics, name)
    labels = [str(v) for v in record.get("labels", [])] if isinstance(record.get("labels", []), list) else []
    stats = (_identity_stats(content.array_records[STATS_KEY], counts, name)
             if STATS_KEY in content.array_records else None)
    num_test = int(metrics["num-test-examples"]) if "num-test-examples" in keys else 0
    columns = record.get("columns")
    if columns is not None and (not isinstance(columns, list) or len(columns) != counts["num-features"]
                                or not all(isinstance(c, str) for c in columns)):
        raise ReplyError(f"identity reply: 'columns' must name each of the "
                         f"{counts['num-features']} features", node_name=name)
    notes = record.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ReplyError("identity reply: 'notes' must be a list of text lines", node_name=name)
    return Identity(name, str(record.get("data-source", "")), counts, labels, stats, num_test,
                    None if columns is None else [str(c) for c in columns], list(notes),
                    _category_columns(record.get("category-columns", []), columns, name))


def _identity_counts(metrics: MetricRecord, name: str) -> dict[str, int]:
    """The identity's row and feature counts, each a positive integer."""
    counts = {}
    for key in IDENTITY_METRIC_KEYS:
        value = metrics[key]
        if isinstance(value, (list, bool)) or not float(value).is_integer() or value < 1:
            raise ReplyError(f"identity reply: {key}={value!r} must be a positive integer",
                             node_name=name)
        counts[key] = int(value)
    return counts


def _identity_stats(arrays: ArrayRecord, counts: dict[str, int],
                    name: str) -> tuple[int, np.ndarray, np.ndarray]:
    """``(training rows, per-feature sum, sum of squares)`` for ``standardize='federated'``:
    finite, one entry per feature."""
    try:
        total, squares = (np.asarray(arrays[k].numpy(), dtype=np.float64) for k in ("sum", "sumsq"))
    except Exception as exc:  # noqa: BLE001 - any decode failure is a bad reply
        raise ReplyError(f"identity reply: '{STATS_KEY}' cannot be decoded: {exc}",
                         node_name=name) from None
    if total.shape != (counts["num-features"],) or squares.shape != total.shape \
            or not np.all(np.isfinite(total)) or not np.all(np.isfinite(squares)):
        raise ReplyError(f"identity reply: '{STATS_KEY}' must hold finite sum and sumsq of "
                         f"shape ({counts['num-features']},)", node_name=name)
    return counts["num-train-examples"], total, squares


def _category_columns(categories: Any, columns: list | None, name: str) -> list[str]:
    """An identity reply's category columns, each with its 0/1 columns among ``columns``."""
    if not isinstance(categories, list) or not all(
            isinstance(c, str) and columns is not None
            and any(str(k).startswith(c + SEPARATOR) for k in columns) for c in categories):
        raise ReplyError("identity reply: 'category-columns' must name category columns whose "
                         "0/1 columns '<column>=<value>' are among its columns", node_name=name)
    return [str(c) for c in categories]


def decode_identity(content: RecordDict) -> tuple[str, str, dict[str, int]]:
    """Validate a ``query`` reply: ``(node name, data source, counts)``
    (:func:`decode_identity_full` has the labels and statistics too)."""
    identity = decode_identity_full(content)
    return identity.name, identity.source, identity.counts


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


# How the wire format reads each kind's extra record (:attr:`SpaceKind.extra_record`).
_EXTRA_READERS: dict[str, Callable[..., Any]] = {
    AXES_KEY: _read_axes,
    GRAM_KEY: _read_gram_record,
    LABELS_KEY: _read_labels,
}
