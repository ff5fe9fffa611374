"""A node's work in the layer-wise (MLP) protocol: one round per hidden layer, then one.

Round ``j <= L``: insert the aggregated layers ``1..j-1`` frozen, (re)train the layers
above, and describe every neuron of layer ``j`` by a good-enough ball over its
``[incoming weights; bias]``. Round ``L + 1``: train the output layer on top of all
aggregated hidden layers and describe it by a convex ball or ellipsoid.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gems_fl.geometry.kinds import LayerSpace, build_layer_space, space_kind
from gems_fl.geometry.neurons import neuron_radii
from gems_fl.learning.model_kinds import MLP_KIND
from gems_fl.learning.models import MLP, build_model
from gems_fl.learning.recipe import LocalTraining
from gems_fl.learning.threads import single_thread
from gems_fl.learning.train import accuracy
from gems_fl.protocol.options import NodeWork

Layer = tuple[np.ndarray, np.ndarray]  # (weight (out, in), bias (out,))


def round_seed(seed: int, round_index: int) -> int:
    """Seed of one node's training in one round."""
    return seed + 1_000_003 * round_index


def build_partial_mlp(
    num_features: int, num_classes: int, training: LocalTraining, fixed: list[Layer], seed: int
) -> MLP:
    """An MLP whose first ``len(fixed)`` hidden layers are the given frozen layers.

    The layers above take their configured widths and a fresh (seeded) initialisation,
    since their input width is whatever the server's aggregation decided.
    """
    widths = [w.shape[0] for w, _ in fixed] + list(training.hidden[len(fixed):])
    torch.manual_seed(seed)
    model = build_model(MLP_KIND.name, num_features, num_classes, widths, training.dropout)
    for layer, (weight, bias) in zip(model.hidden, fixed):
        layer.weight.data = torch.as_tensor(weight, dtype=torch.float32).clone()
        layer.bias.data = torch.as_tensor(bias, dtype=torch.float32).clone()
        layer.weight.requires_grad_(False)
        layer.bias.requires_grad_(False)
    return model


def train_local_mlp(
    x: np.ndarray, y: np.ndarray, num_classes: int, training: LocalTraining,
    fixed: list[Layer], seed: int, *, output_only: bool = False,
) -> MLP:
    """Build the round's model and train it (Adam, until training accuracy converges)."""
    model = build_partial_mlp(x.shape[1], num_classes, training, fixed, seed)
    if output_only:
        for layer in model.hidden:
            layer.requires_grad_(False)
    training.recipe.train(model, x, y, seed)
    return model


@torch.no_grad()
def layer_inputs(model: MLP, x: np.ndarray, layer_index: int) -> np.ndarray:
    """Inputs of hidden layer ``layer_index`` (0-based) on ``x``, dropout off."""
    model.eval()
    return model.features(torch.as_tensor(x, dtype=torch.float32), upto=layer_index).double().numpy()


@dataclass
class NeuronSpaces:
    """Layer ``j``'s neurons as balls: rows ``[weight | bias]`` and one radius each."""

    weight: np.ndarray
    bias: np.ndarray
    radius: np.ndarray
    val_accuracy: float


def hidden_layer_spaces(
    x_tr: np.ndarray, y_tr: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
    num_classes: int, work: NodeWork, fixed: list[Layer], seed: int,
) -> NeuronSpaces:
    """Round ``len(fixed) + 1``: train, then per-neuron radii of the next hidden layer."""
    model = train_local_mlp(x_tr, y_tr, num_classes, work.training, fixed, seed)
    j = len(fixed)
    z = layer_inputs(model, x_val, j)
    layer = model.hidden[j]
    weight = layer.weight.detach().double().numpy()
    bias = layer.bias.detach().double().numpy()
    with single_thread():  # a stream of small ops: see geometry.neurons
        radii = neuron_radii(weight, bias, z, work.neuron_search(seed)).radii
    return NeuronSpaces(weight, bias, np.asarray(radii, dtype=np.float64),
                        accuracy(model, x_val, y_val))


def output_layer_space(
    x_tr: np.ndarray, y_tr: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
    num_classes: int, work: NodeWork, fixed: list[Layer], seed: int,
) -> tuple[LayerSpace, float]:
    """Final round: train the output layer on frozen hidden layers; its convex space
    over the hidden features (training features for a Gram matrix, validation features
    for the radius search)."""
    model = train_local_mlp(x_tr, y_tr, num_classes, work.training, fixed, seed,
                            output_only=True)
    center = np.concatenate([model.output.weight.detach().double().numpy(),
                             model.output.bias.detach().double().numpy()[:, None]], axis=1)
    train = ((layer_inputs(model, x_tr, len(fixed)), y_tr)
             if space_kind(work.space.kind).needs_train_inputs else None)
    layer = build_layer_space(center, train, layer_inputs(model, x_val, len(fixed)),
                              y_val, work.space, seed)
    return layer, accuracy(model, x_val, y_val)
