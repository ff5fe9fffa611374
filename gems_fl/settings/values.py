"""Parsers and checks of the text-valued run settings (``tune-curve``, ``pooled-ridge``,
``hidden``, ``classes``): what each text means, and a :class:`SettingsError` naming the
key when it means nothing."""

from __future__ import annotations

import math

from gems_fl.geometry.choices import DP_POOLED_RIDGES, POOLED_RIDGES
from gems_fl.learning.widths import parse_hidden
from gems_fl.settings.checks import SettingsError


def parse_tune_curve(text: str) -> list[int]:
    """Public sample sizes of the fine-tuning study (``tune-curve``)."""
    text = text.strip()
    if not text:
        return []
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise SettingsError(
            f"tune-curve={text!r} must be comma-separated sample sizes, "
            "e.g. '100,200,500', or empty to skip the fine-tuning study"
        ) from None
    if any(n <= 0 for n in sizes):
        raise SettingsError(f"tune-curve={text!r}: every size must be > 0")
    return sizes


def _auto_or_number(key: str, value: object, convert: type, meaning: str) -> str | float | int:
    """``auto``, or ``convert(value)`` when it is finite and >= 0; ``meaning`` says what
    a number means, for the error."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    try:
        number = convert(text)
    except ValueError:
        raise SettingsError(f"{key}={value!r}: give 'auto' or {meaning}") from None
    if not math.isfinite(number) or number < 0:
        raise SettingsError(f"{key}={value!r} must be 'auto' or {meaning}")
    return number


def parse_pooled_ridge(value: str, private: bool = False) -> tuple[float, ...]:
    """The ridges ``pooled-ridge`` names: ``auto`` -> the selection round's candidates,
    the stronger :data:`DP_POOLED_RIDGES` when the statistics are noised (``private``)."""
    ridge = _auto_or_number("pooled-ridge", value, float,
                            "a finite number >= 0 (auto: chosen on the nodes' validation data)")
    if ridge == "auto":
        return DP_POOLED_RIDGES if private else POOLED_RIDGES
    return (ridge,)


def parse_gram_rank(value: str | int) -> str | int:
    """``gram-rank``: ``auto`` or a whole number >= 0 (0: the whole matrix)."""
    return _auto_or_number("gram-rank", value, int,
                           "a whole number >= 0 (0 sends the whole Gram matrix, r > 0 a "
                           "rank-r factor; auto a rank that follows the matrix size)")


def run_gram_rank(gram_rank: int | str, whole: bool) -> int | str:
    """``gram-rank`` as the run uses it: parsed, and ``auto`` as the whole matrix (0)
    where a factor does not pay (``whole``): under SecAgg+ and DP, whose sums carry the
    whole triangle anyway, and for the MLP, whose output layer lost 0.53 point with it
    (results/README.md, "1b")."""
    rank = parse_gram_rank(gram_rank)
    return 0 if rank == "auto" and whole else rank


def parse_refine_l2(value: str | float) -> str | float:
    """``refine-l2``: ``auto`` or a finite number >= 0."""
    return _auto_or_number("refine-l2", value, float,
                           "a finite number >= 0 (relative to the mean diagonal of the pooled "
                           "Gram matrix)")


def parse_rf_bandwidth(text: object) -> float | None:
    """``rf-bandwidth``: ``auto`` (None: from the identity round's sums) or a positive number."""
    value = str(text).strip().lower()
    if value == "auto":
        return None
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"rf-bandwidth={text!r}: give 'auto' or a positive number") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"rf-bandwidth={text!r} must be a positive number (or 'auto')")
    return number


def check_hidden(text: str) -> None:
    """``hidden``: ``auto`` or comma-separated widths."""
    if text.strip().lower() != "auto":
        parse_hidden(text)


def check_classes(text: str) -> None:
    """``classes``: a count or names, at least 2."""
    from gems_fl.data.site_files import parse_classes

    classes = parse_classes(text)
    if classes is not None and (classes if isinstance(classes, int) else len(classes)) < 2:
        raise SettingsError(f"classes={text!r}: a classifier needs at least 2 classes")


def parse_min_good_enough(value: str) -> int | None:
    """``min-good-enough``: ``majority`` -> None (more than half of the sites that took
    part), else a count (``0``: no check)."""
    text = str(value).strip().lower()
    if text == "majority":
        return None
    if text.isdigit():
        return int(text)
    raise SettingsError(f"min-good-enough={value!r}: give 'majority' (more than half of the "
                        "sites that took part) or a count of sites such as '3' (0: no check)")


def required_good_enough(value: str, took_part: int) -> int:
    """How many of ``took_part`` sites must find ``h_G`` good enough (``min-good-enough``)."""
    count = parse_min_good_enough(value)
    return took_part // 2 + 1 if count is None else count


def parse_required_nodes(value: str) -> int | tuple[str, ...] | None:
    """``required-nodes``: ``all`` -> None (every node present at the identity round), a
    count -> that many sites must take part to the end, else the names that must."""
    text = str(value).strip()
    if text.lower() == "all":
        return None
    if text.isdigit():
        return int(text)
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names or text.lstrip().startswith("-"):
        raise SettingsError(
            f"required-nodes={value!r}: give 'all' (every node present at the identity round), "
            "a count such as '3' (0: none required), or node names such as 'site-a,site-b'")
    return names
