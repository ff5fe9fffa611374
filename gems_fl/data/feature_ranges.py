"""Feature ranges the operator declares (``feature-ranges``): a scaling known without the
sites' rows, so it spends no privacy.

Federated standardisation needs each site's exact per-feature sums, which a
differentially private run cannot send unnoised. An operator usually knows what range each
feature takes (a lab value's reporting range, a sensor's span, a documented minimum and
maximum). The server reads them from a CSV file with a header ``feature,min,max`` and one
row per feature, named as in the sites' headers (or numbered from 0 for files without a
header), and every site maps ``[min, max]`` to ``[-1, 1]``: ``(x - centre) / half_width``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEADER = ("feature", "min", "max")


class FeatureRangesError(ValueError):
    """The ``feature-ranges`` file is unreadable or does not fit the sites' features."""


@dataclass(frozen=True)
class FeatureRanges:
    """Declared ``[low, high]`` per feature, by name (or by 0-based position)."""

    path: str
    names: tuple[str, ...]
    low: np.ndarray
    high: np.ndarray

    @property
    def by_position(self) -> bool:
        return all(name.isdigit() for name in self.names)

    def scaling(self, columns: list[str] | None, num_features: int) -> tuple[np.ndarray, np.ndarray]:
        """``(centre, half_width)`` per feature in the run's order: by name when the sites'
        files have headers (``columns``), else by position. A constant feature
        (``min == max``) gets half-width 1, as standardisation treats a zero std."""
        index = {name: k for k, name in enumerate(self.names)}
        if columns is not None and not self.by_position:
            lacking = [c for c in columns if c not in index]
            if lacking:
                raise FeatureRangesError(
                    f"feature-ranges {self.path} has no row for the sites' column(s) "
                    f"{', '.join(lacking[:10])}{' ...' if len(lacking) > 10 else ''}; add a "
                    "'feature,min,max' row for each")
            order = [index[c] for c in columns]
        else:
            wanted = [str(k) for k in range(num_features)]
            lacking = [w for w in wanted if w not in index]
            if lacking or len(self.names) != num_features:
                raise FeatureRangesError(
                    f"feature-ranges {self.path} has {len(self.names)} row(s) for "
                    f"{num_features} features; without headers in the sites' files, give one "
                    f"row per feature, numbered 0 to {num_features - 1}"
                    + ("" if columns is None else ", or name the rows as the sites' columns"))
            order = [index[w] for w in wanted]
        low, high = self.low[order], self.high[order]
        half = (high - low) / 2.0
        return (low + high) / 2.0, np.where(half > 0, half, 1.0)


def read_feature_ranges(path: str | Path) -> FeatureRanges:
    """Read a ``feature,min,max`` CSV file; :class:`FeatureRangesError` says what is wrong."""
    path = Path(path).expanduser()
    try:
        with path.open(newline="") as handle:
            rows = [row for row in csv.reader(handle) if any(cell.strip() for cell in row)]
    except OSError as exc:
        raise FeatureRangesError(f"feature-ranges {path}: cannot read it ({exc.strerror})") from None
    if not rows or tuple(c.strip().lower() for c in rows[0]) != HEADER:
        raise FeatureRangesError(f"feature-ranges {path}: the first line must be the header "
                                 "'feature,min,max'")
    names, low, high = [], [], []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != 3:
            raise FeatureRangesError(f"feature-ranges {path}, line {line}: expected 3 values "
                                     f"(feature,min,max), found {len(row)}")
        name = row[0].strip()
        try:
            lo, hi = float(row[1]), float(row[2])
        except ValueError:
            raise FeatureRangesError(f"feature-ranges {path}, line {line}: min and max must be "
                                     f"numbers, found {row[1]!r} and {row[2]!r}") from None
        if not (np.isfinite(lo) and np.isfinite(hi)) or hi < lo:
            raise FeatureRangesError(f"feature-ranges {path}, line {line} ({name}): need finite "
                                     f"min <= max, found {lo:g} and {hi:g}")
        if name in names:
            raise FeatureRangesError(f"feature-ranges {path}, line {line}: feature {name!r} "
                                     "is named twice")
        names.append(name)
        low.append(lo)
        high.append(hi)
    if not names:
        raise FeatureRangesError(f"feature-ranges {path}: no feature rows below the header")
    return FeatureRanges(str(path), tuple(names), np.asarray(low), np.asarray(high))
