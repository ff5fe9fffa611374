"""Validation of scalar options, shared by the geometry modules.

One helper for every number an option can be, so that each function states its
options' ranges in one line each instead of an ``isinstance`` ladder. Like
scikit-learn's ``check_scalar``: a value of the wrong type raises ``TypeError`` and
one out of range ``ValueError``; unlike it, ``bool`` is never accepted as a number and
real numbers must be finite (``nan`` fails every comparison, so a range alone would
let it through).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection
from typing import Any


def check_scalar(
    value: Any,
    name: str,
    kind: type[int] | type[float],
    *,
    low: float | None = None,
    high: float | None = None,
    closed: str = "both",
) -> Any:
    """``value`` as an ``int`` or ``float`` after checking its type and range.

    Parameters
    ----------
    value : the option as passed (Python or numpy scalar).
    name : the option's name, for the error message.
    kind : ``int`` (any integral type but ``bool``) or ``float`` (any real type but
        ``bool``, finite).
    low, high : bounds of the allowed range; ``None`` for unbounded.
    closed : which bounds belong to the range: ``"both"``, ``"left"``, ``"right"``
        or ``"neither"``.

    Raises
    ------
    TypeError
        ``value`` is not of ``kind``.
    ValueError
        ``value`` is not finite or is out of range.
    """
    abstract = numbers.Integral if kind is int else numbers.Real
    if isinstance(value, bool) or not isinstance(value, abstract):
        noun = "an int" if kind is int else "a real number"
        raise TypeError(f"{name} must be {noun}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    low_ok = low is None or (value >= low if closed in ("both", "left") else value > low)
    high_ok = high is None or (value <= high if closed in ("both", "right") else value < high)
    if not (low_ok and high_ok):
        raise ValueError(f"{name} must be {_describe(low, high, closed)}, got {value!r}")
    return kind(value)


def check_option(value: Any, name: str, choices: Collection[Any]) -> Any:
    """``value`` if it is one of ``choices``, else ``ValueError`` naming them."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def _describe(low: float | None, high: float | None, closed: str) -> str:
    left = closed in ("both", "left")
    right = closed in ("both", "right")
    if high is None:
        return f"{'>=' if left else '>'} {low}"
    if low is None:
        return f"{'<=' if right else '<'} {high}"
    return f"in {'[' if left else '('}{low}, {high}{']' if right else ')'}"
