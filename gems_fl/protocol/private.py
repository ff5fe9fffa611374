"""Round 1 under differential privacy (``dp-epsilon > 0``): what a node sends and what
the server reads (the statistics and their noise: :mod:`gems_fl.geometry.dp`).

A node trains its model and builds its Gram space as usual, keeps the center and radii
in its own state (the evaluate round checks h_G against them), and sends its metrics and
its noised sums ``S_G`` and ``S_M``: no model, no ``W_k G_k``. With
``secure-aggregation`` the noised sums travel through SecAgg+ instead
(:mod:`gems_fl.protocol.secure`), drawn once and kept in the node's state between round 1
and SecAgg+, so the node releases one draw.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from flwr.app import Context, MetricRecord, RecordDict

from gems_fl.geometry.dp import DPSpec, noised_statistics
from gems_fl.geometry.gram import unpack_triangle
from gems_fl.protocol import wire
from gems_fl.protocol.node_store import NodeStore

RELEASE_KEY = "dp-release"
#: the arrays of a DP release: the noised Gram triangle and label-moment sums
RELEASE_ARRAYS = ("gram", "moments")
#: Where a node keeps its one draw between round 1 and SecAgg+ (secure aggregation).
RELEASE_STATE_KEY = "gems-dp-release"
#: The noise's own stream: the run seed's node seed offset, so it is not the training's.
_SEEDED_NOISE_OFFSET = 104_729


def node_release(x_train: np.ndarray, y_train: np.ndarray, num_classes: int, spec: DPSpec,
                 seed: int, *, seeded_noise: bool = False) -> dict[str, np.ndarray]:
    """This node's noised sums under ``spec``: ``gram`` (packed triangle of ``S_G``) and
    ``moments``. The noise is the operating system's entropy unless ``seeded_noise``
    (``dp-seeded-noise``: drawn from the node's seed, for studies that repeat a run)."""
    rng = (np.random.default_rng([int(seed), _SEEDED_NOISE_OFFSET]) if seeded_noise
           else np.random.default_rng())
    return noised_statistics(x_train, y_train, num_classes, spec, rng)


def keep_release(context: Context, release: Mapping[str, np.ndarray]) -> None:
    """Keep the one draw for SecAgg+ (a second draw would be a second release)."""
    NodeStore(context).keep(RELEASE_STATE_KEY,
                            {k: np.asarray(v, dtype=np.float64) for k, v in release.items()})


def kept_release(context: Context) -> dict[str, np.ndarray]:
    """The draw this node kept in round 1; ``RuntimeError`` if there is none."""
    kept = NodeStore(context).kept(RELEASE_STATE_KEY)
    if kept is None:
        raise RuntimeError("differential privacy: this node kept no release from round 1")
    return kept


def encode_release_reply(metrics: Mapping[str, float],
                         release: Mapping[str, np.ndarray]) -> RecordDict:
    """Round 1's reply under DP without secure aggregation: metrics and the noised sums
    (float32: the noise is orders of magnitude above float32's rounding)."""
    return RecordDict({
        wire.METRICS_KEY: MetricRecord({k: float(metrics[k]) for k in
                                        (*wire.METRIC_KEYS, *wire.SOLVE_METRIC_KEYS) if k in metrics}),
        RELEASE_KEY: wire.array_record({k: np.asarray(v, dtype=np.float32)
                                        for k, v in release.items()}),
    })


def decode_release_reply(content: RecordDict, num_classes: int, size: int):
    """``(space, metrics, gram_sum (n, n), moments_sum (C, n))`` of a DP round-1 reply;
    the space is the node's radii without a center. Raises ``ReplyError`` for other
    records, wrong shapes or non-finite entries."""
    from gems_fl.geometry.spaces import SummedGramSpace
    from gems_fl.protocol.replies import ReplyError, read_metrics

    expected = {wire.METRICS_KEY, RELEASE_KEY}
    if set(content.keys()) != expected:
        raise ReplyError(f"dp round 1 reply records {sorted(content.keys())}: expected "
                         f"{sorted(expected)} (a node under dp-epsilon sends no model)")
    metrics = read_metrics(content)
    record = content.array_records[RELEASE_KEY]
    if set(record.keys()) != set(RELEASE_ARRAYS):
        raise ReplyError(f"'{RELEASE_KEY}' arrays {sorted(record.keys())}: expected "
                         f"{sorted(RELEASE_ARRAYS)}")
    triangle = np.asarray(record["gram"].numpy(), dtype=np.float64)
    moments = np.asarray(record["moments"].numpy(), dtype=np.float64)
    if triangle.shape != (size * (size + 1) // 2,) or moments.shape != (num_classes, size):
        raise ReplyError(f"dp release shapes {triangle.shape}, {moments.shape}: expected "
                         f"({size * (size + 1) // 2},) and ({num_classes}, {size})")
    if not (np.all(np.isfinite(triangle)) and np.all(np.isfinite(moments))):
        raise ReplyError("dp release holds NaN or infinite entries")
    return (SummedGramSpace.radii_only(metrics, size), metrics,
            unpack_triangle(triangle, size), moments)


def secure_blocks(release: Mapping[str, np.ndarray], num_train: int) -> dict[str, np.ndarray]:
    """The release as SecAgg+ carries it: per-row means (SecAgg+ weights by ``n_k``)."""
    return {k: np.asarray(v, dtype=np.float64) / int(num_train) for k, v in release.items()}

