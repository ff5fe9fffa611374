"""A CSV table as a site file holds it: its rows, its header (detected), its label column,
the numbers and text in its cells, its ID and category columns.

:mod:`gems_fl.data.site_files` reads a site's files with it; :mod:`gems_fl.data.scoring_rows`
and :mod:`gems_fl.data.table_split` read a user's tables with its pieces.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from gems_fl.data.categories import MAX_LEVELS
from gems_fl.data.site_columns import ID_AUTO, ColumnError, columns_to_drop


class SiteFileError(ValueError):
    """A site file cannot be read at all; the message says what to fix."""


def checked_drop(spec, names, width, path, values) -> list[int]:
    """The ID columns ``id-columns`` leaves out (:func:`~gems_fl.data.site_columns.
    columns_to_drop`), a bad value as a :class:`SiteFileError`."""
    try:
        return columns_to_drop(spec, names, width, path, values)
    except ColumnError as exc:
        raise SiteFileError(str(exc)) from None


def _label_index(label_column: str, header: list[str] | None, width: int, where: Path) -> int:
    spec = str(label_column).strip()
    if not spec:
        return width - 1
    try:
        index = int(spec)
    except ValueError:
        if header is None:
            raise SiteFileError(f"{where}: label-column={spec!r} names a column, but the file "
                                "has no header row; give a column number instead") from None
        if spec not in header:
            raise SiteFileError(f"{where}: label-column={spec!r} is not in the header "
                                f"({', '.join(header)})") from None
        return header.index(spec)
    if not -width <= index < width:
        raise SiteFileError(f"{where}: label-column={index} is outside the {width} columns")
    return index % width


def parses(text: str, kind: type) -> bool:
    """Whether ``kind(text)`` (``int`` or ``float``) accepts the text."""
    try:
        kind(text)
        return True
    except ValueError:
        return False


def csv_rows(path: Path) -> list[list[str]]:
    """A CSV file's non-blank rows as lists of cells (a byte-order mark is dropped)."""
    try:
        with Path(path).open(newline="", encoding="utf-8-sig") as f:
            return [row for row in csv.reader(f) if row and any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise SiteFileError(f"{path} cannot be read as CSV: {exc}") from None


def header_and_label(rows: list[list[str]], label_column: str, path: Path
                     ) -> tuple[list[str] | None, int]:
    """A CSV's header row (None: the first row is data) and its label column's number.

    The first row is a header when the label column is named, or when one of its other
    cells is not a number."""
    width = len(rows[0])
    if width < 2:
        raise SiteFileError(f"{path}: rows have {width} column; a sample needs features and a label")
    first = [c.strip() for c in rows[0]]
    spec = str(label_column).strip()
    if spec and not spec.lstrip("-").isdigit():
        header: list[str] | None = first  # a column name: the file must have a header
    else:
        guess = _label_index(spec, None, width, path)
        header = first if any(not parses(c, float) for i, c in enumerate(first)
                              if i != guess and c) else None
    return header, _label_index(label_column, header, width, path)


def read_csv_table(path: Path, label_column: str = "", id_columns: str = ID_AUTO,
                   drop: list[str] | None = None, declared: dict[str, list[str]] | None = None,
                   categories: dict[str, list[str]] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, list[str] | None, list[str], list[int]]:
    """``(features float64, class names, feature column names or None, ID columns left
    out, each feature's column number in the file)`` of one CSV file, header detected.

    The first row is a header when one of its feature cells is not a number. Empty
    feature cells and ``nan`` become NaN (reported by :func:`site_problems`). ID-like
    columns (``id_columns``, see :func:`read_site_file`; ``drop``: exactly these names,
    a companion file's training file's choice) are left out. A text column of a file
    with a header, of at most :data:`MAX_LEVELS` values (or named in ``declared``), is a
    category column: its cells go to ``categories`` by name, not into the features.
    Another text column is refused with its name, its number, the values seen and what
    to do.
    """
    rows = csv_rows(path)
    if not rows:
        return np.zeros((0, 0)), np.array([], dtype=str), None, [], []
    width = len(rows[0])
    header, label = header_and_label(rows, label_column, path)
    body = rows[1:] if header is not None else rows
    cells = np.empty((len(body), width), dtype=object)
    for r, row in enumerate(body, start=2 if header is not None else 1):
        if len(row) != width:
            raise SiteFileError(f"{path}: line {r} has {len(row)} columns, the first row {width}")
        cells[r - (2 if header is not None else 1)] = [c.strip() for c in row]
    features = [c for c in range(width) if c != label]
    names = None if header is None else [header[c] for c in features]
    parsed = {c: [parse_cell(v) for v in cells[:, c]] for c in features}
    if drop is None:
        picked = checked_drop(id_columns, names, len(features), path,
                                  lambda i: parsed[features[i]])
        dropped = [features[i] for i in picked]
    else:
        dropped = [features[names.index(d)] for d in drop if names is not None and d in names]
    kept = [c for c in features if c not in dropped]
    text = {c: [v for v in parsed[c] if isinstance(v, str)] for c in kept}
    text = {c: found for c, found in text.items() if found}
    if header is not None:
        taken = _category_columns(path, header, cells, kept, text, declared or {})
        if categories is not None:
            categories.update({header[c]: (c, list(cells[:, c])) for c in taken})
        kept = [c for c in kept if c not in taken]
        text = {c: found for c, found in text.items() if c not in taken}
    if text:
        raise SiteFileError(f"{path}: " + "; ".join(
            _text_column(c, header, found) for c, found in sorted(text.items()))
            + "; features must be numbers, and a column is a category column only in a file "
            f"with a header row, with text in every cell and at most {MAX_LEVELS} values: "
            "fill or drop a number column's text cells; if a column numbers or names rows, "
            "leave it out with id-columns (e.g. --id-columns <name>); else drop it, or name it "
            "as the label with label-column")
    x = np.ascontiguousarray(np.array([parsed[c] for c in kept], dtype=np.float64).reshape(len(kept), len(body)).T)
    y = np.array([csv_label(v) for v in cells[:, label]], dtype=str)
    columns = None if header is None else [header[c] for c in kept]
    return x, y, columns, [header[c] if header else f"column {c}" for c in dropped], kept


def _category_columns(path: Path, header: list[str], cells: np.ndarray, kept: list[int],
                      text: dict[int, list[str]], declared: dict[str, list[str]]) -> list[int]:
    """The kept columns that are category columns: declared, or text in every cell with
    at most :data:`MAX_LEVELS` values; an empty cell in one is refused."""
    taken = sorted({c for c in kept if header[c] in declared} | {
        c for c, found in text.items() if len(found) == sum(1 for v in cells[:, c] if v)
        and len(set(found)) <= MAX_LEVELS})
    empty = [header[c] for c in taken if "" in set(cells[:, c])]
    if empty:
        raise SiteFileError(f"{path}: category column(s) {', '.join(map(repr, empty))} have "
                            "empty cells; fill them (a value such as 'missing' is a value "
                            "like any other)")
    return taken


def parse_cell(cell: str) -> float | str:
    """A feature cell: its number, NaN when empty, else the text itself."""
    if not cell:
        return np.nan
    try:
        return float(cell)
    except ValueError:
        return cell


def _text_column(c: int, header: list[str] | None, cells: list[str]) -> str:
    seen = list(dict.fromkeys(cells))
    shown = ", ".join(repr(v) for v in seen[:4]) + (", ..." if len(seen) > 4 else "")
    name = f"column {header[c]!r} (column {c}, counted from 0)" if header else f"column {c} (counted from 0)"
    return f"{name} holds text in {len(cells)} row(s) ({shown}; {len(seen)} distinct)"


def csv_label(cell: str) -> str:
    """A CSV label cell as a class name: ``2``, ``2.0`` and ``2.000e+00`` are all ``"2"``."""
    text = cell.strip()
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if np.isfinite(value) and value.is_integer() else text
