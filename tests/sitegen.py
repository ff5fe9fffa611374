"""Generated site files for the own-data tests: 13 features, 3 string-labelled classes."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

CLASSES = ("adelie", "chinstrap", "gentoo")


def blobs(n: int, num_features: int, seed: int, shift: float = 0.0):
    """``n`` rows of 3 separable classes, features on very different scales."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, len(CLASSES), n)
    centers = np.random.default_rng(123).normal(0, 3, (len(CLASSES), num_features))
    x = centers[y] + rng.normal(0, 1, (n, num_features)) + shift
    x = x * np.geomspace(0.1, 100, num_features) + np.arange(num_features)  # unscaled
    return x, np.array(CLASSES)[y]


def write_csv(path: Path, x, y, header: bool = True, order=None, names=None) -> Path:
    """One CSV file; ``order``: the feature columns' order in the file (a permutation),
    ``names``: the feature columns' names (default ``f0, f1, ...``)."""
    names = list(names) if names is not None else [f"f{i}" for i in range(x.shape[1])]
    order = list(order) if order is not None else list(range(x.shape[1]))
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow([names[i] for i in order] + ["species"])
        for row, label in zip(x, y):
            w.writerow([repr(float(row[i])) for i in order] + [label])
    return path


def write_csv_site(folder: Path, name: str, seed: int, num_features: int = 13,
                   n: int = 240, header: bool = True, test: bool = True,
                   order=None, names=None) -> Path:
    """``<name>.csv``, ``<name>_val.csv`` (and ``<name>_test.csv``)."""
    folder.mkdir(parents=True, exist_ok=True)
    x, y = blobs(n, num_features, seed, shift=0.2 * seed)
    a, b = int(0.6 * n), int(0.8 * n)
    path = write_csv(folder / f"{name}.csv", x[:a], y[:a], header, order, names)
    write_csv(folder / f"{name}_val.csv", x[a:b], y[a:b], header, order, names)
    if test:
        write_csv(folder / f"{name}_test.csv", x[b:], y[b:], header, order, names)
    return path


def site_config(folder: Path, name: str, seed: int, **kwargs) -> dict:
    """A SuperNode's node config for a CSV site written by :func:`write_csv_site`."""
    return {"data-path": str(write_csv_site(folder, name, seed=seed, **kwargs)), "node-name": name}
