"""What crosses the network, and the checks on what comes back.

Server -> client (message type ``query``, before round 1)::

    "config":  ConfigRecord  every run setting

Client -> server (the answer; :func:`gems_fl.protocol.identity_replies.decode_identity_full` checks it)::

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

    "config":  ConfigRecord  the settings node code reads (gems_fl.settings.options.node_config)

Refinement (``refine-rounds=R``, after round 1): the server sends ``config`` with
``gems-refine`` (the step's index) and ``model`` (the current ``h_G``, float64). In the
temperature round (index 0) ``config`` also holds ``gems-temperatures`` and the node
replies ``metrics`` ``val-losses`` (its validation cross-entropy at each scale) and
``num-val-examples``; in a step round it replies ``gradient`` (its mean cross-entropy
gradient, model-sized) and ``metrics`` (``loss``, ``num-train-examples``). For the MLP,
the selection round also carries the merged hidden layers (``layers``), which each node
keeps in its state; a step's ``config`` names them by ``layers-digest`` instead of
sending them again, and a node that holds no layers of that digest answers an error.

Client -> server (the reply; nothing else leaves the client)::

    "center":  ArrayRecord   the local optimum as the model's state_dict (weight, bias)
    "axes":    ArrayRecord   relative ellipsoid axes, same keys and shapes (ellipsoid only)
    "gram":    ArrayRecord   gram only: "triangle", the upper triangle of G (float32), or
                             a rank-r factor F = "vectors" (n x r, float16 in [-1, 1]) *
                             "scales" (r powers of two, float32) and "residual" d
                             (float32) with G ~ F F^T + diag(d) (gram-rank r > 0, auto);
                             sent beside "labels", F and d are of the within-class
                             scatter G - C C^T, C = sqrt(share_c) [mean_c, 1] from the
                             moments and counts, and G ~ F F^T + diag(d) + C C^T
    "labels":  ArrayRecord   gram only: "moments", mean of e_y [x, 1]^T over the training
                             rows (C x (d+1), float32), and "counts", the class counts;
                             with class-grams, "class-grams": the packed upper triangle
                             of mean x~ x~^T over the rows of each class held, in class
                             order (m x (d+1)(d+2)/2, float32), or one per k-means
                             component of a class with "class-components" (m x 2 int64:
                             [class, rows]; class-components > 1); above 257 inputs + 1
                             with gram-rank r > 0 instead each class's covariance as
                             "class-vectors" (m x d x r, float16 in [-1, 1]) *
                             "class-scales" (m x r powers of two) and "class-residual"
                             (m x d, its diagonal left over), the mean from "moments"
    "metrics": MetricRecord  radius, certified-radius (-1: infinite), eps (the node's
                             own), num-train-examples, num-val-examples,
                             local-val-accuracy

:func:`gems_fl.protocol.space_replies.decode_reply` validates a reply against the
server's model before any of it is used; a bad reply raises
:class:`~gems_fl.protocol.replies.ReplyError` with a reason the server logs.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from gems_fl.geometry.gram import (
    half_factor,
    pack_triangle,
)

CONFIG_KEY = "config"
LAYERS_KEY = "layers"
LAYERS_DIGEST_KEY = "layers-digest"  # refinement steps: the merged layers each node kept
NEURONS_KEY = "neurons"
ROUND_KEY = "gems-round"
NEURON_METRIC_KEYS = ("num-train-examples", "num-val-examples", "local-val-accuracy")
CENTER_KEY = "center"
AXES_KEY = "axes"
METRICS_KEY = "metrics"
METRIC_KEYS = ("radius", "certified-radius", "eps", "num-train-examples", "num-val-examples",
               "local-val-accuracy")
#: what a node whose convex model was solved exactly adds to its metrics (gems_fl.learning.exact)
SOLVE_METRIC_KEYS = ("solve-iterations", "solve-gradient-norm", "solve-l2")
GRAM_KEY = "gram"
LABELS_KEY = "labels"
#: the kernel model's reply: the class Gram matrices of its leading columns (the rows)
COLUMN_CLASSES_KEY = "column-classes"
CLASS_FACTOR_KEYS = ("class-vectors", "class-scales", "class-residual")
REFINE_KEY = "gems-refine"  # config key of a refinement round's message: its index (1..R)
MODEL_KEY = "model"
GRADIENT_KEY = "gradient"
GRADIENT_METRIC_KEYS = ("loss", "num-train-examples")
TEMPERATURES_KEY = "gems-temperatures"  # config key: the logit scales to score
CANDIDATES_KEY = "candidates"  # selection round: the candidate models, one array (m, C, d + 1)
SELECTION_METRIC_KEYS = ("val-losses", "val-correct", "num-val-examples")




def encode_config(config: dict[str, Any]) -> RecordDict:
    """The server's train instruction: the node config in one ConfigRecord."""
    return RecordDict({CONFIG_KEY: ConfigRecord(dict(config))})


def encode_layer_round(config: dict[str, Any], round_index: int, layers: list[tuple[np.ndarray, np.ndarray]]) -> RecordDict:
    """Layer-wise protocol, server -> client: node config, round, aggregated layers so far.

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




def layers_digest(layers: list[tuple[np.ndarray, np.ndarray]]) -> str:
    """A short SHA-256 of hidden layers as they travel (float32): a refinement step names
    the merged layers a node kept from the selection round by it, instead of resending
    them."""
    h = hashlib.sha256()
    for weight, bias in layers:
        for array in (weight, bias):
            a = np.ascontiguousarray(array, dtype=np.float32)
            h.update(str(a.shape).encode())
            h.update(a.tobytes())
    return h.hexdigest()[:32]


def encode_refine_round(config: dict[str, Any], refine_round: int,
                        state: dict[str, np.ndarray],
                        layers: list[tuple[np.ndarray, np.ndarray]] | None = None) -> RecordDict:
    """Refinement step, server -> client: node config, the step's index (1..R) and the
    current model (float64, so that the gradient is taken at exactly the server's point);
    for the MLP, the model is the output layer, and the merged hidden layers beneath it,
    which every node keeps from the selection round, are named by :func:`layers_digest`
    (``layers``: the server's copy)."""
    extra = {LAYERS_DIGEST_KEY: layers_digest(layers)} if layers else {}
    return RecordDict({
        CONFIG_KEY: ConfigRecord({**config, REFINE_KEY: int(refine_round), **extra}),
        MODEL_KEY: array_record({k: np.asarray(v, dtype=np.float64) for k, v in state.items()}),
    })


def encode_selection_round(config: dict[str, Any], candidates: np.ndarray,
                           temperatures: tuple[float, ...],
                           layers: list[tuple[np.ndarray, np.ndarray]] | None = None) -> RecordDict:
    """Selection round, server -> client (``REFINE_KEY`` 0): the candidate models
    ``(m, C, d + 1)`` (float64) and the logit scales at which each node scores them; for
    the MLP, the candidates are output layers and ``layers`` the merged hidden layers
    beneath them (float32, as in :func:`encode_layer_round`)."""
    candidates = np.asarray(candidates, dtype=np.float64)
    if candidates.ndim != 3:
        raise ValueError(f"candidates must be (m, C, d + 1), got shape {candidates.shape}")
    records = {
        CONFIG_KEY: ConfigRecord({**config, REFINE_KEY: 0,
                                  TEMPERATURES_KEY: [float(t) for t in temperatures]}),
        CANDIDATES_KEY: array_record({"points": candidates}),
    }
    if layers:
        records[LAYERS_KEY] = encode_layer_round({}, 0, layers)[LAYERS_KEY]
    return RecordDict(records)


def decode_candidates(content: RecordDict) -> np.ndarray:
    """The candidate models ``(m, C, d + 1)`` a selection round's message carries."""
    record = content.array_records.get(CANDIDATES_KEY)
    if record is None or "points" not in record:
        raise ValueError(f"selection message has no '{CANDIDATES_KEY}' ArrayRecord with 'points'")
    return record["points"].numpy()


def decode_model(content: RecordDict) -> dict[str, np.ndarray]:
    """The model a refinement round's message carries."""
    record = content.array_records.get(MODEL_KEY)
    if record is None:
        raise ValueError(f"refinement message has no '{MODEL_KEY}' ArrayRecord")
    return {k: record[k].numpy() for k in record.keys()}


def encode_local_model_reply(state: dict[str, np.ndarray], num_train_examples: int) -> RecordDict:
    """Node -> server: the node's whole local model (float32) and its training size."""
    return RecordDict({
        MODEL_KEY: array_record({k: np.asarray(v, dtype=np.float32) for k, v in state.items()}),
        METRICS_KEY: MetricRecord({"num-train-examples": int(num_train_examples)}),
    })


def encode_gradient_reply(gradient: dict[str, np.ndarray], *, loss: float,
                          num_train_examples: int) -> RecordDict:
    """Refinement reply: the node's mean cross-entropy gradient (model-sized) and loss."""
    return RecordDict({
        GRADIENT_KEY: array_record({k: np.asarray(v, dtype=np.float64) for k, v in gradient.items()}),
        METRICS_KEY: MetricRecord({"loss": float(loss), "num-train-examples": int(num_train_examples)}),
    })


def encode_selection_reply(val_losses: np.ndarray, val_correct: list[int],
                           num_val_examples: int) -> RecordDict:
    """Selection round reply: validation cross-entropy of every candidate at every scale
    (``(m, T)``, flattened row-major), correct validation predictions per candidate, rows."""
    return RecordDict({METRICS_KEY: MetricRecord({
        "val-losses": [float(v) for v in np.asarray(val_losses).reshape(-1)],
        "val-correct": [int(c) for c in val_correct],
        "num-val-examples": int(num_val_examples)})})


def decode_config(content: RecordDict) -> dict[str, Any]:
    """The node config of a train instruction, as a dict."""
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
    gram_residual: np.ndarray | None = None,
    labels: tuple[np.ndarray, ...] | None = None,
    solve: dict[str, float] | None = None,
    column_classes: np.ndarray | tuple[np.ndarray, ...] | None = None,
) -> RecordDict:
    """A node's reply: its good-enough space and a few counts (``solve``: the exact
    solve's :data:`SOLVE_METRIC_KEYS`, where the node solved its model exactly).

    A Gram space sends ``G`` as its upper triangle (float32) or, with ``gram_factor``,
    as the rank-r factor ``F`` (float16 vectors and power-of-two scales,
    :func:`gems_fl.geometry.gram.half_factor`) and the residual's diagonal
    ``gram_residual`` (``G ~ F F^T + diag(residual)``) instead. ``labels`` is
    ``(moments, counts)``, ``(moments, counts, class_grams)``, ``(moments, counts,
    class_grams, class_factors)`` or ``(moments, counts, class_grams, class_factors,
    class_parts)``; class Gram matrices travel as packed upper triangles (float32), one
    row per class with rows (one per component of a class, with ``class_parts`` ``[class,
    rows]`` as ``class-components``), or, where ``class_factors`` is given
    (:func:`gems_fl.geometry.class_factors.class_factors`), as those arrays instead.
    ``column_classes`` (the kernel model): the class Gram matrices of the layer's leading
    columns in the same two forms, in their own record.
    """
    records: dict[str, Any] = {CENTER_KEY: array_record(center)}
    if column_classes is not None:
        records[COLUMN_CLASSES_KEY] = array_record(
            dict(zip(CLASS_FACTOR_KEYS, column_classes)) if isinstance(column_classes, tuple)
            else {"class-grams": np.stack([pack_triangle(g) for g in column_classes])})
    if axes is not None:
        records[AXES_KEY] = array_record(axes)
    if gram_factor is not None:
        if gram_residual is None:
            raise ValueError("a rank-r Gram reply carries its residual diagonal too")
        vectors, scales = half_factor(gram_factor)
        records[GRAM_KEY] = array_record({"vectors": vectors, "scales": scales,
                                          "residual": np.asarray(gram_residual, dtype=np.float32)})
    elif gram is not None:
        records[GRAM_KEY] = array_record({"triangle": pack_triangle(gram)})
    if labels is not None:
        moments, counts, *rest = labels
        state = {"moments": np.asarray(moments, dtype=np.float32),
                 "counts": np.asarray(counts, dtype=np.int64)}
        if len(rest) > 1 and rest[1] is not None:
            state.update(zip(CLASS_FACTOR_KEYS, rest[1]))
        elif rest and rest[0] is not None:
            state["class-grams"] = np.stack([pack_triangle(g) for g in rest[0]])
            if len(rest) > 2 and rest[2] is not None:
                state["class-components"] = np.asarray(rest[2], dtype=np.int64)
        records[LABELS_KEY] = array_record(state)
    records[METRICS_KEY] = MetricRecord(
        {
            "radius": float(radius),
            "certified-radius": float(certified_radius) if math.isfinite(certified_radius) else -1.0,
            "eps": float(eps),
            "num-train-examples": int(num_train_examples),
            "num-val-examples": int(num_val_examples),
            "local-val-accuracy": float(local_val_accuracy),
            **{key: float(solve[key]) for key in SOLVE_METRIC_KEYS if solve},
        }
    )
    return RecordDict(records)


def array_record(state: dict[str, np.ndarray]) -> ArrayRecord:
    """An ArrayRecord holding a ``{name: array}`` state, names kept."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in state.items()})










IDENTITY_KEY = "identity"
IDENTITY_METRIC_KEYS = ("num-features", "num-classes", "num-train-examples", "num-val-examples")
IDENTITY_OPTIONAL_METRICS = ("num-test-examples",)
STATS_KEY = "stats"




def encode_identity(name: str, source: str, *, num_features: int, num_classes: int,
                    num_train: int, num_val: int, labels: list[str] | None = None,
                    stats: tuple[int, np.ndarray, np.ndarray] | None = None,
                    num_test: int = 0, columns: list[str] | None = None,
                    notes: list[str] | None = None,
                    categories: list[str] | None = None) -> RecordDict:
    """A node's answer to the server's ``query`` (who it is, what data it holds).

    ``labels``: the class names it holds; ``stats``: per-feature count, sum and sum of
    squares of its training rows (``standardize='federated'`` only); ``columns``: its
    feature columns' names, in its order (files with a header row); ``notes``: how its
    file was read (ID columns left out, validation rows split off, one class), for the
    run's summary; ``categories``: its category columns by name (their 0/1 columns are
    ``<column>=<value>`` among ``columns``).
    """
    identity: dict[str, Any] = {"node-name": name, "data-source": source}
    if labels is not None:
        identity["labels"] = [str(v) for v in labels]
    if columns is not None:
        identity["columns"] = [str(c) for c in columns]
    if notes:
        identity["notes"] = [str(n) for n in notes]
    if categories:
        identity["category-columns"] = [str(c) for c in categories]
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
