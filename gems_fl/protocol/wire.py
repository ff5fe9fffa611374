"""What crosses the network, and the checks on what comes back.

Server -> client (message type ``query``, before round 1)::

    "config":  ConfigRecord  every run setting

Client -> server (the answer; :func:`decode_identity_full` checks it)::

    "identity": ConfigRecord node-name, data-source, labels (the class names it
                             holds); or node-name, data-source, error (its data cannot
                             take part, and why)
    "metrics":  MetricRecord num-features, num-classes, num-train-examples,
                             num-val-examples, num-test-examples (if it has a test split)
    "stats":    ArrayRecord  standardize='federated' only: per-feature sum and sumsq
                             of its training rows (the count is num-train-examples)

Server -> client (``train`` and ``evaluate``): the ``config`` record also carries what
the identity round agreed (:class:`gems_fl.data.agreement.DataAgreement`):
agreed-num-features, agreed-classes (label names in index order) and, with federated
standardisation, scale-mean and scale-std.

Server -> client (message type ``train``, TTL ``round-timeout``)::

    "config":  ConfigRecord  every run setting (Settings.to_config())

Client -> server (the reply; nothing else leaves the client)::

    "center":  ArrayRecord   the local optimum as the model's state_dict (weight, bias)
    "axes":    ArrayRecord   relative ellipsoid axes, same keys and shapes (ellipsoid only)
    "gram":    ArrayRecord   gram only: "triangle", the upper triangle of G (float32), or
                             "factor", F with G = F F^T (gram-rank > 0)
    "metrics": MetricRecord  radius, certified-radius (-1: infinite), eps (the node's
                             own), num-train-examples, num-val-examples,
                             local-val-accuracy

:func:`decode_reply` validates a reply against the server's model before any of it is
used; a bad reply raises :class:`ReplyError` with a reason the server logs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from gems_fl.geometry.gram import (
    check_gram,
    from_factor,
    pack_triangle,
    unpack_triangle,
)
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.models import state_to_vector

CONFIG_KEY = "config"
LAYERS_KEY = "layers"
NEURONS_KEY = "neurons"
ROUND_KEY = "gems-round"
NEURON_METRIC_KEYS = ("num-train-examples", "num-val-examples", "local-val-accuracy")
CENTER_KEY = "center"
AXES_KEY = "axes"
METRICS_KEY = "metrics"
METRIC_KEYS = ("radius", "certified-radius", "eps", "num-train-examples", "num-val-examples",
               "local-val-accuracy")
GRAM_KEY = "gram"


class ReplyError(ValueError):
    """A client reply that the server cannot use; the message says why.

    ``node_name`` is set when the reply itself said who sent it (the identity round),
    so the rejection can name a node the server does not know yet.
    """

    def __init__(self, message: str, node_name: str | None = None) -> None:
        super().__init__(message)
        self.node_name = node_name


def encode_config(config: dict[str, Any]) -> RecordDict:
    """The server's train instruction: all run settings in one ConfigRecord."""
    return RecordDict({CONFIG_KEY: ConfigRecord(dict(config))})


def encode_layer_round(config: dict[str, Any], round_index: int, layers: list[tuple[np.ndarray, np.ndarray]]) -> RecordDict:
    """Layer-wise protocol, server -> client: settings, round, aggregated layers so far.

    The layers travel in float32, the precision the nodes train in: the same weights
    arrive as with float64, in half the bytes.
    """
    arrays = {}
    for i, (weight, bias) in enumerate(layers):
        arrays[f"hidden.{i}.weight"] = np.asarray(weight, dtype=np.float32)
        arrays[f"hidden.{i}.bias"] = np.asarray(bias, dtype=np.float32)
    return RecordDict({
        CONFIG_KEY: ConfigRecord({**config, ROUND_KEY: round_index}),
        LAYERS_KEY: array_record(arrays),
    })


def decode_layers(content: RecordDict) -> list[tuple[np.ndarray, np.ndarray]]:
    """The aggregated hidden layers carried by a layer-wise train message."""
    record = content.array_records.get(LAYERS_KEY)
    if record is None:
        raise ValueError(f"layer-wise train message has no '{LAYERS_KEY}' ArrayRecord")
    layers = []
    for i in range(len(record.keys()) // 2):
        layers.append((record[f"hidden.{i}.weight"].numpy(), record[f"hidden.{i}.bias"].numpy()))
    return layers


def encode_neuron_reply(
    weight: np.ndarray, bias: np.ndarray, radius: np.ndarray, *,
    num_train_examples: int, num_val_examples: int, local_val_accuracy: float,
) -> RecordDict:
    """Layer-wise reply: one ball per neuron (rows of ``[weight | bias]``, ``radius``)."""
    return RecordDict({
        NEURONS_KEY: array_record({"weight": weight, "bias": bias, "radius": radius}),
        METRICS_KEY: MetricRecord({
            "num-train-examples": int(num_train_examples),
            "num-val-examples": int(num_val_examples),
            "local-val-accuracy": float(local_val_accuracy),
        }),
    })


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
    metrics = _read_metrics(content, NEURON_METRIC_KEYS)
    centers = np.concatenate([state["weight"], state["bias"][:, None]], axis=1).astype(np.float64)
    return centers, state["radius"].astype(np.float64), metrics


def decode_config(content: RecordDict) -> dict[str, Any]:
    """Settings dict from a train instruction."""
    if CONFIG_KEY not in content.config_records:
        raise ValueError(f"train message has no '{CONFIG_KEY}' ConfigRecord")
    return dict(content.config_records[CONFIG_KEY])


def encode_reply(
    center: dict[str, np.ndarray],
    axes: dict[str, np.ndarray] | None,
    *,
    radius: float,
    certified_radius: float,
    eps: float,
    num_train_examples: int,
    num_val_examples: int,
    local_val_accuracy: float,
    gram: np.ndarray | None = None,
    gram_factor: np.ndarray | None = None,
) -> RecordDict:
    """A node's reply: its good-enough space and a few counts.

    A Gram space sends ``G`` as its upper triangle (float32) or, with ``gram_factor``,
    as the rank-r factor ``F`` (``G = F F^T``) instead.
    """
    records: dict[str, Any] = {CENTER_KEY: array_record(center)}
    if axes is not None:
        records[AXES_KEY] = array_record(axes)
    if gram_factor is not None:
        records[GRAM_KEY] = array_record({"factor": np.asarray(gram_factor, dtype=np.float32)})
    elif gram is not None:
        records[GRAM_KEY] = array_record({"triangle": pack_triangle(gram)})
    records[METRICS_KEY] = MetricRecord(
        {
            "radius": float(radius),
            "certified-radius": float(certified_radius) if math.isfinite(certified_radius) else -1.0,
            "eps": float(eps),
            "num-train-examples": int(num_train_examples),
            "num-val-examples": int(num_val_examples),
            "local-val-accuracy": float(local_val_accuracy),
        }
    )
    return RecordDict(records)


def array_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord holding a ``{name: array}`` state, names kept."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})


def decode_reply(
    content: RecordDict, shapes: dict[str, tuple[int, ...]], space_kind: str, gram_rank: int = 0,
) -> tuple[Space | GramSpace, dict[str, float]]:
    """Validate a reply and turn it into a space plus its metrics.

    Raises
    ------
    ReplyError
        Missing or extra records/keys, a shape that does not match the model, a
        non-finite value, a negative radius, non-positive axes, or a Gram matrix that
        is not symmetric positive semi-definite.
    """
    extra_key = {"ellipsoid": AXES_KEY, "gram": GRAM_KEY}.get(space_kind)
    expected = {CENTER_KEY, METRICS_KEY} | ({extra_key} if extra_key else set())
    present = set(content.keys())
    if present != expected:
        missing, extra = sorted(expected - present), sorted(present - expected)
        raise ReplyError(f"reply records {sorted(present)}: missing {missing}, unexpected {extra}")
    center = _read_state(content, CENTER_KEY, shapes)
    metrics = _read_metrics(content)
    if space_kind == "gram":
        n = int(shapes["weight"][1]) + 1
        gram = _read_gram(content, n, gram_rank)
        certified = metrics["certified-radius"]
        space: Space | GramSpace = GramSpace(state_to_vector(center), gram, metrics["radius"],
                                            math.inf if certified < 0 else certified)
        return space, metrics
    axes = _read_state(content, AXES_KEY, shapes) if space_kind == "ellipsoid" else None
    if axes is not None and np.any(state_to_vector(axes) <= 0):
        raise ReplyError("'axes' has entries <= 0; relative axes must be positive")
    space = Space(
        center=state_to_vector(center),
        radius=metrics["radius"],
        axes=None if axes is None else state_to_vector(axes),
    )
    return space, metrics


def _read_gram(content: RecordDict, n: int, rank: int) -> np.ndarray:
    """The Gram matrix of a reply, checked: finite, the right shape, symmetric, PSD."""
    record = content.array_records.get(GRAM_KEY)
    if record is None:
        raise ReplyError(f"'{GRAM_KEY}' is not an ArrayRecord")
    key = "factor" if rank > 0 else "triangle"
    if set(record.keys()) != {key}:
        raise ReplyError(f"'{GRAM_KEY}' holds {sorted(record.keys())}, expected ['{key}'] "
                         f"(gram-rank={rank})")
    try:
        arr = np.asarray(record[key].numpy(), dtype=np.float64)
    except Exception as exc:  # noqa: BLE001 - any decode failure is a bad reply
        raise ReplyError(f"'{GRAM_KEY}.{key}' cannot be decoded: {exc}") from exc
    if not np.all(np.isfinite(arr)):
        raise ReplyError(f"'{GRAM_KEY}.{key}' contains NaN or infinite values")
    try:
        if rank > 0:
            expected = (n, min(rank, n))
            if arr.shape != expected:
                raise ValueError(f"factor has shape {arr.shape}, expected {expected}")
            gram = from_factor(arr)
        else:
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
        except Exception as exc:  # noqa: BLE001 - any decode failure is a bad reply
            raise ReplyError(f"'{key}.{name}' cannot be decoded as a numpy array: {exc}") from exc
        if tuple(arr.shape) != tuple(shape):
            raise ReplyError(f"'{key}.{name}' has shape {tuple(arr.shape)}, expected {tuple(shape)}")
        if not np.issubdtype(arr.dtype, np.floating):
            raise ReplyError(f"'{key}.{name}' has dtype {arr.dtype}, expected a float type")
        if not np.all(np.isfinite(arr)):
            raise ReplyError(f"'{key}.{name}' contains NaN or infinite values")
        state[name] = arr
    return state


def _read_metrics(content: RecordDict, keys: tuple[str, ...] = METRIC_KEYS) -> dict[str, float]:
    record = content.metric_records.get(METRICS_KEY)
    if record is None:
        raise ReplyError(f"'{METRICS_KEY}' is not a MetricRecord")
    if set(record.keys()) != set(keys):
        missing = sorted(set(keys) - set(record.keys()))
        extra = sorted(set(record.keys()) - set(keys))
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


IDENTITY_KEY = "identity"
IDENTITY_METRIC_KEYS = ("num-features", "num-classes", "num-train-examples", "num-val-examples")
IDENTITY_OPTIONAL_METRICS = ("num-test-examples",)
STATS_KEY = "stats"


@dataclass
class Identity:
    """A node's answer to the identity query, checked."""

    name: str
    source: str
    counts: dict[str, int]
    labels: list[str] = field(default_factory=list)  # class names the node holds
    stats: tuple[int, np.ndarray, np.ndarray] | None = None  # (n, sum, sum of squares)
    num_test: int = 0


def encode_identity(name: str, source: str, *, num_features: int, num_classes: int,
                    num_train: int, num_val: int, labels: list[str] | None = None,
                    stats: tuple[int, np.ndarray, np.ndarray] | None = None,
                    num_test: int = 0) -> RecordDict:
    """A node's answer to the server's ``query`` (who it is, what data it holds).

    ``labels``: the class names it holds; ``stats``: per-feature count, sum and sum of
    squares of its training rows (``standardize='federated'`` only).
    """
    identity: dict[str, Any] = {"node-name": name, "data-source": source}
    if labels is not None:
        identity["labels"] = [str(v) for v in labels]
    metrics = {"num-features": int(num_features), "num-classes": int(num_classes),
               "num-train-examples": int(num_train), "num-val-examples": int(num_val)}
    if num_test:
        metrics["num-test-examples"] = int(num_test)
    records: dict[str, Any] = {IDENTITY_KEY: ConfigRecord(identity),
                               METRICS_KEY: MetricRecord(metrics)}
    if stats is not None:
        records[STATS_KEY] = array_record({"sum": np.asarray(stats[1], dtype=np.float64),
                                           "sumsq": np.asarray(stats[2], dtype=np.float64)})
    return RecordDict(records)


def encode_identity_error(name: str, source: str, error: str) -> RecordDict:
    """A node whose data cannot take part says who it is and why (not an anonymous
    client error), so the server can name it in the log and in ``rejected``."""
    return RecordDict({IDENTITY_KEY: ConfigRecord({"node-name": name, "data-source": source,
                                                   "error": error})})


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
    counts = {}
    for key in IDENTITY_METRIC_KEYS:
        value = metrics[key]
        if isinstance(value, (list, bool)) or not float(value).is_integer() or value < 1:
            raise ReplyError(f"identity reply: {key}={value!r} must be a positive integer",
                             node_name=name)
        counts[key] = int(value)
    labels = [str(v) for v in record.get("labels", [])] if isinstance(record.get("labels", []), list) else []
    stats = None
    if STATS_KEY in content.array_records:
        arrays = content.array_records[STATS_KEY]
        try:
            total, squares = (np.asarray(arrays[k].numpy(), dtype=np.float64) for k in ("sum", "sumsq"))
        except Exception as exc:  # noqa: BLE001 - any decode failure is a bad reply
            raise ReplyError(f"identity reply: '{STATS_KEY}' cannot be decoded: {exc}",
                             node_name=name) from None
        if total.shape != (counts["num-features"],) or squares.shape != total.shape \
                or not np.all(np.isfinite(total)) or not np.all(np.isfinite(squares)):
            raise ReplyError(f"identity reply: '{STATS_KEY}' must hold finite sum and sumsq of "
                             f"shape ({counts['num-features']},)", node_name=name)
        stats = (counts["num-train-examples"], total, squares)
    num_test = int(metrics["num-test-examples"]) if "num-test-examples" in keys else 0
    return Identity(name, str(record.get("data-source", "")), counts, labels, stats, num_test)


def decode_identity(content: RecordDict) -> tuple[str, str, dict[str, int]]:
    """Validate a ``query`` reply: ``(node name, data source, counts)``
    (:func:`decode_identity_full` has the labels and statistics too)."""
    identity = decode_identity_full(content)
    return identity.name, identity.source, identity.counts


def content_bytes(content: RecordDict) -> int:
    """Bytes of a message's records, counted as Flower's ``count_bytes`` does.

    ConfigRecords are counted here (keys plus 8 bytes per number, 1 per bool, the
    length of strings) because flwr 1.42's ``ConfigRecord.count_bytes`` raises on an
    empty string value such as ``data-dir=""``.
    """
    total = 0
    for record in content.values():
        if isinstance(record, ConfigRecord):
            total += sum(len(k) + _config_value_bytes(v) for k, v in record.items())
        else:
            total += record.count_bytes()
    return int(total)


def _config_value_bytes(value: Any) -> int:
    if isinstance(value, list):
        return sum(_config_value_bytes(v) for v in value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, (str, bytes)):
        return len(value)
    return 8
