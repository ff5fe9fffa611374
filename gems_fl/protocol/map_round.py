"""A model's own round after the identity round (the ``map`` round): each node that fits
sends summaries of its training rows, from which the model's rule builds its map (the
kernel model's landmarks: class centres, :class:`~gems_fl.data.kernel_features.LandmarkRound`).

Server -> client (message type ``query``)::

    "config":     ConfigRecord  the node config, the agreement (scaling, classes) and
                                ``map-share``: summaries asked per training row of the run

Client -> server::

    "map-round":  ArrayRecord   the model's summaries as named arrays

No row leaves a node. The server checks each reply by the model's
:class:`~gems_fl.data.feature_map.MapRound` (a kernel node: shape, finite values, each centre
the mean of enough rows, no more centres than its share allows) and rejects a bad one
naming the node; the run goes on with the others.

A map's large part (the landmarks) travels whole in the first message of a run that
carries the map; later messages name it by its hash, and each node keeps it between the
two (:func:`with_kept_map_part`).
"""

from __future__ import annotations

import hashlib
import time
from logging import INFO
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from gems_fl.data.agreement import DataAgreement
from gems_fl.data.feature_map import MapRound
from gems_fl.protocol import wire
from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.options import Exchange
from gems_fl.protocol.replies import ReplyError, validate_replies
from gems_fl.protocol.rounds import Round, round_messages, sent_bytes

__all__ = ["KEPT_KEY", "RECORD_KEY", "SHARE_KEY", "collect_summaries", "decode_summaries",
           "encode_summaries", "summaries_content", "with_kept_map_part"]

SHARE_KEY = "map-share"
RECORD_KEY = "map-round"
#: what a node keeps its map's large part under between the messages of a run
KEPT_KEY = "gems-map-part"


def summaries_content(round_: MapRound, x_train: np.ndarray, y_train: np.ndarray,
                      share: float, seed: int) -> RecordDict:
    """A node's answer: ``round_``'s summaries of its (scaled) training rows."""
    return encode_summaries(round_.summarize(x_train, y_train, share, seed))


def encode_summaries(arrays: dict[str, np.ndarray]) -> RecordDict:
    return RecordDict({RECORD_KEY: ArrayRecord({k: Array(np.ascontiguousarray(v))
                                                for k, v in arrays.items()})})


def decode_summaries(content: RecordDict, round_: MapRound, num_features: int,
                     most: int) -> np.ndarray:
    """A reply's summaries, checked by ``round_``; :class:`ReplyError` naming what is wrong."""
    record = content.array_records.get(RECORD_KEY)
    if record is None:
        raise ReplyError(f"the map round's reply lacks its '{RECORD_KEY}' ArrayRecord")
    try:
        return round_.check({k: record[k].numpy() for k in record}, num_features, most)
    except ValueError as exc:
        raise ReplyError(str(exc)) from None


def collect_summaries(grid: Grid, exchange: Exchange, agreement: DataAgreement,
                      round_: MapRound, rows: dict[int, int], asked: int,
                      names: dict[int, str]
                      ) -> tuple[dict[int, np.ndarray], list[dict[str, object]], dict[str, Any]]:
    """Ask each node of ``rows`` (``{node id: training rows}``) for its summaries,
    ``asked`` in all, in proportion to the rows.

    Returns ``({node id: summaries}, rejected, report)``; ``report`` has the round's bytes,
    wall time and ``round_``'s record of it.
    """
    t0 = time.perf_counter()
    share = asked / max(sum(rows.values()), 1)
    config = {**exchange.node_config, **agreement.to_config(), SHARE_KEY: float(share)}
    nodes = sorted(rows)
    messages = round_messages(Round.MAP, wire.encode_config(config), nodes,
                              group_id="map", ttl=exchange.round_timeout)
    replies = list(grid.send_and_receive(messages, timeout=exchange.round_timeout))

    most = int(share * max(rows.values())) + agreement.num_classes  # rounding, per class

    def check(reply: RecordDict):
        return (decode_summaries(reply, round_, agreement.num_features, most),)

    accepted, rejected = validate_replies(replies, nodes, check, log_prefix="Map round: ",
                                          names=names, messages=messages)
    sent = {node_id: item[0] for node_id, item in accepted}
    total = sum(len(c) for c in sent.values())
    log(INFO, "Map round: %s", round_.describe(total, len(sent)))
    report = {"bytes_sent": sent_bytes(messages),
              "bytes_received": sum(wire.content_bytes(r.content) for r in replies
                                    if not r.has_error()),
              "wall_s": time.perf_counter() - t0,
              **round_.report(total, int(asked), sum(rows.values()))}
    return sent, rejected, report


def with_kept_map_part(config: dict[str, Any], store: NodeStore,
                       large: tuple[str, str] | None) -> dict[str, Any]:
    """A message's config with its map's large part: ``large`` is the map class's
    ``LARGE_CONFIG`` (the part's config key, and the key of its hash: the first 16 hex
    digits of the part's SHA-256; None: a map without such a part).
    A part the message carries is kept in the node's ``store`` (round 1); a later message
    names it by its hash and gets it from there.

    Raises ``ValueError`` where the node keeps no part of that hash (a node that did not
    take part in round 1, or whose state was lost): the node answers with that error and
    the server leaves it out of the round, naming it.
    """
    if large is None:
        return config
    key, digest_key = large
    if key in config:
        store.keep(KEPT_KEY, {"part": np.frombuffer(bytes(config[key]), dtype=np.uint8)})
        return config
    if digest_key not in config:
        return config  # a message without the map (the identity round's)
    wanted = str(config[digest_key])
    kept = store.kept(KEPT_KEY)
    part = None if kept is None else kept["part"].tobytes()
    if part is None or hashlib.sha256(part).hexdigest()[:16] != wanted:
        raise ValueError(f"this node keeps no map part of hash {wanted} (it got none in this "
                         "run's round 1, or its state was lost); it cannot map its rows")
    return {**config, key: part}
