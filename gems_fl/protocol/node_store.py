"""What a node keeps between the messages of a run: small arrays in Flower's node state,
large ones in a file on the node's own disk.

Flower keeps a node's ``Context.state`` where the node's messages are handled; in a
simulation that is the simulation's process, for every node at once, and the state
travels to the ClientApp actor and back with each message. A kernel node keeps its
landmarks (about 11 MB on Fashion-MNIST) and the factor of its Gram matrix (about 14 MB)
for the later rounds: 100 simulated nodes held 2.5 GB of them in the server's process.
:class:`NodeStore` keeps arrays above :data:`SPILL_BYTES` in a file of the node's own
(under ``GEMS_FL_NODE_STORE``, else the system's temporary folder; folders readable by
the user alone, since a node's rows are written there too) and only the file's
path and digest in the state; smaller ones stay in the state as before. A file is read
back whole and checked against its digest, so a node whose file was removed or changed
says so instead of answering from other data. A node removes its files after its last
round (:meth:`NodeStore.forget`); folders a crashed run left behind are removed a week
later by the next run on that machine. A node whose context is marked
:meth:`NodeStore.in_memory_only` (an in-process fit on arrays, which writes no files)
keeps everything in its state.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context

from gems_fl.protocol.wire import array_record

__all__ = ["ENV_VAR", "SPILL_BYTES", "NodeStore"]

logger = logging.getLogger(__name__)

#: arrays of more bytes than this go to a file (the logistic model's state stays in Flower's)
SPILL_BYTES = 1 << 20
#: the folder for the files (default: the system's temporary folder)
ENV_VAR = "GEMS_FL_NODE_STORE"
#: a run's folder not touched for this long is a crashed run's, removed by the next run
STALE_AFTER_S = 7 * 24 * 3600

_FILE_KEY, _DIGEST_KEY = "kept-in-file", "sha256"
_FOLDER_KEY = "gems-node-folder"
_MEMORY_KEY = "gems-node-in-memory"


def _base() -> Path:
    value = os.environ.get(ENV_VAR, "").strip()
    if value:
        return Path(value).expanduser()
    user = os.getuid() if hasattr(os, "getuid") else os.getlogin()
    return Path(tempfile.gettempdir()) / f"gems-fl-node-store-{user}"


def _digest(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class NodeStore:
    """The arrays one node keeps in one run, by key: :meth:`keep`, :meth:`kept`,
    :meth:`drop`, :meth:`forget`."""

    def __init__(self, context: Context) -> None:
        self._state = context.state
        self._run_folder = _base() / f"run-{context.run_id}"
        self._node_id = context.node_id

    @staticmethod
    def in_memory_only(context: Context) -> None:
        """Mark ``context``'s node to keep every array in its state, none in a file (and
        its loaded rows in memory alone: :attr:`disk`)."""
        context.state.config_records[_MEMORY_KEY] = ConfigRecord({_MEMORY_KEY: True})

    @property
    def disk(self) -> bool:
        """Whether this node may keep files (not marked :meth:`in_memory_only`)."""
        return _MEMORY_KEY not in self._state.config_records

    @property
    def folder(self) -> Path:
        """This node's folder in this run, named once and kept in its state (two runs in
        process of the same run id, or the same node id, get folders of their own)."""
        record = self._state.config_records.get(_FOLDER_KEY)
        if record is None:
            name = f"node-{self._node_id}-{uuid.uuid4().hex[:12]}"
            record = self._state.config_records[_FOLDER_KEY] = ConfigRecord(
                {_FILE_KEY: str(self._run_folder / name)})
        return Path(str(record[_FILE_KEY]))

    def keep(self, key: str, arrays: Mapping[str, np.ndarray]) -> None:
        """Keep ``arrays`` under ``key`` (replacing what was kept there)."""
        arrays = {name: np.asarray(value) for name, value in arrays.items()}
        self.drop(key)
        if self.disk and sum(a.nbytes for a in arrays.values()) > SPILL_BYTES:
            try:
                path = self.made() / f"{key}-{uuid.uuid4().hex[:12]}.npz"
                part = path.with_suffix(".part")
                with part.open("wb") as f:
                    np.savez(f, **arrays)
                os.replace(part, path)
            except OSError as exc:  # a full or read-only disk: Flower's state holds it
                logger.warning("node %s: '%s' kept in memory, not in %s (%s); set %s to a "
                               "writable folder", self._node_id, key, self.folder, exc, ENV_VAR)
            else:
                self._state.config_records[key] = ConfigRecord(
                    {_FILE_KEY: str(path), _DIGEST_KEY: _digest(path)})
                return
        self._state.array_records[key] = array_record(arrays)

    def kept(self, key: str) -> dict[str, np.ndarray] | None:
        """What was kept under ``key``, or None where nothing was. Raises ``ValueError``
        where it was kept in a file that is gone or changed."""
        if key in self._state.array_records:
            record = self._state.array_records[key]
            return {name: record[name].numpy() for name in record.keys()}
        if key not in self._state.config_records:
            return None
        record = self._state.config_records[key]
        path = Path(str(record[_FILE_KEY]))
        if not path.is_file():
            raise ValueError(f"this node kept '{key}' in {path}, which is gone (was the "
                             f"temporary folder cleaned during the run? set {ENV_VAR} to "
                             "a folder that lasts the run)")
        if _digest(path) != record[_DIGEST_KEY]:
            raise ValueError(f"this node kept '{key}' in {path}, which has changed since")
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}

    def made(self) -> Path:
        """:attr:`folder`, made where it is not yet (and a week-old crashed run's removed)."""
        folder = self.folder
        if not folder.is_dir():
            fresh = not folder.parent.exists()
            # the node's rows are written here: readable by this user alone
            folder.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if fresh:
                _remove_stale_runs(folder.parent.parent)
        return folder

    def forget(self) -> None:
        """Remove this node's folder in this run, with every file in it (after its last
        round)."""
        for key in list(self._state.config_records.keys()):
            if key != _FOLDER_KEY and _FILE_KEY in self._state.config_records[key]:
                self.drop(key)
        if _FOLDER_KEY not in self._state.config_records:
            return
        folder = self.folder
        shutil.rmtree(folder, ignore_errors=True)
        try:
            folder.parent.rmdir()  # only where empty: another node's folder stays
        except OSError:
            pass

    def drop(self, key: str) -> None:
        """Forget what was kept under ``key`` (its file too)."""
        if key in self._state.array_records:
            del self._state.array_records[key]
        record = self._state.config_records.get(key)
        if record is not None and _FILE_KEY in record:
            Path(str(record[_FILE_KEY])).unlink(missing_ok=True)
            del self._state.config_records[key]


def _remove_stale_runs(base: Path) -> None:
    """Remove the run folders under ``base`` not touched for :data:`STALE_AFTER_S`."""
    now = time.time()
    for run in base.glob("run-*"):
        try:
            if now - run.stat().st_mtime > STALE_AFTER_S:
                shutil.rmtree(run, ignore_errors=True)
        except OSError:
            continue
