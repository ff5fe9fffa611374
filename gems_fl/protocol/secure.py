"""Secure aggregation of the nodes' Gram statistics (``secure-aggregation=true``).

The closed-form, pooled and LDA points need only sums over nodes
(:mod:`gems_fl.geometry.gram_sums`). With secure aggregation every per-node statistic
they need travels through Flower's SecAgg+ (``SecAggPlusWorkflow`` on the server,
``secaggplus_mod`` on the node), so the ServerApp only ever holds the sums:

1. **Round 1** (``train``, ``secure-prepare``): each node trains its model and builds its
   Gram space as usual, keeps its center and radius in its own state, and answers with
   its metrics (radius, counts, validation accuracy) and the largest magnitude of each
   statistic (``bound.*``): no center, no matrix.
2. **SecAgg+**: the server scales each statistic by the largest bound over the nodes, so
   every entry lies in ``[-1, 1]`` (``clipping_range`` 1: a node finds any entry beyond it
   and fails the message instead of letting SecAgg+ clip it silently), and sets
   ``max_weight`` to the largest training count. Each node sends ``[G_k, W_k G_k, M_k,
   class counts / n_k]`` (scaled) with ``num_examples = n_k``; SecAgg+ returns only the
   ``n_k``-weighted mean over the nodes that finished the protocol.
3. The evaluate round asks each node to check h_G against the space it kept.

A node that drops out before SecAgg+ unmasks is left out of the sums and named; fewer
nodes than the reconstruction threshold stop the run with an error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import FitIns, parameters_to_ndarrays
from flwr.common.logger import log
from flwr.server.strategy import Strategy

from gems_fl.geometry.gram import pack_triangle, unpack_triangle
from gems_fl.protocol import wire
from gems_fl.protocol.rounds import Round, name_round

#: The train message's config key that asks for round 1 of the secure protocol.
SECURE_PREPARE_KEY = "secure-prepare"
#: What each node keeps in its own state between the rounds (its center and radius).
OWN_STATE_KEY = "gems-own-center"
OWN_RADII_KEY = "gems-own-radii"
#: The statistics, in the order they travel through SecAgg+.
BLOCKS = ("gram", "center-gram", "moments", "class-shares")
#: with class Gram matrices (the gaussian point): one more block, after those
CLASS_GRAMS_BLOCK = "class-grams"
#: Under ``dp-epsilon``: the node's noised sums ``S_G`` and ``S_M`` (as per-row means).
DP_BLOCKS = ("gram", "moments")
BOUND_PREFIX = "bound."
SCALE_PREFIX = "scale."
#: SecAgg+ quantises to 2**22 levels and masks modulo 2**32: a sum over more than
#: 2**32 / 2**22 = 1024 nodes can overflow.
MAX_SECURE_NODES = 1000
_LEGACY_CONFIG = "fitins.config"


# ------------------------------------------------------------------------ node side
def node_statistics(x_train: np.ndarray, y_train: np.ndarray, center: np.ndarray,
                    num_classes: int, gram_rank: int | str, class_grams: bool = False
                    ) -> dict[str, np.ndarray]:
    """This node's statistics in SecAgg+'s order: ``G_k`` (packed upper triangle, as the
    plain reply sends it), ``W_k G_k``, ``M_k``, the class shares ``counts / n_k`` and,
    with ``class_grams``, per class ``count_kc S_kc / n_k`` (packed triangles, zeros for
    a class the node lacks), whose ``n_k``-weighted mean over the nodes is the sum of the
    class's second moments over all rows divided by ``N``: what the gaussian point needs."""
    from gems_fl.geometry.gram import class_grams as per_class_grams
    from gems_fl.geometry.gram import label_moments
    from gems_fl.geometry.kinds import node_gram

    moments, counts = label_moments(x_train, y_train, num_classes)
    gram = node_gram(x_train, gram_rank, classes=(y_train, moments, counts))[0]
    w = np.asarray(center, dtype=np.float64).reshape(num_classes, -1)
    out = {"gram": pack_triangle(gram).astype(np.float64), "center-gram": w @ gram,
           "moments": np.asarray(moments, dtype=np.float64),
           "class-shares": counts.astype(np.float64) / len(y_train)}
    if class_grams:
        size = gram.shape[0]
        packed = np.zeros((num_classes, size * (size + 1) // 2))
        held = np.flatnonzero(counts > 0)
        for c, matrix in zip(held, per_class_grams(x_train, y_train, num_classes)):
            packed[c] = pack_triangle(matrix) * (counts[c] / len(y_train))
        out[CLASS_GRAMS_BLOCK] = packed.reshape(-1)
    return out


def keep_own_space(context: Context, center: np.ndarray, radius: float,
                   certified: float) -> None:
    """Keep this node's center and radii in its own state for the evaluate round."""
    context.state.array_records[OWN_STATE_KEY] = wire.array_record(
        {"center": np.asarray(center, dtype=np.float64)})
    context.state.config_records[OWN_RADII_KEY] = ConfigRecord(
        {"radius": float(radius), "certified-radius": float(certified)})


def own_space(context: Context) -> tuple[np.ndarray, float] | None:
    """The center ``(C, n)`` and radius this node kept, or None."""
    if OWN_STATE_KEY not in context.state.array_records:
        return None
    center = context.state.array_records[OWN_STATE_KEY]["center"].numpy()
    return center, float(context.state.config_records[OWN_RADII_KEY]["radius"])


def bounds(stats: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The largest magnitude of each statistic, for the server's scales."""
    return {BOUND_PREFIX + k: float(np.max(np.abs(v))) if v.size else 0.0
            for k, v in stats.items()}


def is_secure_fit(msg: Message) -> bool:
    """Whether ``msg`` is SecAgg+'s fit instruction (legacy ``FitIns`` records)."""
    return _LEGACY_CONFIG in msg.content.config_records


def secure_fit_reply(msg: Message, stats: Mapping[str, np.ndarray], num_train: int,
                     seed: int) -> RecordDict:
    """The legacy ``FitRes`` SecAgg+ masks: every statistic divided by the server's scale.

    Raises ``ValueError`` when an entry falls outside ``[-1, 1]`` after scaling (SecAgg+
    would clip it silently); the node then fails the message and drops out."""
    import flwr.compat.common.recorddict_compat as compat
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    config = msg.content.config_records[_LEGACY_CONFIG]
    arrays = []
    for key in stats:  # in the order of BLOCKS or DP_BLOCKS
        scale = float(config[SCALE_PREFIX + key])
        scaled = np.asarray(stats[key], dtype=np.float64) / scale if scale > 0 else \
            np.zeros_like(stats[key], dtype=np.float64)
        worst = float(np.max(np.abs(scaled))) if scaled.size else 0.0
        if worst > 1.0 + 1e-12:
            raise ValueError(f"secure aggregation: statistic '{key}' reaches {worst:.6g} "
                             f"of the server's scale {scale:.6g}; SecAgg+ would clip it. "
                             "This node's data changed since round 1")
        arrays.append(np.clip(scaled, -1.0, 1.0).reshape(-1))
    # secaggplus_mod rounds stochastically with numpy's global generator, right after
    # this returns: seed it so that the same run gives the same sums.
    np.random.seed(seed % 2**32)
    fitres = FitRes(status=Status(code=Code.OK, message=""),
                    parameters=ndarrays_to_parameters(arrays), num_examples=int(num_train),
                    metrics={})
    return compat.fitres_to_recorddict(fitres, keep_input=True)


def secure_mod(msg: Message, context: Context, call_next) -> Message:
    """``secaggplus_mod`` for SecAgg+'s messages only; every other message passes by."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def fit_config(msg: Message) -> dict[str, Any]:
    """The run settings SecAgg+'s fit instruction carries (the node's train config)."""
    return dict(msg.content.config_records[_LEGACY_CONFIG])


# ---------------------------------------------------------------------- server side
def blocks_for(dp: bool, class_grams: bool = False) -> tuple[str, ...]:
    """The statistics SecAgg+ carries: :data:`DP_BLOCKS` under ``dp-epsilon``, else
    :data:`BLOCKS` and, with ``class_grams`` (the node config's ``class-grams``), the
    class Gram matrices."""
    if dp:
        return DP_BLOCKS
    return (*BLOCKS, CLASS_GRAMS_BLOCK) if class_grams else BLOCKS


def scales_from(replies: list[dict[str, float]], blocks: tuple[str, ...] = BLOCKS) -> dict[str, float]:
    """Per statistic, the largest bound any node reported (0 where all are 0)."""
    return {SCALE_PREFIX + k: max(float(r[BOUND_PREFIX + k]) for r in replies) for k in blocks}


class _SumsStrategy(Strategy):
    """The legacy Strategy SecAggPlusWorkflow drives: one fit round to the given nodes,
    and the aggregated vector kept (nothing else is aggregated)."""

    def __init__(self, proxies: list, config: dict[str, Any]) -> None:
        self.proxies, self.config = proxies, config
        self.aggregate: list[np.ndarray] | None = None
        self.num_examples: dict[int, int] = {}

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(p, FitIns(parameters, dict(self.config))) for p in self.proxies]

    def aggregate_fit(self, server_round, results, failures):
        if results:  # SecAgg+ put the aggregate into every result's parameters
            self.aggregate = parameters_to_ndarrays(results[0][1].parameters)
            self.num_examples = {int(p.node_id): int(r.num_examples) for p, r in results}
        return None, {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


class CountingGrid:
    """A grid that counts the bytes of every message sent through it and of every reply
    (SecAgg+'s stages: key setup, shares, masked vectors, unmasking)."""

    def __init__(self, grid: Any) -> None:
        self._grid = grid
        self.bytes_sent = self.bytes_received = self.messages = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout: float | None = None):
        messages = list(messages)
        self.messages += len(messages)
        self.bytes_sent += sum(wire.content_bytes(m.content) for m in messages)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        self.bytes_received += sum(wire.content_bytes(r.content) for r in replies
                                   if not r.has_error())
        return replies


def secure_sums(grid, node_ids: list[int], config: dict[str, Any], *, max_weight: float,
                threshold: float, timeout: float, blocks: tuple[str, ...] = BLOCKS,
                ) -> tuple[dict[str, np.ndarray], dict[int, int], dict[str, int]]:
    """Run SecAgg+ over ``node_ids``; return the ``n_k``-weighted means of the statistics
    (unscaled, ``gram`` as a full matrix), per node whose vector is in them its training
    count, and the traffic of SecAgg+'s stages (``bytes_sent``, ``bytes_received``,
    ``messages``). Raises ``RuntimeError`` when the protocol halts (fewer nodes than its
    reconstruction threshold)."""
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    if len(node_ids) > MAX_SECURE_NODES:
        raise RuntimeError(f"secure aggregation over {len(node_ids)} nodes: SecAgg+'s "
                           f"2**22 quantisation levels in a 2**32 modulus hold at most "
                           f"{MAX_SECURE_NODES}")
    proxies = [GridClientProxy(n, grid, 0) for n in node_ids]
    strategy = _SumsStrategy(proxies, name_round(config, Round.SECURE_SUMS))
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(),
                                    run_config={}),
                            config=ServerConfig(num_rounds=1), strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=float(threshold),
                                  max_weight=float(max_weight), clipping_range=1.0,
                                  timeout=timeout)
    log(INFO, "Secure aggregation (SecAgg+) of the Gram statistics over %d nodes: "
        "reconstruction threshold %.2f of the shares, max_weight %g", len(node_ids),
        threshold, max_weight)
    counting = CountingGrid(grid)
    workflow(counting, context)
    traffic = {"bytes_sent": counting.bytes_sent, "bytes_received": counting.bytes_received,
               "messages": counting.messages}
    if strategy.aggregate is None:
        raise RuntimeError("secure aggregation halted: too few nodes finished SecAgg+ "
                           "(below its reconstruction threshold); see the log above")
    means = {}
    for key, vector in zip(blocks, strategy.aggregate):
        means[key] = np.asarray(vector, dtype=np.float64) * float(config[SCALE_PREFIX + key])
    size = int(round((math.sqrt(8 * means["gram"].size + 1) - 1) / 2))
    means["gram"] = unpack_triangle(means["gram"], size)
    num_classes = means["moments"].size // size
    for key in ("center-gram", "moments"):
        if key in means:
            means[key] = means[key].reshape(num_classes, size)
    if CLASS_GRAMS_BLOCK in means:
        means[CLASS_GRAMS_BLOCK] = np.stack([unpack_triangle(row, size) for row in
                                             means[CLASS_GRAMS_BLOCK].reshape(num_classes, -1)])
    dropped = sorted(set(node_ids) - set(strategy.num_examples))
    if dropped:
        log(WARNING, "Secure aggregation: nodes %s did not finish SecAgg+; the sums hold "
            "the other %d", dropped, len(strategy.num_examples))
    return means, strategy.num_examples, traffic


# ------------------------------------------------------------------- round 1's reply
def prepare_metric_keys(blocks: tuple[str, ...] = BLOCKS) -> tuple[str, ...]:
    """Round 1's metrics under secure aggregation: the usual ones and a bound per block."""
    return wire.METRIC_KEYS + tuple(BOUND_PREFIX + k for k in blocks)


def encode_prepare_reply(metrics: Mapping[str, float], blocks: tuple[str, ...] = BLOCKS) -> RecordDict:
    """Round 1's reply under secure aggregation: metrics and bounds, no model."""
    from flwr.app import MetricRecord

    return RecordDict({wire.METRICS_KEY: MetricRecord(
        {k: float(metrics[k]) for k in prepare_metric_keys(blocks)})})


def decode_prepare_reply(content: RecordDict, size: int,
                         blocks: tuple[str, ...] = BLOCKS):
    """``(space, metrics)``: the node's radii as a
    :class:`~gems_fl.geometry.spaces.SummedGramSpace` without a center (the server never
    sees it), and its metrics. Raises ``ReplyError`` for any other record, a missing or
    non-finite metric, or a negative bound."""
    from gems_fl.geometry.spaces import SummedGramSpace
    from gems_fl.protocol.replies import ReplyError, read_metrics

    if set(content.keys()) != {wire.METRICS_KEY}:
        raise ReplyError(f"secure round 1 reply records {sorted(content.keys())}: expected "
                         f"only '{wire.METRICS_KEY}' (a node under secure aggregation sends "
                         "no model or matrix)")
    metrics = read_metrics(content, prepare_metric_keys(blocks))
    for key in blocks:
        if metrics[BOUND_PREFIX + key] < 0:
            raise ReplyError(f"{BOUND_PREFIX + key}={metrics[BOUND_PREFIX + key]} is negative")
    return SummedGramSpace.radii_only(metrics, size), metrics
