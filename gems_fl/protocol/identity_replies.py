"""The identity round's replies: who a node is and what it holds, checked.

:func:`decode_identity_full` turns a ``query`` reply into an :class:`Identity` (name, data
source, counts, class names, columns, the statistics ``standardize='federated'`` needs) or
raises :class:`~gems_fl.protocol.replies.ReplyError`, naming the node where the reply
said who sent it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from gems_fl.data.categories import SEPARATOR
from gems_fl.protocol.replies import ReplyError
from gems_fl.protocol.wire import (
    IDENTITY_KEY,
    IDENTITY_METRIC_KEYS,
    IDENTITY_OPTIONAL_METRICS,
    METRICS_KEY,
    STATS_KEY,
)


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
    summaries: np.ndarray | None = None  # what it sent in the model's map round, if any


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
