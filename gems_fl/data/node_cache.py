"""A node keeps what it loaded for the later messages of a run.

Every message of a run (the spaces round, the selection round, the evaluate round, each
refinement step) needs the node's rows as the identity round agreed on them: read,
checked, scaled, mapped (random features: an ``(N, D)`` product). Loading them again for
each message cost 12-16 s of a 2,048-feature run. :class:`NodeDataCache` keeps the
loaded :class:`~gems_fl.data.nodes.NodeData` keyed by everything it depends on: the
data options the message's settings make (:class:`~gems_fl.data.nodes.NodeDataOptions`),
the node's config, the agreement, and the file's size and
modification time (a changed file is read again). Each message gets arrays of its own,
so no caller can change what the next message reads.

Given a ``folder`` (the node's own, :class:`~gems_fl.protocol.node_store.NodeStore`),
what a node loaded is written there and read back for each later message, and memory
keeps none of it: a simulation's ClientApp process serves every node in turn, and rows
kept in memory for the next message stayed there while the process worked on other
nodes (100 kernel nodes' mapped rows, about 10 MB each, held 1 GB in each process before
memory was bounded; a 5-site kernel node's, about 183 MB, twice over with the message's
copy). Reading a node's file back takes milliseconds to a fraction of a second where
mapping its rows again takes seconds; another process serving the same node reads the
same file. Without a folder (a node marked memory-only, or a disk that refused the file)
a process keeps at most :data:`MAX_BYTES` of rows in memory and hands out copies.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
import zipfile
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from gems_fl.data.agreement import DataAgreement
from gems_fl.data.nodes import NodeData, NodeDataOptions

logger = logging.getLogger(__name__)

#: the most bytes of rows one process keeps in memory (the oldest entries go first)
MAX_BYTES = 256 * 2 ** 20
_ARRAY_FIELDS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


class NodeDataCache:
    """Loaded node data by what it depends on, least recently used out first."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[str, NodeData] = OrderedDict()

    def get(self, options: NodeDataOptions, node_config: Mapping[str, Any],
            agreement: DataAgreement | None, load: Callable[[], NodeData],
            folder: Path | None = None) -> NodeData:
        """The node's data: kept from an earlier message with the same key (in ``folder``,
        else in memory), else ``load()`` (and written to ``folder``). The caller gets
        arrays no one else holds: read from the file, or a copy of memory's."""
        key = _key(options, node_config, agreement)
        if key in self._entries:  # no folder, or one that refused the file
            self._entries.move_to_end(key)
            return _copy(self._entries[key])
        file = None if folder is None else Path(folder) / f"data-{_digest(key)}.npz"
        data = _read(file) if file is not None and file.is_file() else None
        if data is not None:
            return data
        data = load()
        if file is not None:
            try:
                _write(file, data)
                return data
            except OSError as exc:  # a full or read-only disk: memory alone
                logger.warning("node data not kept in %s (%s): kept in memory instead",
                               file, exc)
        self._entries[key] = data
        self._trim()
        return _copy(data)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)

    def _trim(self) -> None:
        while len(self._entries) > 1 and sum(map(_bytes, self._entries.values())) > self.max_bytes:
            self._entries.popitem(last=False)


def _key(options: NodeDataOptions, node_config: Mapping[str, Any],
         agreement: DataAgreement | None) -> str:
    path = str(node_config.get("data-path", "")).strip()
    stamps = []
    if path:
        file = Path(path).expanduser()
        for candidate in (file, *sorted(file.parent.glob(f"{file.stem}_*{file.suffix}"))):
            if candidate.is_file():
                stat = candidate.stat()
                stamps.append([str(candidate), stat.st_size, stat.st_mtime_ns])
    agreed = None if agreement is None else {  # the kernel map's landmarks by their hash
        k: hashlib.sha256(v).hexdigest() if isinstance(v, bytes) else v
        for k, v in agreement.to_config().items()}
    return json.dumps([asdict(options), dict(node_config), agreed, stamps],
                      sort_keys=True, default=str)


def _copy(data: NodeData) -> NodeData:
    arrays = {f.name: getattr(data, f.name).copy() for f in fields(data)
              if isinstance(getattr(data, f.name), np.ndarray)}
    return replace(data, **arrays)


def _bytes(data: NodeData) -> int:
    return sum(getattr(data, f.name).nbytes for f in fields(data)
               if isinstance(getattr(data, f.name), np.ndarray))


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def _write(file: Path, data: NodeData) -> None:
    """``data`` in ``file``: its arrays, and its other fields as JSON (no pickle: the
    folder may be one other users can write to)."""
    arrays = {name: getattr(data, name) for name in _ARRAY_FIELDS
              if getattr(data, name) is not None}
    if data.scale is not None:
        arrays["scale_mean"], arrays["scale_std"] = data.scale
    meta = {f.name: getattr(data, f.name) for f in fields(data)
            if f.name not in _ARRAY_FIELDS and f.name != "scale"}
    arrays["meta"] = np.frombuffer(json.dumps(meta, default=_plain).encode(), dtype=np.uint8)
    file.parent.mkdir(parents=True, exist_ok=True)
    part = file.with_name(f"{file.stem}-{uuid.uuid4().hex[:8]}.part")
    with part.open("wb") as f:
        np.savez(f, **arrays)
    os.replace(part, file)  # whole or not at all, for a process reading it


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python number JSON writes."""
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not kept in a node's data file")


def _read(file: Path) -> NodeData | None:
    """What :func:`_write` wrote, or None where the file cannot be read (loaded again)."""
    try:
        with np.load(file, allow_pickle=False) as saved:
            arrays = {name: saved[name] for name in saved.files}
        meta = json.loads(arrays.pop("meta").tobytes())
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    scale = ((arrays.pop("scale_mean"), arrays.pop("scale_std")) if "scale_mean" in arrays
             else None)
    return NodeData(**meta, **arrays, scale=scale)
