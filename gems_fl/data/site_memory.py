"""Sites whose rows are arrays in this process, read as their ``.npz`` file would be.

:func:`gems_fl.fitting.fit` runs the protocol in process on arrays it was handed. A node
names its data by ``data-path``; :func:`held_sites` registers each site's arrays for the
length of one fit under a name of its own (``memory:<token>/<site>``), which the fit
passes as the site's ``data-path``. :func:`gems_fl.data.site_files.read_site_file` reads a
registered name from memory through the same code as an ``.npz`` file's arrays, so a
site given as arrays and the same arrays saved with ``np.savez`` give the same model,
bit for bit, and nothing is written to disk.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np

__all__ = ["PREFIX", "held_arrays", "held_sites", "site_arrays"]

PREFIX = "memory:"
_HELD: dict[str, dict[str, np.ndarray]] = {}


def site_arrays(data: Mapping[str, object]) -> dict[str, np.ndarray]:
    """A site's arrays as ``np.savez`` would store them: each value through
    ``np.asarray``, text held as Python objects turned into a string array, and
    ``columns`` as strings. Keys that are ``None`` are left out."""
    arrays: dict[str, np.ndarray] = {}
    for key, value in data.items():
        if value is None:
            continue
        array = np.asarray(value, dtype=str) if key == "columns" else np.asarray(value)
        arrays[key] = array.astype(str) if np.issubdtype(array.dtype, np.object_) else array
    return arrays


@contextmanager
def held_sites(sites: Mapping[str, Mapping[str, object]]) -> Iterator[list[str]]:
    """Register each site's arrays (:func:`site_arrays`) while the block runs; yields one
    ``data-path`` per site, in the order of ``sites`` (its last part is the site's name,
    which a node takes as its own)."""
    token = uuid.uuid4().hex[:12]
    paths = [f"{PREFIX}{token}/{name}" for name in sites]
    for path, data in zip(paths, sites.values(), strict=True):
        _HELD[path] = site_arrays(data)
    try:
        yield paths
    finally:
        for path in paths:
            _HELD.pop(path, None)


def held_arrays(path: object) -> dict[str, np.ndarray] | None:
    """The arrays registered under ``path``, or None where it names no held site."""
    text = str(path)
    return _HELD.get(text) if text.startswith(PREFIX) else None
