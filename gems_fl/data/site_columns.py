"""A site's feature columns by name: which columns look like row IDs (left out of the
features), and how sites' column names are matched: the vote the identity round and
``gems-fl check-data`` share, and the difference that names what a site lacks or adds.

Plain lists of names and cells; :mod:`gems_fl.data.site_files` reads the files.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

ID_AUTO, ID_NONE = "auto", "none"  # ``id-columns``: detect ID-like columns, or keep every one


class ColumnError(ValueError):
    """An ``id-columns`` value that does not fit the file's columns."""


#: header names that say a column numbers the rows rather than measures them
ID_NAMES = frozenset({"", "id", "ids", "rownames", "row", "rowid", "row_id", "row id", "index",
                      "idx", "unnamed: 0", "key", "uid", "uuid", "record", "record_id"})


def id_like(name: str | None, values: list) -> bool:
    """Whether a feature column looks like a row ID: its values differ in every row and
    it holds text, or it is named like an ID (:data:`ID_NAMES`, or ending in ``_id`` /
    `` id``) and holds integers or text."""
    if len(values) < 2:
        return False
    if any(isinstance(v, float) and not np.isfinite(v) for v in values):
        return False
    if len(set(values)) != len(values):
        return False
    if all(isinstance(v, str) for v in values):
        return True
    if name is None:
        return False
    lowered = name.strip().lower()
    named = lowered in ID_NAMES or lowered.endswith(("_id", " id", "-id"))
    return named and all(isinstance(v, str) or float(v).is_integer() for v in values)


def columns_to_drop(spec: str, names: list[str] | None, width: int, path: Path,
                    values: Callable[[int], list]) -> list[int]:
    """The feature columns (indices among the features) that ``id-columns`` leaves out;
    ``values(i)`` gives column ``i``'s cells.

    Named columns add to what detection finds (``auto``): a user who names one ID column
    has not vouched for the others, so a second ID column is still left out (and named);
    ``none`` alone keeps every column.
    """
    text = str(spec).strip()
    if text.lower() in ("", ID_NONE):
        return []
    detected = [i for i in range(width) if id_like(None if names is None else names[i], values(i))]
    if text.lower() == ID_AUTO:
        return detected
    wanted = [part.strip() for part in text.split(",") if part.strip()]
    picked = list(detected)
    if names is None:
        raise ColumnError(f"{path}: id-columns={text!r} names columns, but the file has no "
                            "column names (a CSV header row, or an .npz array 'columns')")
    for item in wanted:
        if item not in names:
            raise ColumnError(f"{path}: id-columns names {item!r}, which is not one of its "
                                f"feature columns ({', '.join(names)})")
        picked.append(names.index(item))
    return sorted(set(picked))


def vote_columns(named: dict[str, list[str]], rows: dict[str, int]) -> tuple[list[str], list[str]]:
    """The feature columns sites matched by name agree on: ``(columns, holders)``.

    ``named``: each site's column names by site name; ``rows``: its training rows. The set
    of names most sites hold wins (ties: more training rows, then the names); the order is
    that of the first holder by site name, so the order of arrival never matters.
    ``holders``: the sites holding that set, by name. Shared by the identity round and
    ``gems-fl check-data``, which must agree with it.
    """
    votes = Counter(frozenset(c) for c in named.values())
    held_rows = lambda names: sum(rows.get(k, 0) for k, c in named.items() if frozenset(c) == names)
    winner = max(votes, key=lambda names: (votes[names], held_rows(names), sorted(names)))
    holders = sorted(k for k, c in named.items() if frozenset(c) == winner)
    return list(named[holders[0]]), holders


def column_difference(columns: list[str], wanted: list[str], other: str) -> str:
    """Why ``columns`` cannot be matched by name to ``wanted`` (``other`` names their
    holder), or ``""`` when they hold the same names (in any order)."""
    extra = [c for c in columns if c not in wanted]
    lacking = [c for c in wanted if c not in columns]
    repeated = sorted({c for c in columns if columns.count(c) > 1})
    if repeated:
        return f"column name(s) {', '.join(repeated)} appear more than once; name each column once"
    if not extra and not lacking:
        return ""
    parts = []
    if extra:
        parts.append(f"has column(s) {', '.join(extra)} that {other} lacks")
    if lacking:
        parts.append(f"lacks column(s) {', '.join(lacking)} that {other} has")
    return "; ".join(parts) + " (columns are matched by name)"
