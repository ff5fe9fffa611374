"""The spaces round's replies: one node's good-enough space, checked before any of it is used.

:func:`decode_reply` turns a reply's records into the space of its kind (ball, ellipsoid,
Gram space) and its metrics, or raises :class:`~gems_fl.protocol.replies.ReplyError`
saying what is wrong with it; each kind's extra record has its reader here
(:data:`_EXTRA_READERS`). The record layout is in :mod:`gems_fl.protocol.wire`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import RecordDict

from gems_fl.geometry.choices import class_gram_rank_for, gram_rank_for
from gems_fl.geometry.class_factors import check_class_factors
from gems_fl.geometry.components import check_component_grams
from gems_fl.geometry.gram import (
    check_class_grams,
    check_gram,
    check_moments,
    from_factor,
    from_half,
    mean_columns,
    unpack_triangle,
)
from gems_fl.geometry.kinds import space_kind
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.models import state_to_vector
from gems_fl.protocol.replies import ReplyError, read_metrics, read_state
from gems_fl.protocol.wire import (
    AXES_KEY,
    CENTER_KEY,
    CLASS_FACTOR_KEYS,
    COLUMN_CLASSES_KEY,
    GRAM_KEY,
    LABELS_KEY,
    METRICS_KEY,
)


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
    center = read_state(content, CENTER_KEY, shapes)
    metrics = read_metrics(content)
    extras: dict[str, Any] = {}
    # the labels first: a Gram factor sent beside label moments is of the within-class
    # scatter, and its matrix adds the class means read from them
    for key in sorted(records, key=lambda k: k != LABELS_KEY):
        extras[key] = _EXTRA_READERS[key](content, shapes, gram_rank, metrics,
                                          extras.get(LABELS_KEY))
    if with_columns:
        extras[COLUMN_CLASSES_KEY] = _read_column_classes(content, extras[LABELS_KEY], columns)
    certified = metrics["certified-radius"]
    space = space_type.make(state_to_vector(center), metrics["radius"],
                            math.inf if certified < 0 else certified, extras)
    return space, metrics


def _read_axes(content: RecordDict, shapes: dict[str, tuple[int, ...]], rank: int,
               metrics: dict[str, float], labels: tuple | None = None) -> np.ndarray:
    """Relative ellipsoid axes, shaped like the model, all positive: as one vector."""
    axes = state_to_vector(read_state(content, AXES_KEY, shapes))
    if np.any(axes <= 0):
        raise ReplyError("'axes' has entries <= 0; relative axes must be positive")
    return axes


def _read_gram_record(content: RecordDict, shapes: dict[str, tuple[int, ...]],
                      rank: int | str, metrics: dict[str, float],
                      labels: tuple | None = None) -> np.ndarray:
    n = int(shapes["weight"][1]) + 1
    return _read_gram(content, n, gram_rank_for(rank, n), labels)


def _read_labels(content: RecordDict, shapes: dict[str, tuple[int, ...]], rank: int | str,
                 metrics: dict[str, float], labels: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None,
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


def _read_gram(content: RecordDict, n: int, rank: int,  # noqa: C901
               labels: tuple | None = None) -> np.ndarray:
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
            means = None if labels is None else mean_columns(labels[0], labels[1])
            return from_factor(from_half(arr, scales), residual, means)
        if arr.shape != (n * (n + 1) // 2,):
            raise ValueError(f"triangle has shape {arr.shape}, expected ({n * (n + 1) // 2},) "
                             f"for a {n} x {n} matrix")
        gram = unpack_triangle(arr, n)
        check_gram(gram, n)
    except ValueError as exc:
        raise ReplyError(f"'{GRAM_KEY}': {exc}") from None
    return gram


# How the wire format reads each kind's extra record (:attr:`SpaceKind.extra_record`).
_EXTRA_READERS: dict[str, Callable[..., Any]] = {
    AXES_KEY: _read_axes,
    GRAM_KEY: _read_gram_record,
    LABELS_KEY: _read_labels,
}
