"""Category columns: a text column of a handful of values, one 0/1 column per value.

A CSV column with a header name, text in every cell (no cell a number, none empty) and
at most :data:`MAX_LEVELS` values is a category column; so is any column the operator
declares in ``categories``.

A site encodes its category columns with the values it holds (or the ``categories`` the
operator declared), naming each 0/1 column ``<column>=<value>``. The identity round
agrees on the values by name: every value some site holds becomes a column of the run,
and a site without it has zeros there (:func:`complete_columns`), so no site needs to
know the others' values beforehand. Under ``dp-epsilon`` the values are declared up
front instead (which values a site holds would otherwise reach the server unnoised).
A saved model encodes a user's raw table the same way; a value no site held is named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

#: a text column with more distinct values than this is not taken as a category column
MAX_LEVELS = 32
SEPARATOR = "="


class CategoryError(ValueError):
    """A category column's value or declaration does not fit; the message says the fix."""


def level_name(column: str, value: str) -> str:
    """The 0/1 column of ``value`` in category column ``column``."""
    return f"{column}{SEPARATOR}{value}"


def sort_levels(values: Iterable[str]) -> list[str]:
    """A category's values in the run's order: numeric when every value is a number,
    else alphabetical (so every site and the saved model order them alike)."""
    values = {str(v) for v in values}
    try:
        return sorted(values, key=lambda v: (float(v), v))
    except ValueError:
        return sorted(values)


def parse_categories(spec: str) -> dict[str, list[str]]:
    """The ``categories`` setting: ``'colour=red|green|blue; plan=basic|premium'``."""
    out: dict[str, list[str]] = {}
    for part in str(spec).split(";"):
        if not part.strip():
            continue
        column, sep, values = part.partition(SEPARATOR)
        levels = [v.strip() for v in values.split("|")]
        if not sep or not column.strip() or not all(levels) or len(set(levels)) != len(levels):
            raise CategoryError(
                f"categories={spec!r}: {part.strip()!r} must read column=value|value|... "
                "(distinct, non-empty values), columns separated by ';', e.g. "
                "'colour=red|green|blue; plan=basic|premium'")
        out[column.strip()] = sort_levels(levels)
    return out


def format_categories(levels: Mapping[str, list[str]]) -> str:
    """``levels`` as the ``categories`` setting writes them (:func:`parse_categories`)."""
    return "; ".join(f"{base}{SEPARATOR}{'|'.join(values)}" for base, values in levels.items())


def one_hot(cells: Iterable[str], levels: list[str], column: str, where: str) -> np.ndarray:
    """``(n, len(levels))`` float64 0/1 columns of ``cells``; a value outside ``levels``
    raises :class:`CategoryError` naming it."""
    cells = [str(c).strip() for c in cells]
    index = {v: i for i, v in enumerate(levels)}
    unknown = sort_levels({c for c in cells if c not in index})
    if unknown:
        raise CategoryError(
            f"{where}: category column {column!r} holds value(s) "
            f"{', '.join(map(repr, unknown[:5]))}{', ...' if len(unknown) > 5 else ''} that "
            f"are not among its values ({', '.join(levels)})")
    out = np.zeros((len(cells), len(levels)), dtype=np.float64)
    out[np.arange(len(cells)), [index[c] for c in cells]] = 1.0
    return out


def encode_raw_columns(names: list[str], cells: np.ndarray, levels: Mapping[str, list[str]],
                       where: str, keep: str = "") -> tuple[list[str], np.ndarray]:
    """A raw table's columns with each category column (but ``keep``, a label) replaced by
    its 0/1 columns, as a saved model takes them: ``(names, cells)`` (object array). A
    value outside the model's raises :class:`CategoryError` naming it."""
    out_names, parts = [], []
    for i, name in enumerate(names):
        if name in levels and name != keep:
            try:
                parts.append(one_hot(cells[:, i], levels[name], name, where).astype(object))
            except CategoryError as exc:
                raise CategoryError(f"{exc}: the model knows only the values its sites "
                                    "held") from None
            out_names += [level_name(name, v) for v in levels[name]]
        else:
            parts.append(cells[:, [i]])
            out_names.append(name)
    return out_names, np.hstack(parts)


def base_of(name: str, bases: Iterable[str]) -> str | None:
    """The category column a 0/1 column ``name`` belongs to among ``bases``, if any."""
    return next((b for b in bases if name.startswith(b + SEPARATOR)), None)


def agreed_levels(held: Iterable[tuple[list[str], list[str]]]) -> dict[str, list[str]]:
    """Every value any site holds, per category column: ``held`` gives each site's
    ``(columns, category columns)``."""
    levels: dict[str, set[str]] = {}
    for columns, bases in held:
        for base in bases:
            prefix = base + SEPARATOR
            levels.setdefault(base, set()).update(c[len(prefix):] for c in columns
                                                  if c.startswith(prefix))
    return {base: sort_levels(values) for base, values in sorted(levels.items())}


def complete_columns(columns: list[str], bases: list[str], levels: Mapping[str, list[str]]
                     ) -> tuple[list[str], list[int | None]]:
    """A site's columns with every agreed value of its category columns: ``(names, where
    each comes from)``, a source of None for a value the site lacks (a column of zeros).
    The site's other columns keep their order; each category's columns follow them in
    the agreed order."""
    kept = [c for c in columns if base_of(c, bases) is None]
    names = kept + [level_name(b, v) for b in sorted(bases) for v in levels.get(b, [])]
    where = {c: i for i, c in enumerate(columns)}
    return names, [where.get(c) for c in names]
