"""One table, simulated sites: a user's CSV cut into N site files by a label division,
seeded, to rehearse a federation before a consortium exists (``gems-fl split``, and
``gems-fl run --table``).

A stratified, seeded share of the rows is held out first as ``test.csv`` (to score the
run's model with ``gems-fl predict``); the rest is divided among the sites by the same
label divisions the bundled datasets take (``dirichlet:ALPHA``, ``iid``,
``classes-per-node:N``, explicit groups). The site files keep the table's header and raw
cells (ID and category columns included), so ``gems-fl check-data``, ``gems-fl run
--site`` and a later deployment read them as any site's own file.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gems_fl.data.csv_table import SiteFileError, csv_label, csv_rows, header_and_label
from gems_fl.data.dirichlet import DirichletDivision, dirichlet_shares
from gems_fl.data.partition import parse_division, partition_indices
from gems_fl.data.site_files import sort_classes

TEST_FILE = "test.csv"


@dataclass
class TableSplit:
    """What :func:`split_table` wrote: each site's file and class counts, the test file."""

    sites: list[Path]
    counts: list[dict[str, int]]  # per site: rows per class name
    classes: list[str]
    test: Path | None = None
    test_rows: int = 0
    notes: list[str] = field(default_factory=list)


def split_table(path: str | Path, num_sites: int, out_dir: str | Path, *,
                division: str = "dirichlet:0.5", seed: int = 0, test_fraction: float = 0.2,
                label_column: str = "") -> TableSplit:
    """Write ``out_dir/site-0.csv`` ... and ``out_dir/test.csv`` from the CSV ``path``.

    Raises :class:`~gems_fl.data.site_files.SiteFileError` (a ``ValueError``) naming the
    problem: an unreadable table, a division that does not fit, a site left empty.
    """
    path = Path(path).expanduser()
    if path.suffix.lower() != ".csv" or not path.is_file():
        raise SiteFileError(f"{path}: give an existing .csv table (one row per sample)")
    if num_sites < 1:
        raise SiteFileError(f"--sites {num_sites}: give at least one site")
    if not 0.0 <= test_fraction < 1.0:
        raise SiteFileError(f"test-fraction={test_fraction} must be in [0, 1)")
    rows = csv_rows(path)
    if not rows:
        raise SiteFileError(f"{path} holds no rows")
    header, label = header_and_label(rows, label_column, path)
    body = rows[1:] if header is not None else rows
    names = np.array([csv_label(r[label]) if len(r) > label else "" for r in body])
    classes = sort_classes(set(names.tolist()))
    index = {c: i for i, c in enumerate(classes)}
    y = np.array([index[n] for n in names], dtype=np.int64)
    rest, test = _hold_out(y, test_fraction, seed)
    try:
        spec = parse_division(division, num_sites, len(classes))
    except ValueError as exc:
        raise SiteFileError(str(exc)) from None
    shares = _divide(y[rest], spec, seed)
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    split = TableSplit([], [], classes)
    for k, share in enumerate(shares):
        if not len(share):
            raise SiteFileError(f"label-division {division!r} leaves site {k} without rows; "
                                "give fewer sites or another division")
        rows_k = rest[share]
        split.sites.append(_write(out / f"site-{k}.csv", header, [body[i] for i in rows_k]))
        held = names[rows_k]
        split.counts.append({c: int((held == c).sum()) for c in classes if (held == c).any()})
    if len(test):
        split.test = _write(out / TEST_FILE, header, [body[i] for i in test])
        split.test_rows = len(test)
    unused = len(rest) - sum(len(s) for s in shares)
    if unused:
        split.notes.append(f"{unused} row(s) of classes no site holds under {division!r} "
                           "are in no file")
    return split


def _hold_out(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, test)`` row numbers: per class a seeded ``fraction`` held out (a class
    keeps at least one row for the sites)."""
    rng = np.random.default_rng([int(seed), 0x7E57])
    test = []
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        test.extend(rows[:min(int(round(fraction * len(rows))), len(rows) - 1)].tolist())
    test = np.sort(np.asarray(test, dtype=np.int64))
    return np.setdiff1d(np.arange(len(y)), test), test


def _divide(y: np.ndarray, spec, seed: int) -> list[np.ndarray]:
    """Each site's rows (positions in ``y``) under the parsed division."""
    if isinstance(spec, DirichletDivision):
        # the draw shares a training and a validation pool; a table has one pool
        shares = dirichlet_shares(y, np.zeros(0, dtype=np.int64), spec, seed)
        return [np.sort(np.concatenate([tr, va])) for tr, va in shares]
    return partition_indices(y, spec, seed)


def _write(path: Path, header: list[str] | None, rows: list[list[str]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)
    return path
