"""The MLP protocol's local models, rebuilt on the server for the baselines.

Local, Averaged and Ensemble need every node's full local MLP, which the protocol never
sends (nodes send one layer of neuron balls at a time). In simulation the server holds
the data, so it retrains each node's round-1 model with the node's own seed: the same
code and seed give the same model, and the results record whether the retrained first
layers equal the ones the nodes actually sent.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from gems_fl.data.nodes import node_seed
from gems_fl.learning.models import MLP
from gems_fl.learning.recipe import LocalTraining
from gems_fl.protocol.node_layerwise import round_seed, train_local_mlp


def reproduce_local_models(training: LocalTraining, seed: int, node_parts: list[tuple],
                           num_classes: int) -> list[MLP]:
    """Each node's round-1 local MLP, retrained from its data and the run's ``seed``
    as the node trained it (``training``: the run's local training)."""
    return [
        train_local_mlp(x_tr, y_tr, num_classes, training, [],
                        round_seed(node_seed(seed, k), 1))
        for k, (x_tr, y_tr, _, _) in enumerate(node_parts)
    ]


def first_layer_matches(models: list[MLP], sent: list[np.ndarray]) -> bool:
    """Whether the retrained first layers are exactly the ones the nodes sent."""
    mine = sorted(np.concatenate([m.hidden[0].weight.detach().double().numpy(),
                                  m.hidden[0].bias.detach().double().numpy()[:, None]], 1).tobytes()
                  for m in models)
    return mine == sorted(np.asarray(c, dtype=np.float64).tobytes() for c in sent)


def average_models(models: list[MLP]) -> MLP:
    """Parameter mean of same-shaped MLPs."""
    avg = copy.deepcopy(models[0])
    state = {k: torch.stack([m.state_dict()[k] for m in models]).mean(0) for k in avg.state_dict()}
    avg.load_state_dict(state)
    return avg
