"""The landmark round of ``model='kernel'``: after the identity round, each node sends
class centres of its training rows, which become the Nyström map's landmarks.

Server -> client (message type ``query``)::

    "config":  ConfigRecord  the node config, the agreement (scaling, classes) and
                             ``landmark-share``: landmarks per training row of the run

Client -> server::

    "landmarks": ArrayRecord  "centres" (k x d, float32: k-means centres of each class's
                              scaled training rows, classes in order) and "sizes" (k,
                              int64: the rows each is the mean of, every one at least
                              :data:`~gems_fl.data.kernel_features.MIN_ROWS_PER_LANDMARK`)

No row leaves a node: each centre is the mean of at least that many of its rows. The
server checks each reply (shape, finite values, sizes, no more centres than the node's
share allows) and rejects a bad one naming the node; the run goes on with the others.
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
from gems_fl.data.kernel_features import DIGEST_KEY, MAP_NAME, MIN_ROWS_PER_LANDMARK, class_centres
from gems_fl.data.kernel_features import LANDMARKS_KEY as LANDMARKS_KEY_CONFIG
from gems_fl.protocol import wire
from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.options import Exchange
from gems_fl.protocol.replies import ReplyError, validate_replies
from gems_fl.protocol.rounds import Round, round_messages, sent_bytes

__all__ = ["SHARE_KEY", "collect_landmarks", "decode_landmarks", "encode_landmarks",
           "landmarks_content", "with_kept_landmarks"]

SHARE_KEY = "landmark-share"
LANDMARKS_KEY = "landmarks"


def landmarks_content(x_train: np.ndarray, y_train: np.ndarray, share: float,
                      seed: int) -> RecordDict:
    """A node's answer: the class centres of its (scaled) training rows."""
    centres, sizes = class_centres(x_train, y_train, share, seed)
    return encode_landmarks(centres, sizes)


def encode_landmarks(centres: np.ndarray, sizes: np.ndarray) -> RecordDict:
    return RecordDict({LANDMARKS_KEY: ArrayRecord({
        "centres": Array(np.ascontiguousarray(centres, dtype=np.float32)),
        "sizes": Array(np.ascontiguousarray(sizes, dtype=np.int64))})})


def decode_landmarks(content: RecordDict, num_features: int, most: int) -> tuple[np.ndarray, np.ndarray]:
    """A landmark reply, checked: ``(centres (k, num_features) float32, sizes (k,))``.

    Raises :class:`ReplyError` naming what is wrong: a missing record, a wrong shape,
    values that are not finite, a centre of fewer rows than the minimum, or more centres
    than ``most`` (the node's share of the run's landmarks allows)."""
    record = content.array_records.get(LANDMARKS_KEY)
    if record is None or "centres" not in record or "sizes" not in record:
        raise ReplyError(f"landmark reply lacks a '{LANDMARKS_KEY}' ArrayRecord with 'centres' "
                         "and 'sizes'")
    centres, sizes = record["centres"].numpy(), record["sizes"].numpy()
    if centres.ndim != 2 or centres.shape[1] != num_features or sizes.shape != (len(centres),):
        raise ReplyError(f"landmark reply has centres of shape {centres.shape} and sizes of shape "
                         f"{sizes.shape}; the run has {num_features} features")
    if not np.all(np.isfinite(centres)):
        raise ReplyError("landmark reply holds NaN or infinite values")
    if len(sizes) and int(sizes.min()) < MIN_ROWS_PER_LANDMARK:
        raise ReplyError(f"landmark reply has a centre of {int(sizes.min())} row(s); each must be "
                         f"the mean of at least {MIN_ROWS_PER_LANDMARK}")
    if len(centres) > most:
        raise ReplyError(f"landmark reply has {len(centres)} centres; the node's share allows "
                         f"at most {most}")
    return centres.astype(np.float32), sizes.astype(np.int64)


def landmark_count_reason(kept: int, asked: int, rows: int) -> str:
    """Why a run has ``kept`` landmarks when ``asked`` were asked of ``rows`` training rows
    (results.json: ``identify.landmark_round.why``)."""
    rule = (f"each a k-means centre of one class at one site, the mean of at least "
            f"{MIN_ROWS_PER_LANDMARK} of its rows")
    if kept >= asked:
        return f"{kept} as asked, {rule}"
    if asked * MIN_ROWS_PER_LANDMARK > rows:
        return (f"{kept} of {asked} asked: {rows} training rows allow at most one per "
                f"{MIN_ROWS_PER_LANDMARK} rows of a class ({rule}; clusters under that "
                "dissolved into the others)")
    return f"{kept} of {asked} asked: {rule}; clusters under that were dropped"


def collect_landmarks(grid: Grid, exchange: Exchange, agreement: DataAgreement,
                      rows: dict[int, int], landmarks: int, names: dict[int, str]
                      ) -> tuple[dict[int, np.ndarray], list[dict[str, object]], dict[str, Any]]:
    """Ask each node of ``rows`` (``{node id: training rows}``) for its class centres,
    ``landmarks`` in all, in proportion to the rows.

    Returns ``({node id: centres}, rejected, report)``; ``report`` has the round's bytes
    and wall time.
    """
    t0 = time.perf_counter()
    share = landmarks / max(sum(rows.values()), 1)
    config = {**exchange.node_config, **agreement.to_config(), SHARE_KEY: float(share)}
    nodes = sorted(rows)
    messages = round_messages(Round.LANDMARKS, wire.encode_config(config), nodes,
                              group_id="landmarks", ttl=exchange.round_timeout)
    replies = list(grid.send_and_receive(messages, timeout=exchange.round_timeout))

    most = int(share * max(rows.values())) + agreement.num_classes  # rounding, per class

    def check(reply: RecordDict):
        return decode_landmarks(reply, agreement.num_features, most)

    accepted, rejected = validate_replies(replies, nodes, check, log_prefix="Landmarks: ",
                                          names=names, messages=messages)
    centres = {node_id: item[0] for node_id, item in accepted}
    total = sum(len(c) for c in centres.values())
    log(INFO, "Landmarks: %d class centres from %d node(s) (each the mean of at least %d rows)",
        total, len(centres), MIN_ROWS_PER_LANDMARK)
    report = {"bytes_sent": sent_bytes(messages),
              "bytes_received": sum(wire.content_bytes(r.content) for r in replies
                                    if not r.has_error()),
              "wall_s": time.perf_counter() - t0, "landmarks": total, "asked": int(landmarks),
              "why": landmark_count_reason(total, int(landmarks), sum(rows.values()))}
    return centres, rejected, report


#: what a node keeps the kernel map's landmarks under between the messages of a run
KEPT_KEY = "gems-kernel-landmarks"


def with_kept_landmarks(config: dict[str, Any], store: NodeStore) -> dict[str, Any]:
    """A message's config with the kernel map's landmarks: those it carries are kept in
    the node's ``store`` (round 1); a later message names them by their hash and gets them
    from there.

    Raises ``ValueError`` where the node keeps no landmarks of that hash (a node that did
    not take part in round 1, or whose state was lost): the node answers with that error
    and the server leaves it out of the round, naming it.
    """
    if config.get("feature-map") != MAP_NAME:
        return config
    if LANDMARKS_KEY_CONFIG in config:
        store.keep(KEPT_KEY, {"landmarks": np.frombuffer(bytes(config[LANDMARKS_KEY_CONFIG]),
                                                         dtype=np.uint8)})
        return config
    wanted = str(config.get(DIGEST_KEY, ""))
    kept = store.kept(KEPT_KEY)
    landmarks = None if kept is None else kept["landmarks"].tobytes()
    if landmarks is None or hashlib.sha256(landmarks).hexdigest()[:16] != wanted:
        raise ValueError(f"this node keeps no kernel landmarks of hash {wanted} (it got none in "
                         "this run's round 1, or its state was lost); it cannot map its rows")
    return {**config, LANDMARKS_KEY_CONFIG: landmarks}
