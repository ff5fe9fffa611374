"""Server-side rows for the layer-wise (MLP) protocol, evaluated on the test set.

Local, Averaged and Ensemble need every node's full local MLP, which the protocol never
sends (nodes send one layer of neuron balls at a time). In simulation the server holds
the data, so it retrains each node's round-1 model with the node's own seed: the same
code and seed give the same model, and the results record whether the retrained first
layers equal the ones the nodes actually sent.
"""

from __future__ import annotations

import copy
from logging import INFO

import numpy as np
import torch
from flwr.common.logger import log

from gems_fl.data.nodes import node_seed
from gems_fl.protocol.node_layerwise import round_seed, train_local_mlp
from gems_fl.learning.models import MLP, count_parameters
from gems_fl.settings import Settings
from gems_fl.learning.train import accuracy, fine_tune, predict, train_until_converged


def reproduce_local_models(settings: Settings, node_parts: list[tuple], num_classes: int) -> list[MLP]:
    """Each node's round-1 local MLP, retrained from its data and seed."""
    return [
        train_local_mlp(x_tr, y_tr, num_classes, settings, [], round_seed(node_seed(settings.seed, k), 1))
        for k, (x_tr, y_tr, _, _) in enumerate(node_parts)
    ]


def first_layer_matches(models: list[MLP], sent: list[np.ndarray]) -> bool:
    """Whether the retrained first layers are exactly the ones the nodes sent."""
    mine = sorted(np.concatenate([m.hidden[0].weight.detach().double().numpy(),
                                  m.hidden[0].bias.detach().double().numpy()[:, None]], 1).tobytes()
                  for m in models)
    return mine == sorted(np.asarray(c, dtype=np.float64).tobytes() for c in sent)


def ensemble_predict(models: list[MLP], x: np.ndarray, seed: int) -> np.ndarray:
    """Majority vote of ``models``; ties broken uniformly at random (seeded)."""
    votes = np.stack([predict(m, x) for m in models])  # (M, N)
    num_classes = int(votes.max()) + 1
    counts = np.zeros((x.shape[0], num_classes))
    for row in votes:
        counts[np.arange(len(row)), row] += 1
    rng = np.random.default_rng(seed)
    noise = rng.random(counts.shape)  # only decides between classes with the top count
    best = counts == counts.max(axis=1, keepdims=True)
    return np.argmax(np.where(best, noise, -1.0), axis=1)


def average_models(models: list[MLP]) -> MLP:
    """Parameter mean of same-shaped MLPs."""
    avg = copy.deepcopy(models[0])
    state = {k: torch.stack([m.state_dict()[k] for m in models]).mean(0) for k in avg.state_dict()}
    avg.load_state_dict(state)
    return avg


def evaluate_nn_rows(
    local_models: list[MLP], gems_model: MLP, data, settings: Settings  # noqa: ANN001
) -> dict[str, dict[str, object]]:
    """Test accuracy (and parameter count) of every row of the MLP table."""
    def acc(model: MLP) -> float:
        return accuracy(model, data.test_x, data.test_y)

    recipe = dict(lr=settings.local_lr, batch_size=settings.batch_size,
                  max_epochs=settings.local_max_epochs, patience=settings.local_patience)
    widths = settings.hidden_widths
    num_features, num_classes = data.test_x.shape[1], data.num_classes
    rows: dict[str, dict[str, object]] = {}

    log(INFO, "Global: training an MLP on all %d node training samples", len(data.train_y))
    torch.manual_seed(settings.seed)
    global_model = MLP(num_features, widths, num_classes, settings.dropout)
    train_until_converged(global_model, data.train_x, data.train_y, seed=settings.seed, **recipe)
    rows["Global"] = {"accuracy": acc(global_model), "parameters": count_parameters(global_model)}

    per_node = [acc(m) for m in local_models]
    rows["Local"] = {"accuracy": float(np.mean(per_node)), "per_node": per_node,
                     "parameters": count_parameters(local_models[0])}
    averaged = average_models(local_models)
    rows["Averaged"] = {"accuracy": acc(averaged), "parameters": count_parameters(averaged)}
    votes = ensemble_predict(local_models, data.test_x, settings.seed)
    rows["Ensemble"] = {"accuracy": float(np.mean(votes == data.test_y)),
                        "parameters": sum(count_parameters(m) for m in local_models)}
    rows["GEMS"] = {"accuracy": acc(gems_model), "parameters": count_parameters(gems_model),
                    "hidden_widths": [layer.out_features for layer in gems_model.hidden]}

    tune = dict(epochs=settings.tune_epochs, lr=settings.tune_lr,
                batch_size=settings.batch_size, seed=settings.seed)
    tuned = copy.deepcopy(gems_model)
    if settings.tune_layers == "last":
        for layer in tuned.hidden:
            layer.requires_grad_(False)
    log(INFO, "GEMS tuned (%s layer%s) and Raw: %d epochs on %d public samples",
        settings.tune_layers, "" if settings.tune_layers == "last" else "s",
        settings.tune_epochs, len(data.public_y))
    fine_tune(tuned, data.public_x, data.public_y, **tune)
    rows["GEMS tuned"] = {"accuracy": acc(tuned), "parameters": count_parameters(tuned),
                          "tuned_layers": settings.tune_layers}
    torch.manual_seed(settings.seed + 1)
    raw = MLP(num_features, widths, num_classes, settings.dropout)
    raw_converged = copy.deepcopy(raw)
    fine_tune(raw, data.public_x, data.public_y, **tune)
    rows["Raw"] = {"accuracy": acc(raw), "parameters": count_parameters(raw)}
    train_until_converged(raw_converged, data.public_x, data.public_y, seed=settings.seed, **recipe)
    rows["Raw converged"] = {"accuracy": acc(raw_converged), "parameters": count_parameters(raw_converged)}
    return rows
