"""A node keeps what it loaded for the later messages of a run.

Every message of a run (the spaces round, the selection round, the evaluate round, each
refinement step) needs the node's rows as the identity round agreed on them: read,
checked, scaled, mapped (random features: an ``(N, D)`` product). Loading them again for
each message cost 12-16 s of a 2,048-feature run. :class:`NodeDataCache` keeps the
loaded :class:`~gems_fl.data.nodes.NodeData` keyed by everything it depends on: the
data options the message's settings make (:class:`~gems_fl.data.nodes.NodeDataOptions`),
the node's config, the agreement, and the file's size and
modification time (a changed file is read again). Each message gets its own copy of the
arrays (a copy costs milliseconds; a load, seconds), so no caller can change what the
next message reads.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from gems_fl.data.agreement import DataAgreement
from gems_fl.data.nodes import NodeData, NodeDataOptions

#: the most bytes of rows one process keeps (the oldest entries go first)
MAX_BYTES = 2 * 2 ** 30


class NodeDataCache:
    """Loaded node data by what it depends on, least recently used out first."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[str, NodeData] = OrderedDict()

    def get(self, options: NodeDataOptions, node_config: Mapping[str, Any],
            agreement: DataAgreement | None, load: Callable[[], NodeData]) -> NodeData:
        """The node's data: kept from an earlier message with the same key, else
        ``load()``. The caller gets its own copy (arrays included)."""
        key = _key(options, node_config, agreement)
        data = self._entries.get(key)
        if data is None:
            data = load()
            self._entries[key] = data
            self._trim()
        self._entries.move_to_end(key)
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
