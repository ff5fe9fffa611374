"""The constraints a run setting can declare, and the setting declaration itself.

Each setting of :class:`gems_fl.settings.Settings` is one :func:`setting` call: its
default (which fixes its type), its meaning (the README's "Settings" table and
``gems-fl run --help`` are generated from it), its constraint, and whether nodes need
it. A constraint is a callable ``check(key, value)`` that raises
:class:`SettingsError` with a message naming the key and saying what is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import Field, field
from typing import Any

Check = Callable[[str, Any], None]


class SettingsError(ValueError):
    """A run setting has an invalid value; the message names the key."""


#: the longest meaning a user setting may have (the README's table stays readable)
USER_MEANING_MAX = 300


def setting(default: Any, meaning: str, check: Check | None = None, *, node: bool = False,
            user: bool = False, lab: bool = False, detail: str = "") -> Any:
    """Declare one run setting (a dataclass field with its description as metadata).

    ``meaning`` is the settings table's text (backticks for code); settings that share
    one row (``hidden`` and ``dropout``) pass the same text and sit side by side.
    ``node=True``: node code reads it, so it travels to the nodes in every message;
    the others stay on the server. ``user=True``: a choice a user makes (the README's
    table and the head of ``gems-fl run --help``; its meaning at most
    :data:`USER_MEANING_MAX` characters); the others are the internals and research
    switches of ``docs/settings.md``. ``lab=True``: a research switch of the paper's
    studies: not in the app's ``[tool.flwr.app.config]``; a run sets it inside the one
    ``lab`` setting (``--run-config "lab='tune-curve=100,200'"``, see :func:`expand_lab`).
    ``detail``: more words for ``docs/settings.md``.
    """
    if user and lab:
        raise ValueError(f"a research switch (lab=True) is not a user's setting: {meaning[:60]}")
    if user and len(meaning) > USER_MEANING_MAX:
        raise ValueError(f"a user setting's meaning has at most {USER_MEANING_MAX} characters "
                         f"({len(meaning)}): move the rest to detail=: {meaning[:60]}...")
    return field(default=default, metadata={"meaning": meaning, "check": check, "node": node,
                                            "user": user, "lab": lab, "detail": detail})


def key_of(f: Field) -> str:
    """A field's ``pyproject.toml`` key (``r_max`` -> ``r-max``)."""
    return f.name.replace("_", "-")


def one_of(choices: Collection[str]) -> Check:
    """The value must be one of ``choices``."""
    def check(key: str, value: Any) -> None:
        if value not in choices:
            raise SettingsError(f"{key}={value!r} is not one of {', '.join(choices)}")
    return check


def positive(key: str, value: Any) -> None:
    """The value must be > 0."""
    if not value > 0:
        raise SettingsError(f"{key}={value!r} must be > 0")


def at_least(low: float, why: str = "") -> Check:
    """The value must be >= ``low``; ``why`` says what the bound means."""
    def check(key: str, value: Any) -> None:
        if value < low:
            raise SettingsError(f"{key}={value!r} must be >= {low}{f' ({why})' if why else ''}")
    return check


def in_range(low: float, high: float, meaning: str, *, closed: str = "both") -> Check:
    """``low <= value <= high``; ``closed`` says which ends belong: ``both``, ``left``
    (``low <= value < high``) or ``right`` (``low < value <= high``)."""
    left, right = closed in ("both", "left"), closed in ("both", "right")
    bounds = f"{'[' if left else '('}{low}, {high}{']' if right else ')'}"

    def check(key: str, value: Any) -> None:
        above = value >= low if left else value > low
        below = value <= high if right else value < high
        if not (above and below):
            raise SettingsError(f"{key}={value!r} must be in {bounds}: {meaning}")
    return check


def parses(parse: Callable[[Any], Any]) -> Check:
    """``parse(value)`` must not raise ``ValueError`` (its message is kept)."""
    def check(key: str, value: Any) -> None:
        try:
            parse(value)
        except SettingsError:
            raise
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    return check


def non_empty(message: str) -> Check:
    """A text value that must not be empty."""
    def check(key: str, value: Any) -> None:
        if not str(value).strip():
            raise SettingsError(message)
    return check


def coerce(key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default`` (ints are accepted for floats), else an error."""
    expected = type(default)
    if expected is bool:
        if isinstance(value, bool):
            return value
    elif expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif expected is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # a text setting that also takes numbers (`--run-config "k=0.01"`)
    raise SettingsError(
        f"{key}={value!r} has type {type(value).__name__}, expected "
        f"{expected.__name__} (like the default {default!r})"
    )
