"""A user's own rows to score with a saved model (``gems-fl predict``): a CSV or ``.npz``
read into the model's columns, with the label column when the file has one.

Columns are matched by name when the model knows its columns' names and the file has a
header (any order; columns the model does not take are named and left out); otherwise by
position. The label column is the one ``label_column`` names, else found: with names, the
single column beyond the model's that is not ID-like; by position, the last of ``d + 1``
columns. A missing column, a text cell or an empty cell is refused with its column's name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gems_fl.data.categories import CategoryError, encode_raw_columns
from gems_fl.data.csv_table import SiteFileError, csv_label, csv_rows, parse_cell
from gems_fl.data.site_columns import id_like
from gems_fl.data.site_files import label_names

NPZ_PAIRS = (("x_test", "y_test"), ("x", "y"))  # the arrays an .npz is scored on, first found


@dataclass
class ScoringRows:
    """Rows in the model's column order and, when the file holds them, their labels."""

    x: np.ndarray  # (n, d) float64
    labels: np.ndarray | None  # class names (str), or None: predictions only
    label_column: str | None = None  # how the label column was named or found
    ignored: list[str] = field(default_factory=list)  # columns the model does not take


def read_scoring_rows(path: str | Path, names: list[str] | None, width: int,
                      label_column: str = "",
                      categories: dict[str, list[str]] | None = None) -> ScoringRows:
    """The rows of ``path`` for a model taking ``width`` columns named ``names`` (None:
    by position); a CSV's raw category columns (``categories``: each one's values) are
    encoded as the run encoded the sites'. Raises
    :class:`~gems_fl.data.site_files.SiteFileError` saying what to fix."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise SiteFileError(f"{path} not found: give a .csv or .npz file of rows to score")
    if path.suffix.lower() == ".npz":
        return _read_npz(path, names, width)
    if path.suffix.lower() != ".csv":
        raise SiteFileError(f"{path}: expected a .csv or .npz file")
    return _read_csv(path, names, width, str(label_column).strip(), categories or {})


def _read_npz(path: Path, names: list[str] | None, width: int) -> ScoringRows:
    with np.load(path, allow_pickle=False) as data:
        pair = next(((x, y) for x, y in NPZ_PAIRS if x in data.files), None)
        if pair is None:
            raise SiteFileError(f"{path} holds {', '.join(data.files) or 'no arrays'}; expected "
                                "x_test (and y_test) or x (and y)")
        x = np.asarray(data[pair[0]])
        labels = label_names(data[pair[1]], f"{path}:{pair[1]}") if pair[1] in data.files else None
        columns = [str(c) for c in data["columns"]] if "columns" in data.files else None
    if x.ndim != 2:
        raise SiteFileError(f"{path}:{pair[0]} has shape {x.shape}; expected (rows, features)")
    header = columns if names is not None and columns is not None else None
    cells = x.astype(object)
    if header is None:
        if x.shape[1] != width:
            raise SiteFileError(f"{path}:{pair[0]} has {x.shape[1]} columns; the model takes "
                                f"{width}" + (f" ({', '.join(names)})" if names else ""))
        return ScoringRows(_features(cells, list(range(width)), None, path), labels, pair[1])
    order = _by_name(header, names, path)
    ignored = [c for c in header if c not in names]
    return ScoringRows(_features(cells, order, header, path), labels,
                       pair[1] if labels is not None else None, ignored)


def _read_csv(path: Path, names: list[str] | None, width: int, spec: str,
              categories: dict[str, list[str]]) -> ScoringRows:
    rows = csv_rows(path)
    if not rows:
        raise SiteFileError(f"{path} holds no rows")
    first = [c.strip() for c in rows[0]]
    span = len(rows[0])
    # a text cell makes the first row a header, unless it sits where the label would
    guess = (_label_position(spec, None, span, path)
             if span == width + 1 and not (spec and not spec.lstrip("-").isdigit()) else None)
    has_header = (names is not None and any(c in names for c in first)) or any(
        not isinstance(parse_cell(c), float) for i, c in enumerate(first) if c and i != guess)
    header = first if has_header else None
    body = rows[1:] if has_header else rows
    if not body:
        raise SiteFileError(f"{path} holds a header and no rows")
    for r, row in enumerate(body, start=2 if has_header else 1):
        if len(row) != span:
            raise SiteFileError(f"{path}: line {r} has {len(row)} columns, the first row {span}")
    cells = np.array([[c.strip() for c in row] for row in body], dtype=object)
    if header is not None and names is not None:
        if categories:
            header, cells = _encoded(header, cells, categories, spec, path)
        return _named_csv(path, header, names, cells, spec)
    if span not in (width, width + 1):
        raise SiteFileError(f"{path} has {span} columns; the model takes {width} (and the file "
                            f"may add a label column)" + (
                                "" if names is None else
                                f"; give a header row naming {', '.join(names)}"))
    if span == width:
        if spec:
            raise SiteFileError(f"{path} has the model's {width} columns and no more, so "
                                f"label-column={spec!r} names no label column")
        return ScoringRows(_features(cells, list(range(width)), header, path), None)
    label = _label_position(spec, header, span, path)
    features = [c for c in range(span) if c != label]
    name = header[label] if header else f"column {label}"
    return ScoringRows(_features(cells, features, header, path), _labels(cells[:, label]), name)


def _named_csv(path: Path, header: list[str], names: list[str], cells: np.ndarray,
               spec: str) -> ScoringRows:
    order = _by_name(header, names, path)
    extra = [i for i, c in enumerate(header) if c not in names]
    if spec:
        label = _label_position(spec, header, len(header), path)
        if header[label] in names:
            raise SiteFileError(f"{path}: label-column={spec!r} is {header[label]!r}, one of the "
                                "model's feature columns")
    else:
        candidates = [i for i in extra if not id_like(header[i], [parse_cell(v) for v in cells[:, i]])]
        if len(candidates) > 1:
            raise SiteFileError(f"{path} has columns {', '.join(header[i] for i in candidates)} "
                                "beyond the model's; name the label column with --label-column "
                                "(the others are left out)")
        label = candidates[0] if candidates else None
    ignored = [header[i] for i in extra if i != label]
    labels = None if label is None else _labels(cells[:, label])
    return ScoringRows(_features(cells, order, header, path), labels,
                       None if label is None else header[label], ignored)


def _encoded(header: list[str], cells: np.ndarray, categories: dict[str, list[str]],
             spec: str, path: Path) -> tuple[list[str], np.ndarray]:
    """The header and cells with each raw category column (not the label) replaced by its
    0/1 columns."""
    try:
        return encode_raw_columns(header, cells, categories, str(path), keep=spec)
    except CategoryError as exc:
        raise SiteFileError(str(exc)) from None


def _by_name(header: list[str], names: list[str], path: Path) -> list[int]:
    missing = [c for c in names if c not in header]
    if missing:
        raise SiteFileError(f"{path} lacks column(s) {', '.join(missing)} that the model takes "
                            f"(columns are matched by name: {', '.join(names)})")
    repeated = sorted({c for c in header if header.count(c) > 1 and c in names})
    if repeated:
        raise SiteFileError(f"{path} names column(s) {', '.join(repeated)} more than once")
    return [header.index(c) for c in names]


def _label_position(spec: str, header: list[str] | None, span: int, path: Path) -> int:
    if not spec:
        return span - 1
    if spec.lstrip("-").isdigit():
        index = int(spec)
        if not -span <= index < span:
            raise SiteFileError(f"{path}: label-column={index} is outside its {span} columns")
        return index % span
    if header is None or spec not in header:
        raise SiteFileError(f"{path}: label-column={spec!r} is not " + (
            f"in the header ({', '.join(header)})" if header else "a column number, and the "
            "file has no header row"))
    return header.index(spec)


def _labels(cells: np.ndarray) -> np.ndarray:
    return np.array([csv_label(str(v)) for v in cells], dtype=str)


def _features(cells: np.ndarray, order: list[int], header: list[str] | None,
              path: Path) -> np.ndarray:
    """The columns ``order`` as float64, a text or empty cell refused with its column."""
    problems = []
    out = np.empty((len(cells), len(order)), dtype=np.float64)
    for j, c in enumerate(order):
        values = [v if isinstance(v, (int, float, np.number)) else parse_cell(str(v))
                  for v in cells[:, c]]
        name = repr(header[c]) if header else f"column {c}"
        text = [v for v in values if isinstance(v, str)]
        if text:
            problems.append(f"{name} holds text ({', '.join(map(repr, dict.fromkeys(text[:3])))})")
            continue
        column = np.asarray(values, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(column))
        if len(bad):
            problems.append(f"{name} is empty, NaN or infinite in {len(bad)} row(s) (first: "
                            f"data row {bad[0] + 1})")
        out[:, j] = column
    if problems:
        raise SiteFileError(f"{path}: " + "; ".join(problems) + "; the model takes finite "
                            "numbers: fill or drop those cells")
    return out
