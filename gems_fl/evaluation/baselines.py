"""Server-side baselines and the accuracy of every row on the test set.

Rows: Global (trained on all nodes' training data pooled), Local (each node's own
model), Averaged (parameter mean of the local models), GEMS (``h_G``), GEMS tuned
(``h_G`` fine-tuned on the public sample), Raw (a fresh model trained on the public
sample with the very same recipe as the fine-tuning), and Raw converged (a fresh model
trained on the public sample until its training accuracy stops improving: the stronger
bar). All of them need data that only a simulation's server holds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from logging import INFO

import numpy as np
import torch
from flwr.common.logger import log

from gems_fl.learning.models import build_model, model_from_vector
from gems_fl.settings import Settings
from gems_fl.learning.train import accuracy, fine_tune, train_until_converged

ROW_NAMES = ("Global", "Local", "Averaged", "GEMS", "GEMS tuned", "Raw", "Raw converged")
NN_ROW_NAMES = ("Global", "Local", "Averaged", "Ensemble", "GEMS", "GEMS tuned", "Raw",
                "Raw converged")


@dataclass
class ServerData:
    """Data the server holds in a simulation (none of it is a node's)."""

    train_x: np.ndarray  # all nodes' training data pooled, for Global only
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    public_x: np.ndarray  # drawn from data that no node used
    public_y: np.ndarray
    num_classes: int
    node_parts: list = field(default_factory=list)  # (x_tr, y_tr, x_val, y_val) per node
    pool_x: np.ndarray | None = None  # the whole public pool (fine-tuning study)
    pool_y: np.ndarray | None = None


def draw_public_sample(
    x: np.ndarray, y: np.ndarray, size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``size`` rows drawn without replacement (seeded) from the public pool."""
    if size > len(y):
        raise ValueError(f"public sample of {size} requested but the pool holds {len(y)}")
    idx = np.random.default_rng(seed).choice(len(y), size=size, replace=False)
    return x[idx], y[idx]


def evaluate_rows(
    centers: list[np.ndarray], h_g: np.ndarray, data: ServerData, settings: Settings
) -> dict[str, dict[str, object]]:
    """Test accuracy of every row; rows that cannot be computed say why."""
    num_features = data.test_x.shape[1]
    num_classes = data.num_classes

    def test_acc(model: torch.nn.Module) -> float:
        return accuracy(model, data.test_x, data.test_y)

    def vector_acc(vector: np.ndarray) -> float:
        return test_acc(model_from_vector(vector, num_features, num_classes))

    recipe = dict(lr=settings.local_lr, batch_size=settings.batch_size,
                  max_epochs=settings.local_max_epochs, patience=settings.local_patience)
    rows: dict[str, dict[str, object]] = {}

    log(INFO, "Global: training on all %d node training samples pooled", len(data.train_y))
    torch.manual_seed(settings.seed)
    global_model = build_model(settings.model, num_features, num_classes)
    report = train_until_converged(global_model, data.train_x, data.train_y,
                                   seed=settings.seed, **recipe)
    rows["Global"] = {"accuracy": test_acc(global_model), "epochs": report.epochs}
    log(INFO, "Global: %d epochs, test accuracy %.4f", report.epochs, rows["Global"]["accuracy"])

    per_node = [vector_acc(c) for c in centers]
    rows["Local"] = {"accuracy": float(np.mean(per_node)), "per_node": per_node}
    rows["Averaged"] = {"accuracy": vector_acc(np.mean(centers, axis=0))}
    rows["GEMS"] = {"accuracy": vector_acc(h_g)}

    if len(data.public_y) == 0 or settings.public_samples == 0:
        reason = "public-samples=0: no public sample to tune on"
        for name in ("GEMS tuned", "Raw", "Raw converged"):
            rows[name] = {"accuracy": None, "skipped": reason}
        return rows
    tune = dict(epochs=settings.tune_epochs, lr=settings.tune_lr,
                batch_size=settings.batch_size, seed=settings.seed)
    log(INFO, "GEMS tuned and Raw: %d epochs on %d public samples; Raw converged: until "
        "convergence", settings.tune_epochs, len(data.public_y))
    tuned = model_from_vector(h_g, num_features, num_classes)
    fine_tune(tuned, data.public_x, data.public_y, **tune)
    rows["GEMS tuned"] = {"accuracy": test_acc(tuned)}

    torch.manual_seed(settings.seed + 1)
    raw = build_model(settings.model, num_features, num_classes)
    raw_converged = copy.deepcopy(raw)
    fine_tune(raw, data.public_x, data.public_y, **tune)
    rows["Raw"] = {"accuracy": test_acc(raw)}
    report = train_until_converged(raw_converged, data.public_x, data.public_y,
                                   seed=settings.seed, **recipe)
    rows["Raw converged"] = {"accuracy": test_acc(raw_converged), "epochs": report.epochs}
    return rows


def skipped_rows(reason: str, names: tuple[str, ...] = ROW_NAMES) -> dict[str, dict[str, object]]:
    """Every row marked as not computed, with the reason."""
    return {name: {"accuracy": None, "skipped": reason} for name in names}
