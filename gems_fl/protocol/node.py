"""What one node does: train locally, build its good-enough space, reply with it.

Plain functions on numpy arrays, and one reply builder per message the node answers
(:func:`spaces_reply`, :func:`selection_reply`, :func:`refine_reply`, :func:`local_model_reply`,
:func:`evaluate_reply`, :func:`identity_reply`), each given the
node's loaded data and its :class:`~gems_fl.protocol.options.NodeWork`. The ClientApp's
handlers (:mod:`gems_fl.clientapp`) turn a message's settings into those and call them.
Nothing but the replies built here leaves the node.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

import numpy as np
import torch
from flwr.app import Context, Message, RecordDict

from gems_fl.data.agreement import FEATURES_KEY
from gems_fl.data.nodes import NodeData
from gems_fl.data.site_files import feature_stats
from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.kinds import LayerSpace, build_layer_space
from gems_fl.geometry.refine import softmax_gradient
from gems_fl.geometry.selection import score_candidates
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.exact import SolveReport, solve_softmax
from gems_fl.learning.model_kinds import model_kind
from gems_fl.learning.models import model_to_vector, state_to_vector, vector_to_state
from gems_fl.learning.threads import compute_threads
from gems_fl.learning.train import TrainReport, accuracy
from gems_fl.protocol import private, secure, wire
from gems_fl.protocol.node_layerwise import (
    build_partial_mlp,
    hidden_layer_spaces,
    layer_inputs,
    output_layer_space,
    round_seed,
    train_local_mlp,
)
from gems_fl.protocol.node_store import NodeStore
from gems_fl.protocol.options import NodeWork
from gems_fl.protocol.verify import keep_own_factor, kept_gram, score_models

logger = logging.getLogger(__name__)


@dataclass
class LocalSpace:
    """A node's trained model, its good-enough space and how they were obtained
    (``training``: the epochs' report, or the exact solve's)."""

    layer: LayerSpace
    training: TrainReport | SolveReport
    num_train: int
    num_val: int
    val_accuracy: float

    @property
    def solve_metrics(self) -> dict[str, float] | None:
        """The exact solve's report as reply metrics (None: trained by epochs)."""
        return self.training.to_metrics() if isinstance(self.training, SolveReport) else None

    @property
    def space(self) -> Space | GramSpace:
        return self.layer.space


def build_local_space(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    num_classes: int,
    work: NodeWork,
    seed: int,
) -> LocalSpace:
    """Fit the local model and find its good-enough space (``work.space``).

    A convex model is solved exactly where ``work.training.exact`` (else trained by the
    recipe's epochs). The radius is searched on the validation split with Q = accuracy >=
    ``eps``; a model that already fails Q at its center gets radius 0.
    """
    num_features = x_train.shape[1]
    gram = None
    if work.training.exact:  # the Gram matrix preconditions the solve and shapes the space
        gram = gram_matrix(x_train)
        center, report = solve_softmax(x_train, y_train, num_classes, gram=gram)
        val_accuracy = float(np.mean(np.argmax(np.asarray(x_val, dtype=np.float64) @ center[:, :-1].T
                                               + center[:, -1], axis=1) == np.asarray(y_val)))
    else:
        torch.manual_seed(seed)
        model = work.training.new_model(num_features, num_classes)
        report = work.training.recipe.train(model, x_train, y_train, seed)
        center = model_to_vector(model).reshape(num_classes, num_features + 1)
        val_accuracy = accuracy(model, x_val, y_val)
    layer = build_layer_space(center, (x_train, y_train), x_val, y_val, work.space, seed,
                              gram=gram)
    return LocalSpace(layer=layer, training=report, num_train=len(y_train), num_val=len(y_val),
                      val_accuracy=val_accuracy)


def encode_layer_space(layer: LayerSpace, num_inputs: int, num_classes: int, *, eps: float,
                       num_train: int, num_val: int, val_accuracy: float,
                       solve: dict[str, float] | None = None) -> RecordDict:
    """The reply for a linear layer's space (convex model or MLP output layer)."""
    to_state = lambda v: vector_to_state(v, num_inputs, num_classes)
    space = layer.space
    return wire.encode_reply(
        to_state(space.center), None if space.axes is None else to_state(space.axes),
        radius=space.radius, certified_radius=layer.certified_radius, eps=eps,
        num_train_examples=num_train, num_val_examples=num_val,
        local_val_accuracy=val_accuracy,
        gram=space.gram if isinstance(space, GramSpace) and layer.factor is None else None,
        gram_factor=layer.factor, gram_residual=layer.residual,
        labels=((space.moments, space.class_counts, space.class_grams, layer.class_factors,
                 space.class_parts)
                if isinstance(space, GramSpace) and space.moments is not None else None),
        solve=solve, column_classes=layer.column_classes,
    )


def _layer_round_reply(
    msg: Message, work: NodeWork, num_classes: int, data: tuple, seed: int
) -> RecordDict:
    """One round of the layer-wise protocol (see :mod:`gems_fl.protocol.node_layerwise`)."""
    round_index = int(msg.content.config_records[wire.CONFIG_KEY][wire.ROUND_KEY])
    fixed = wire.decode_layers(msg.content)
    x_tr, y_tr, x_val, y_val = data
    seed = round_seed(seed, round_index)
    if len(fixed) < len(work.training.hidden):
        spaces = hidden_layer_spaces(x_tr, y_tr, x_val, y_val, num_classes, work, fixed, seed)
        logger.info("round %d: layer %d, %d neurons, median radius %.4g", round_index,
                    len(fixed) + 1, len(spaces.radius), float(np.median(spaces.radius)))
        return wire.encode_neuron_reply(
            spaces.weight, spaces.bias, spaces.radius, num_train_examples=len(y_tr),
            num_val_examples=len(y_val), local_val_accuracy=spaces.val_accuracy)
    layer, val_acc = output_layer_space(x_tr, y_tr, x_val, y_val, num_classes, work, fixed,
                                        seed)
    return encode_layer_space(layer, fixed[-1][0].shape[0], num_classes, eps=work.eps,
                              num_train=len(y_tr), num_val=len(y_val), val_accuracy=val_acc)


def local_model_reply(msg: Message, context: Context, data: NodeData, work: NodeWork) -> Message:
    """The ``local-model`` round: this node's whole round-1 local MLP, retrained from its
    data and seed (the model whose first layer it sent in round 1), for the node-side Local
    and Averaged rows."""
    x_tr, y_tr, _, _ = data.arrays
    with compute_threads():
        model = train_local_mlp(x_tr, y_tr, data.num_classes, work.training, [],
                                round_seed(data.seed, 1))
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    return Message(content=wire.encode_local_model_reply(state, len(y_tr)), reply_to=msg)


MERGED_LAYERS_KEY = "gems.merged-layers"  # this node's state: the selection round's layers


def _merged_layers(msg: Message, context: Context) -> list | None:
    """The MLP's merged hidden layers beneath the output layer: sent with the selection
    round, which this node keeps in its state, and named by their digest in each
    refinement step (resending them would cost a node about their size every step).
    None for the convex model."""
    store = NodeStore(context)
    if wire.LAYERS_KEY in msg.content.array_records:
        record = msg.content.array_records[wire.LAYERS_KEY]
        store.keep(MERGED_LAYERS_KEY, {name: record[name].numpy() for name in record.keys()})
        return wire.decode_layers(msg.content)
    digest = msg.content.config_records[wire.CONFIG_KEY].get(wire.LAYERS_DIGEST_KEY)
    if digest is None:
        return None
    kept = store.kept(MERGED_LAYERS_KEY)
    if kept is None:
        raise ValueError(f"refinement step: this node keeps no merged hidden layers (the "
                         f"server names digest {digest}); it took no part in the selection "
                         f"round")
    layers = wire.decode_layers(RecordDict({wire.LAYERS_KEY: wire.array_record(kept)}))
    if wire.layers_digest(layers) != digest:
        raise ValueError(f"refinement step: the merged hidden layers this node kept have "
                         f"digest {wire.layers_digest(layers)}, the server names {digest}")
    return layers


def _output_layer_inputs(msg: Message, context: Context, data: NodeData, work: NodeWork,
                         x: np.ndarray) -> np.ndarray:
    """The rows ``x`` as the output layer sees them: as they are for a convex model; for
    the MLP, their features through the merged hidden layers."""
    fixed = _merged_layers(msg, context)
    if fixed is None:
        return x
    model = build_partial_mlp(data.num_features, data.num_classes, work.training, fixed,
                              data.seed)
    return layer_inputs(model, x, len(fixed))


def selection_reply(msg: Message, context: Context, data: NodeData, work: NodeWork) -> Message:
    """The ``select`` round: each candidate's validation cross-entropy at each logit scale
    and its correct validation predictions (for the MLP, on the merged hidden layers'
    features)."""
    x_val = _output_layer_inputs(msg, context, data, work, data.x_val)
    scales = msg.content.config_records[wire.CONFIG_KEY][wire.TEMPERATURES_KEY]
    losses, correct = score_candidates(wire.decode_candidates(msg.content), x_val, data.y_val,
                                       scales)
    return Message(content=wire.encode_selection_reply(losses, list(correct), len(data.y_val)),
                   reply_to=msg)


def refine_reply(msg: Message, context: Context, data: NodeData, work: NodeWork) -> Message:
    """A ``refine`` step: this node's cross-entropy gradient at the server's model."""
    x_tr, y_tr = _output_layer_inputs(msg, context, data, work, data.x_train), data.y_train
    state = wire.decode_model(msg.content)
    w = state_to_vector(state).reshape(data.num_classes, x_tr.shape[1] + 1)
    gradient, loss = softmax_gradient(w, x_tr, y_tr)
    return Message(content=wire.encode_gradient_reply(
        vector_to_state(gradient.reshape(-1), x_tr.shape[1], data.num_classes),
        loss=loss, num_train_examples=len(y_tr)), reply_to=msg)


def secure_sums_reply(msg: Message, context: Context, data: NodeData,
                      work: NodeWork) -> Message:
    """SecAgg+'s fit instruction: this node's Gram statistics, scaled, for the masked sum
    (:mod:`gems_fl.protocol.secure`), around the center it kept in round 1."""
    own = secure.own_space(context)
    if own is None:
        raise RuntimeError("secure aggregation: this node kept no space from round 1")
    x_tr, y_tr, _, _ = data.arrays
    if work.dp is not None:  # the one noised draw of round 1, never a second
        stats = private.secure_blocks(private.kept_release(context), len(y_tr))
    else:
        stats = secure.node_statistics(x_tr, y_tr, own[0], data.num_classes,
                                       work.space.gram_rank,
                                       class_grams=work.space.sends_class_grams)
    return Message(content=secure.secure_fit_reply(msg, stats, len(y_tr), data.seed),
                   reply_to=msg)


def _space_metrics(local: LocalSpace, eps: float) -> dict[str, float]:
    """Round 1's metrics of a node that sends no model (secure aggregation, DP)."""
    cert = local.layer.certified_radius
    return {"radius": local.space.radius, "certified-radius": -1.0 if math.isinf(cert) else cert,
            "eps": eps, "num-train-examples": local.num_train,
            "num-val-examples": local.num_val, "local-val-accuracy": local.val_accuracy,
            **(local.solve_metrics or {})}


def _private_reply(context: Context, local: LocalSpace, data: NodeData, work: NodeWork,
                   secure_prepare: bool) -> RecordDict:
    """Round 1 under ``dp-epsilon``: keep the own space, draw the noised sums once and send
    them (or, under secure aggregation, keep them for SecAgg+ and send their bounds)."""
    space = local.space
    secure.keep_own_space(context, space.matrix, space.radius, local.layer.certified_radius)
    x_tr, y_tr, _, _ = data.arrays
    spec = work.dp
    release = private.node_release(x_tr, y_tr, data.num_classes, spec, data.seed,
                                   seeded_noise=work.dp_seeded_noise)
    logger.info("node %s: differentially private release, epsilon %g delta %g, rows clipped "
                "to %g, noise std %.4g", data.name, spec.epsilon, spec.delta, spec.clip,
                spec.sigma)
    metrics = _space_metrics(local, work.eps)
    if secure_prepare:
        private.keep_release(context, release)
        bounds = secure.bounds(private.secure_blocks(release, len(y_tr)))
        return secure.encode_prepare_reply({**metrics, **bounds}, secure.DP_BLOCKS)
    return private.encode_release_reply(metrics, release)


def spaces_reply(msg: Message, context: Context, data: NodeData, work: NodeWork,
                 config: dict) -> Message:
    """The ``spaces`` round (round 1) or a ``layer`` round of the MLP (``config``: the
    message's decoded settings and keys): data -> local model -> good-enough space ->
    reply (noised sums under DP, metrics and bounds under secure aggregation)."""
    if model_kind(work.training.model).rows_beside and work.space.label_moments:
        # the logistic family's class statistics on the rows' own columns (the agreed count)
        work = replace(work, space=replace(work.space,
                                           linear_columns=int(config.get(FEATURES_KEY, 0))))
    with compute_threads():  # one thread count for training and the search after it
        if model_kind(work.training.model).layerwise:
            content = _layer_round_reply(msg, work, data.num_classes, data.arrays, data.seed)
            return Message(content=content, reply_to=msg)
        local = build_local_space(*data.arrays, data.num_classes, work, seed=data.seed)
    keep_own_factor(context, local.layer.factor, local.layer.residual, local.layer.factor_means)
    logger.info(
        "node %s (%s): %d train / %d val, val acc %.3f, %s radius %.4f (certified %.4g)",
        data.name, data.source, local.num_train, local.num_val,
        local.val_accuracy, work.space.kind, local.space.radius, local.layer.certified_radius,
    )
    if work.dp is not None:  # differential privacy: noised sums, no model
        return Message(content=_private_reply(context, local, data, work,
                                              secure.SECURE_PREPARE_KEY in config), reply_to=msg)
    if secure.SECURE_PREPARE_KEY in config:  # secure aggregation: metrics and bounds only
        space = local.space
        secure.keep_own_space(context, space.matrix, space.radius, local.layer.certified_radius)
        x_tr, y_tr, _, _ = data.arrays
        stats = secure.node_statistics(x_tr, y_tr, space.matrix, data.num_classes,
                                       work.space.gram_rank,
                                       class_grams=work.space.sends_class_grams)
        return Message(content=secure.encode_prepare_reply({
            **_space_metrics(local, work.eps), **secure.bounds(stats)},
            secure.blocks_for(False, class_grams=work.space.sends_class_grams)),
            reply_to=msg)
    content = encode_layer_space(local.layer, data.num_features, data.num_classes,
                                 eps=work.eps, num_train=local.num_train,
                                 num_val=local.num_val, val_accuracy=local.val_accuracy,
                                 solve=local.solve_metrics)
    return Message(content=content, reply_to=msg)


def evaluate_reply(msg: Message, context: Context, data: NodeData, work: NodeWork) -> Message:
    """An evaluate message: score the server's models on this node's own data (validation
    split, and its test split where it holds one) against its own eps."""
    return Message(content=score_models(msg.content, work.eps, data.x_val, data.y_val,
                                        data.x_test, data.y_test, x_train=data.x_train,
                                        y_train=data.y_train,
                                        gram_rank=work.space.gram_rank,
                                        kept=secure.own_space(context),
                                        gram=kept_gram(context)), reply_to=msg)


def identity_reply(msg: Message, data: NodeData, *, with_stats: bool) -> Message:
    """A query message: this node's name, the shape of its data, the class names it holds
    and, ``with_stats`` (``standardize='federated'``), per-feature sums of its training
    rows."""
    return Message(content=identity_content(data, with_stats=with_stats), reply_to=msg)


def identity_content(data: NodeData, *, with_stats: bool) -> RecordDict:
    """The content of :func:`identity_reply` (also what ``gems-fl run --site`` checks
    the site files with before anything starts)."""
    stats = feature_stats(data.x_train) if with_stats else None
    return wire.encode_identity(
        data.name, data.source, num_features=data.num_features, num_classes=data.num_classes,
        num_train=len(data.y_train), num_val=len(data.y_val), labels=data.present_classes,
        stats=stats, num_test=0 if data.y_test is None else len(data.y_test),
        columns=data.columns, notes=data.notes, categories=data.categories)
