"""A site's own data file, read the same way by a node, by ``gems-fl check-data`` and
by the server's ``public-data``.

Formats
-------
``.npz``
    arrays ``x_train``, ``y_train`` and optionally ``x_val``, ``y_val``, ``x_test``,
    ``y_test`` and ``columns`` (the feature names, in ``x``'s order; a public-data file:
    ``x``, ``y`` and optionally ``x_test``, ``y_test``). Labels may be integers or strings.
``.csv``
    ``<stem>.csv`` holds the training rows, ``<stem>_val.csv`` (optional) the validation
    rows and ``<stem>_test.csv`` (optional) a test split; one sample per row, with or
    without a header row. The label sits in the last column unless ``label-column`` names
    another (a 0-based index, negative counts from the end, or a header name). Labels
    may be numbers or text; every other cell must be a number. With a header row the
    feature columns are known by name: a companion file may order them differently
    (it is read in the training file's order), and a run matches sites by column name
    (:func:`align_columns`); without one, by position.

Without validation rows a node splits them off its training rows (:func:`split_validation`:
seeded, stratified; ``val-fraction``). Columns that look like row IDs (:func:`~gems_fl.data.site_columns.id_like`: a
text column whose values differ in every row, or a column named like an ID, ``id``,
``rownames``, ``patient_id``, ..., whose values differ in every row) are left out, and
named, unless ``id-columns`` says otherwise. Columns are numbered from 0 in every message,
as ``label-column`` counts them.

Labels are turned into class *names* (text): ``3`` and ``3.0`` both become ``"3"``.
A run agrees on one class list (:func:`sort_classes`: numerically when every name is an
integer, else alphabetically) and every node maps its names to indices in that list,
so the same name gets the same index everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gems_fl.data.categories import (
    CategoryError,
    agreed_levels,
    base_of,
    complete_columns,
    level_name,
    one_hot,
    parse_categories,
    sort_levels,
)
from gems_fl.data.csv_table import SiteFileError, checked_drop, parses, read_csv_table
from gems_fl.data.site_columns import ID_AUTO, column_difference
from gems_fl.data.site_memory import held_arrays

SPLITS = ("train", "val", "test")
REQUIRED_SPLITS = ("train",)


@dataclass
class SiteFile:
    """The splits of one site file: features (float64) and labels as class names."""

    path: Path
    x: dict[str, np.ndarray] = field(default_factory=dict)
    y: dict[str, np.ndarray] = field(default_factory=dict)  # class names (str arrays)
    columns: list[str] | None = None  # feature column names (a CSV header), in x's order
    dropped: list[str] = field(default_factory=list)  # ID-like columns left out
    val_split: float = 0.0  # the fraction of training rows split off as validation rows
    positions: list[int] | None = None  # a CSV's: each feature's column number in the file
    # after split_validation: each split's rows as data rows of the training file
    source_rows: dict[str, np.ndarray] = field(default_factory=dict)
    # category columns (a CSV's text columns of a few values): each one's values, in the
    # order of its 0/1 columns ``<column>=<value>`` at the end of x
    categories: dict[str, list[str]] = field(default_factory=dict)

    @property
    def labels(self) -> list[str]:
        """Every class name in the file, sorted as a run sorts them."""
        return sort_classes({str(v) for y in self.y.values() for v in y})

    def num_features(self) -> int | None:
        x = self.x.get("train")
        return int(x.shape[1]) if x is not None and x.ndim == 2 else None


def label_names(y: np.ndarray, where: str) -> np.ndarray:
    """Labels as class names: integers (also ``3.0``) as ``"3"``, text stripped.

    Raises :class:`SiteFileError` for non-integer numeric labels or NaN.
    """
    y = np.asarray(y)
    if np.issubdtype(y.dtype, np.character):
        return np.array([str(v).strip() for v in y.astype(str)], dtype=object).astype(str)
    if np.issubdtype(y.dtype, np.object_):
        return np.array([str(v).strip() for v in y], dtype=object).astype(str)
    if np.issubdtype(y.dtype, np.bool_):
        y = y.astype(np.int64)
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise SiteFileError(f"{where} has dtype {y.dtype}; labels must be integers or text")
    if np.issubdtype(y.dtype, np.floating):
        bad = ~np.isfinite(y) | (np.mod(np.where(np.isfinite(y), y, 0), 1) != 0)
        if np.any(bad):
            raise SiteFileError(
                f"{where} holds {int(bad.sum())} label(s) that are not integers or text "
                f"(e.g. {y[bad][0]!r}); labels must be class numbers or class names")
    return np.array([str(int(v)) for v in y]).astype(str) if len(y) else np.array([], dtype=str)


def sort_classes(names) -> list[str]:
    """The run's class order: numeric when every name is an integer, else alphabetical."""
    names = {str(n) for n in names}
    try:
        return sorted(names, key=int)
    except ValueError:
        return sorted(names)


def parse_classes(spec: str) -> list[str] | int | None:
    """``classes`` setting: ``""`` (agreed from the nodes), a count, or names ``a,b,c``."""
    text = str(spec).strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    names = [part.strip() for part in text.split(",")]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"classes={spec!r} must be a count (e.g. 3) or distinct "
                         "comma-separated label names (e.g. 'benign,malignant')")
    return names


def public_data_path(text: str) -> Path | None:
    """The file ``public-data`` names: the path itself when it is a file; else, for a stem
    (``/srv/server`` or ``/srv/server.csv`` without that file), the first that exists of
    ``<stem>.npz``, ``<stem>.csv`` and ``<stem>_test.csv`` (a test split alone). None when
    none exists."""
    path = Path(str(text).strip()).expanduser()
    if path.is_file():
        return path
    stem = path.with_suffix("") if path.suffix.lower() in (".npz", ".csv") else path
    for candidate in (stem.with_name(stem.name + ".npz"), stem.with_name(stem.name + ".csv"),
                      stem.with_name(stem.name + "_test.csv")):
        if candidate.is_file():
            return candidate
    return None


def read_site_file(path: str | Path, label_column: str = "", *,
                   public: bool = False, id_columns: str = ID_AUTO,
                   categories: str = "") -> SiteFile:
    """Read a site file (``.npz`` or ``.csv``); see the module docstring.

    ``public`` reads a server public-data file (splits ``x``/``y`` as "train" and an
    optional test split) instead of a node's; a test split alone (an ``.npz`` with only
    ``x_test``/``y_test``, or a ``<stem>_test.csv``) is a test-only file. ``id_columns``:
    ``auto`` leaves out the columns :func:`~gems_fl.data.site_columns.id_like` finds, ``none`` keeps every column,
    comma-separated header names leave out those besides. ``categories``: the declared
    values of category columns (:func:`~gems_fl.data.categories.parse_categories`); a
    CSV's text column of at most :data:`~gems_fl.data.categories.MAX_LEVELS` values is
    a category column either way, encoded one 0/1 column per value.

    Raises
    ------
    SiteFileError
        The file or a required array/companion file is missing, or cannot be parsed.
        Values (NaN, shapes, classes) are checked by :func:`site_problems`.
    """
    held = held_arrays(path)
    if held is not None:  # a site handed over as arrays (gems_fl.fitting.fit)
        site = _site_of_arrays(Path(str(path)), held, public)
        _drop_npz_ids(site, id_columns)
        return site
    path = Path(str(path)).expanduser()
    if not path.is_file():
        raise SiteFileError(f"{path} does not exist or is not a file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        site = _read_npz(path, public)
        _drop_npz_ids(site, id_columns)
        return site
    if suffix == ".csv":
        try:
            declared = parse_categories(categories)
        except CategoryError as exc:
            raise SiteFileError(str(exc)) from None
        return _read_csv(path, label_column, public, id_columns, declared)
    raise SiteFileError(f"{path}: unknown file type '{suffix}'; use .npz or .csv")


def _npz_keys(public: bool) -> dict[str, tuple[str, str]]:
    if public:
        return {"train": ("x", "y"), "test": ("x_test", "y_test")}
    return {s: (f"x_{s}", f"y_{s}") for s in SPLITS}


def _read_npz(path: Path, public: bool) -> SiteFile:
    try:
        with np.load(path, allow_pickle=False) as f:
            return _site_of_arrays(path, f, public)
    except SiteFileError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise SiteFileError(f"{path} cannot be read as .npz: {exc}") from None


def _site_of_arrays(path: Path, f: Mapping[str, np.ndarray], public: bool) -> SiteFile:
    """A site from the arrays of an ``.npz`` file (or the same arrays held in memory:
    :mod:`gems_fl.data.site_memory`); ``path`` names it in messages."""
    keys = _npz_keys(public)
    required = ("train",) if public else REQUIRED_SPLITS
    site = SiteFile(path)
    files = set(f.keys())
    if public and not {"x", "y"} & files and {"x_test", "y_test"} <= files:
        required = ("test",)  # a test-only public file: the server evaluates on it
    missing = [k for s in required for k in keys[s] if k not in files]
    optional = [k for s in keys if s not in required for k in keys[s]]
    half = [s for s in keys if s not in required and (keys[s][0] in files) != (keys[s][1] in files)]
    missing += [k for s in half for k in keys[s] if k not in files]
    if missing:
        want = ", ".join(k for s in required for k in keys[s])
        raise SiteFileError(
            f"{path} lacks array(s) {', '.join(missing)}; it must hold {want} "
            f"(optional: {', '.join(optional)}; found: {', '.join(sorted(files)) or 'none'})")
    for split, (kx, ky) in keys.items():
        if kx in files:
            site.x[split] = np.asarray(f[kx])
            site.y[split] = label_names(f[ky], f"{path}: {ky}")
    if "columns" in files:
        site.columns = [str(c).strip() for c in np.asarray(f["columns"]).ravel()]
    for split, x in site.x.items():
        if not any(np.issubdtype(x.dtype, t) for t in (np.integer, np.floating, np.bool_)):
            raise SiteFileError(f"{path}: {keys[split][0]} has dtype {x.dtype}; features must be numbers")
        site.x[split] = x.astype(np.float64)
    width = site.num_features()
    if site.columns is not None and width is not None and len(site.columns) != width:
        raise SiteFileError(f"{path}: columns names {len(site.columns)} features, x_train has "
                            f"{width}; give one name per column of x")
    return site


def _drop_npz_ids(site: SiteFile, spec: str) -> None:
    """Leave out an ``.npz`` file's ID-like columns (see :func:`~gems_fl.data.site_columns.id_like`)."""
    x = site.x.get("train")
    if x is None or x.ndim != 2:
        return
    drop = checked_drop(spec, site.columns, x.shape[1], site.path,
                            lambda c: list(np.concatenate([v[:, c] for v in site.x.values()
                                                           if v.ndim == 2])))
    if not drop:
        return
    keep = [c for c in range(x.shape[1]) if c not in drop]
    site.x = {split: v[:, keep] if v.ndim == 2 else v for split, v in site.x.items()}
    site.dropped = [site.columns[c] if site.columns else f"column {c}" for c in drop]
    if site.columns is not None:
        site.columns = [site.columns[c] for c in keep]


def _companions(path: Path, public: bool) -> dict[str, tuple[Path, bool]]:
    stem = path.stem
    if public and stem.endswith("_test"):  # a test-only public file: the server evaluates on it
        return {"test": (path, True)}
    if public:
        return {"train": (path, True), "test": (path.with_name(f"{stem}_test.csv"), False)}
    return {"train": (path, True), "val": (path.with_name(f"{stem}_val.csv"), False),
            "test": (path.with_name(f"{stem}_test.csv"), False)}


def _read_csv(path: Path, label_column: str, public: bool, id_columns: str = ID_AUTO,
              declared: dict[str, list[str]] | None = None) -> SiteFile:
    site = SiteFile(path)
    drop: list[str] | None = None  # the training file's ID columns: the companions' too
    text: dict[str, dict[str, tuple[int, list[str]]]] = {}  # per split: category columns
    for split, (p, required) in _companions(path, public).items():
        if not p.is_file():
            if required:
                raise SiteFileError(
                    f"{path} is a CSV training file, so its {split} data must lie next to it as "
                    f"{p}; it does not exist")
            continue
        x, y, columns, dropped, positions = read_csv_table(p, label_column, id_columns, drop,
                                                           declared, text.setdefault(split, {}))
        if drop is None:
            drop = site.dropped = dropped
            site.positions = positions
        elif set(text[split]) != set(text[next(iter(text))]):
            raise SiteFileError(f"{p}: its category column(s) ({', '.join(sorted(text[split])) or 'none'})"
                                f" differ from the training file's "
                                f"({', '.join(sorted(text[next(iter(text))])) or 'none'})")
        if site.x and site.columns is not None and columns is not None:
            problem = column_difference(columns, site.columns, "the training file")
            if problem:
                raise SiteFileError(f"{p}: {problem}")
            x = x[:, [columns.index(c) for c in site.columns]]
        elif not site.x:
            site.columns = columns
        site.x[split], site.y[split] = x, y
    if any(text.values()):
        _encode_categories(site, text, declared or {})
    return site


def _encode_categories(site: SiteFile, text: dict[str, dict[str, tuple[int, list[str]]]],
                       declared: dict[str, list[str]]) -> None:
    """Append each category column's 0/1 columns to every split, with the declared values
    or, undeclared, the values the file holds (the run completes them with the others')."""
    first = next(iter(text.values()))
    bases = sorted(first)
    for base in bases:
        site.categories[base] = declared.get(base) or sort_levels(
            v for cells in text.values() for v in cells[base][1])
    try:
        for split, cells in text.items():
            site.x[split] = np.hstack([site.x[split]] + [
                one_hot(cells[base][1], site.categories[base], base, f"{site.path}")
                for base in bases])
    except CategoryError as exc:
        raise SiteFileError(str(exc)) from None
    site.columns = (site.columns or []) + [level_name(b, v) for b in bases
                                           for v in site.categories[b]]
    if site.positions is not None:
        site.positions = site.positions + [first[b][0] for b in bases
                                           for _ in site.categories[b]]


def complete_categories(sites: list[SiteFile]) -> dict[str, list[str]]:
    """Give every site every value any of them holds in its category columns (columns of
    zeros where it lacks one), in place, as a run's identity round does; returns the
    values per category column."""
    levels = agreed_levels((s.columns or [], list(s.categories)) for s in sites)
    for site in sites:
        if not site.categories or site.columns is None:
            continue
        names, source = complete_columns(site.columns, list(site.categories), levels)
        site.x = {split: np.column_stack([np.zeros(len(x)) if i is None else x[:, i]
                                          for i in source]) for split, x in site.x.items()}
        if site.positions is not None:
            first = {b: site.positions[site.columns.index(level_name(b, site.categories[b][0]))]
                     for b in site.categories}
            site.positions = [site.positions[i] if i is not None else
                              first[base_of(n, site.categories)] for n, i in zip(names, source)]
        site.columns = names
        site.categories = {b: levels[b] for b in site.categories}
    return levels


def align_columns(site: SiteFile, columns: list[str] | None, other: str = "the run") -> str:
    """Put ``site``'s features in the order of ``columns`` (the run's, by name), in place.

    Nothing to do (``""``) when either side has no column names (matched by position).
    Returns why the names cannot be matched, or ``""``.
    """
    if columns is None or site.columns is None or site.columns == list(columns):
        return ""
    unknown = [c for c in site.columns if base_of(c, site.categories) and c not in columns]
    if unknown:
        return (f"holds category value(s) {', '.join(unknown)} that {other} does not have "
                "(no site holds them)")
    # the values of its category columns that only other sites hold: columns of zeros
    zeros = [c for c in columns if c not in site.columns and base_of(c, site.categories)]
    if zeros:
        site.x = {split: np.hstack([x, np.zeros((len(x), len(zeros)))])
                  for split, x in site.x.items()}
        if site.positions is not None:
            site.positions = site.positions + [
                site.positions[next(i for i, c in enumerate(site.columns)
                                    if base_of(c, site.categories) == base_of(z, site.categories))]
                for z in zeros]
        site.columns = site.columns + zeros
    problem = column_difference(site.columns, list(columns), other)
    if problem:
        return problem
    order = [site.columns.index(c) for c in columns]
    site.x = {split: x[:, order] for split, x in site.x.items()}
    site.columns = list(columns)
    if site.positions is not None:
        site.positions = [site.positions[i] for i in order]
    return ""


def column_name(site: SiteFile, c: int) -> str:
    """How messages name feature ``c``: its header name and its column number in the file,
    counted from 0 as ``label-column`` counts."""
    number = site.positions[c] if site.positions is not None else c
    return f"{site.columns[c]!r} (column {number})" if site.columns else f"column {number}"


def site_problems(site: SiteFile, num_features: int | None = None,
                  classes: list[str] | None = None, run: str = "the run") -> list[str]:
    """What a run would reject about this file, one line per problem (empty: fine).

    Checks 2-D features, one label per row, non-empty train/val splits, the same
    feature count in every split, finite values, and (when given) the run's number of
    features and class names.
    """
    problems = []
    widths = set()
    for split in SPLITS:
        if split not in site.x:
            continue
        x, y = site.x[split], site.y[split]
        if x.ndim != 2:
            problems.append(f"x_{split} has shape {x.shape}; expected a 2-D array (samples x features)")
            continue
        widths.add(x.shape[1])
        if y.ndim != 1 or len(y) != len(x):
            problems.append(f"y_{split} has shape {y.shape}; expected ({len(x)},), one label per "
                            f"row of x_{split}")
        if len(x) == 0:
            problems.append(f"the {split} split is empty")
        problems.extend(_non_finite(site, split))
        if num_features is not None and x.shape[1] != num_features:
            problems.append(f"x_{split} has {x.shape[1]} features but {run} has {num_features}")
        if classes is not None and y.ndim == 1:
            problems.extend(_unknown_labels(y, split, classes, run))
    if len(widths) > 1:
        problems.append(f"the splits have different feature counts ({', '.join(map(str, sorted(widths)))})")
    return problems


def _non_finite(site: SiteFile, split: str) -> list[str]:
    """Where ``split``'s features hold NaN or infinite values, named by row and column."""
    x = site.x[split]
    bad = ~np.isfinite(x)
    if not bad.any():
        return []
    rows = np.flatnonzero(bad.any(axis=1))
    columns = np.flatnonzero(bad.any(axis=0))
    nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    named = ", ".join(column_name(site, int(c)) for c in columns[:5])
    first = int(rows[0])
    where = "" if split not in site.source_rows else " of the training file"
    first = int(site.source_rows[split][first]) if where else first
    return [f"x_{split} holds {nan} NaN and {inf} infinite value(s) in "
            f"{len(rows)} row(s) (first: data row {first + 1}{where}, counted "
            f"from 1) and {len(columns)} column(s): {named}"
            f"{', ...' if len(columns) > 5 else ''} (counted from 0, as "
            "label-column counts); features must be finite numbers: fill or "
            "drop those cells"]


def _unknown_labels(y: np.ndarray, split: str, classes: list[str], run: str) -> list[str]:
    """Labels of ``split`` outside the run's classes (numbered classes: the range held)."""
    unknown = sort_classes(set(y.tolist()) - set(classes))
    numbered = classes == [str(i) for i in range(len(classes))]
    if unknown and numbered and all(parses(v, int) for v in unknown):
        values = [int(v) for v in y]
        return [f"y_{split} has labels in [{min(values)}, {max(values)}] but {run} has "
                f"{len(classes)} classes (labels 0..{len(classes) - 1})"]
    if unknown:
        return [f"y_{split} holds label(s) {', '.join(unknown)} that are not among "
                f"the classes of {run} ({', '.join(classes)})"]
    return []


def class_counts(site: SiteFile) -> dict[str, dict[str, int]]:
    """Per split, how many rows each class name has."""
    out = {}
    for split, y in site.y.items():
        names, counts = np.unique(y, return_counts=True) if len(y) else ([], [])
        order = sort_classes(names)
        lookup = dict(zip(map(str, names), map(int, counts)))
        out[split] = {n: lookup[n] for n in order}
    return out


def encode_labels(y: np.ndarray, classes: list[str]) -> np.ndarray:
    """Class names -> indices in ``classes`` (every name must be listed)."""
    index = {name: i for i, name in enumerate(classes)}
    return np.array([index[str(v)] for v in y], dtype=np.int64)


def split_validation(site: SiteFile, fraction: float, seed: int) -> bool:
    """Split validation rows off a site's training rows when it has none, in place:
    per class a seeded ``fraction`` of its rows (rounded; a class keeps at least one
    training row), so the validation rows hold the classes as the training rows do.
    Returns whether it split (``site.val_split`` records the fraction)."""
    if "val" in site.x or "train" not in site.x:
        return False
    y = site.y["train"]
    if not 0.0 < fraction < 1.0:
        raise SiteFileError(f"{site.path} has no validation rows and val-fraction={fraction} "
                            "splits none off; give validation rows or a val-fraction in (0, 1)")
    rng = np.random.default_rng(seed)
    val = []
    for name in sort_classes(set(y.tolist())):
        rows = rng.permutation(np.flatnonzero(y == name))
        take = min(int(round(fraction * len(rows))), len(rows) - 1)
        val.extend(rows[:take].tolist())
    if not val:
        raise SiteFileError(f"{site.path} has no validation rows and too few training rows "
                            f"({len(y)}) to split val-fraction={fraction} off; give validation rows")
    val = np.sort(np.asarray(val, dtype=np.int64))
    train = np.setdiff1d(np.arange(len(y)), val)
    x = site.x["train"]
    site.x["train"], site.x["val"] = x[train], x[val]
    site.y["train"], site.y["val"] = y[train], y[val]
    site.source_rows = {"train": train, "val": val}
    site.val_split = float(fraction)
    return True


def split_off_test(x: np.ndarray, y: np.ndarray, fraction: float, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_rest, y_rest, x_test, y_test)``: a seeded random ``fraction`` of the rows."""
    n = len(y)
    n_test = int(round(fraction * n))
    if not 0 < n_test < n:
        raise ValueError(f"test-fraction={fraction} of {n} training rows leaves an empty split")
    order = np.random.default_rng(seed).permutation(n)
    test, rest = np.sort(order[:n_test]), np.sort(order[n_test:])
    return x[rest], y[rest], x[test], y[test]


def feature_stats(x: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    """``(count, per-feature sum, per-feature sum of squares)`` (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return int(len(x)), x.sum(axis=0), np.square(x).sum(axis=0)


def pooled_moments(stats: list[tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and variance of the pooled rows, from each part's sums only."""
    n = sum(s[0] for s in stats)
    total = np.sum([s[1] for s in stats], axis=0)  # in the given order: the caller fixes it
    squares = np.sum([s[2] for s in stats], axis=0)
    mean = total / n
    return mean, np.maximum(squares / n - mean ** 2, 0.0)


def combine_stats(stats: list[tuple[int, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the pooled rows, from each part's sums only.

    A feature with no spread gets std 1 (it is only centred).
    """
    mean, var = pooled_moments(stats)
    std = np.sqrt(var)
    std[std < 1e-12 * np.maximum(1.0, np.abs(mean))] = 1.0
    return mean, std
