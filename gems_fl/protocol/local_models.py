"""The MLP's node-side Local and Averaged rows: each node's whole local model, asked for
after the protocol when the server holds no data to rebuild it.

The layer-wise protocol never sends a whole local MLP (a hidden layer travels as neuron
balls, the output layer as a space over merged features). Where the server holds the
nodes' data (a simulation) it retrains them (``serverapp.protocols.rebuild_local_mlps``); where
it does not (``evaluate-on-server=false``), :func:`collect_local_mlps` asks every accepted
node for its round-1 model (the one whose first layer it sent), checks each reply, and
the evaluate round then scores every node's model and their parameter mean on every node,
as the convex protocol does with the centers it already holds.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.protocol import wire
from gems_fl.protocol.replies import ReplyError, validate_replies
from gems_fl.protocol.rounds import Round, round_messages, sent_bytes


@dataclass
class LocalModels:
    """The nodes' whole local models by node name, and what asking for them cost."""

    states: dict[str, dict[str, np.ndarray]]
    rejected: list[dict[str, object]] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)


def _decoder(shapes: Mapping[str, tuple[int, ...]]):
    def decode(content) -> tuple[Any, ...]:
        record = content.array_records.get(wire.MODEL_KEY)
        if record is None:
            raise ReplyError(f"local-model reply has no '{wire.MODEL_KEY}' ArrayRecord")
        keys = sorted(record.keys())
        if keys != sorted(shapes):
            raise ReplyError(f"local model has arrays {keys}; expected {sorted(shapes)}")
        state = {}
        for key in keys:
            array = record[key].numpy()
            if tuple(array.shape) != tuple(shapes[key]):
                raise ReplyError(f"'{key}' has shape {array.shape}, expected {tuple(shapes[key])}")
            if not np.all(np.isfinite(array)):
                raise ReplyError(f"'{key}' contains NaN or infinite values")
            state[key] = array
        return (np.concatenate([state[k].reshape(-1) for k in keys]), state)
    return decode


def collect_local_mlps(grid: Grid, node_ids: list[int], names: Mapping[int, str],
                       config: dict[str, Any], shapes: Mapping[str, tuple[int, ...]],
                       timeout: float) -> LocalModels:
    """Ask ``node_ids`` for their whole local MLP (state dict of ``shapes``); the bad and
    the missing are rejected with a log line naming the node, the others kept."""
    t0 = time.perf_counter()
    messages = round_messages(Round.LOCAL_MODEL, wire.encode_config(config), node_ids,
                              group_id="local-models", ttl=timeout)
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    received = sum(wire.content_bytes(r.content) for r in replies if not r.has_error())
    accepted, rejected = validate_replies(replies, node_ids, _decoder(shapes),
                                          log_prefix="Local models: ", names=names,
                                          messages=messages)
    states = {names.get(n, str(n)): item[1] for n, item in accepted}
    log(INFO, "Local models: %d of %d nodes sent their whole local MLP for the node-side "
        "Local and Averaged rows", len(states), len(node_ids))
    return LocalModels(dict(sorted(states.items())), rejected, {
        "bytes_sent": sent_bytes(messages), "bytes_received": received,
        "nodes": sorted(states), "wall_s": time.perf_counter() - t0})
