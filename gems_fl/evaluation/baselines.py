"""Server-side baselines and the accuracy of every row on the test set.

Rows: Global (trained on all nodes' training data pooled), Local (each node's own
model), Averaged (parameter mean of the local models), Ensemble (MLP only: the local
models' majority vote), GEMS (``h_G``), GEMS tuned
(``h_G`` fine-tuned on the public sample), Raw (a fresh model trained on the public
sample with the very same recipe as the fine-tuning), and Raw converged (a fresh model
trained on the public sample until its training accuracy stops improving: the stronger
bar). All of them need data that only a simulation's server holds.

Which rows a run computes is ``baselines``: ``cheap`` (the default) scores the models the
run already has (GEMS, Local, Averaged, Ensemble); ``all`` adds the rows that train on the
server (Global, GEMS tuned, Raw, Raw converged); ``none`` scores GEMS alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from logging import INFO

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from gems_fl.evaluation.server_data import PublicData, ServerData
from gems_fl.learning.models import count_parameters
from gems_fl.learning.recipe import LocalTraining, TuneRecipe
from gems_fl.learning.train import accuracy, predict

ROW_NAMES = ("Global", "Local", "Averaged", "GEMS", "GEMS tuned", "Raw", "Raw converged")
NN_ROW_NAMES = ("Global", "Local", "Averaged", "Ensemble", "GEMS", "GEMS tuned", "Raw",
                "Raw converged")  # the MLP table adds the local models' majority vote
#: the rows each ``baselines`` value leaves out
LEFT_OUT = {"all": (), "cheap": ("Global", "GEMS tuned", "Raw", "Raw converged"),
            "none": ("Global", "Local", "Averaged", "Ensemble", "GEMS tuned", "Raw",
                     "Raw converged")}


@dataclass(frozen=True)
class ComparisonOptions:
    """What the comparison rows read of the run's settings
    (``gems_fl.settings.options.comparison_options`` builds it)."""

    seed: int
    rows: str  # ``baselines``: cheap, all or none (see :data:`LEFT_OUT`)
    training: LocalTraining  # the local models' kind and recipe: Global, Raw's start
    tune: TuneRecipe  # GEMS tuned and Raw
    tune_layers: str
    public_samples: int
    public_data: str


def row_names(layerwise: bool, baselines: str = "all") -> tuple[str, ...]:
    """The results table's rows for the model kind and ``baselines``, in table order."""
    return tuple(n for n in (NN_ROW_NAMES if layerwise else ROW_NAMES)
                 if n not in LEFT_OUT[baselines])


@dataclass
class Candidates:
    """The models a run compares, whatever the model kind.

    ``local`` maps each node's name to its local model; ``ensemble`` adds the majority
    vote of the local models as a row (the MLP table's Ensemble).
    """

    gems: nn.Module
    local: dict[str, nn.Module]
    averaged: nn.Module | None  # None with no local model (secure aggregation)
    ensemble: bool = False


def evaluate_rows(
    models: Candidates, data: ServerData, settings: ComparisonOptions
) -> dict[str, dict[str, object]]:
    """Test accuracy (and parameter count) of every row; rows that cannot be computed
    say why. One path for the logistic model and the MLP."""
    wanted = set(row_names(models.ensemble, settings.rows))
    rows: dict[str, dict[str, object]] = {}
    if "Global" in wanted:
        rows["Global"] = _global_row(data, settings)
    rows.update(_local_rows(models, data, settings, wanted))
    hidden = getattr(models.gems, "hidden", None)
    rows["GEMS"] = _test_row(models.gems, data, **(
        {"hidden_widths": [layer.out_features for layer in hidden]} if hidden is not None else {}))
    if "Raw" in wanted:
        rows.update(_public_rows(models.gems, data, settings))
    return rows


def _test_row(model: nn.Module, data: ServerData, **extra: object) -> dict[str, object]:
    return {"accuracy": accuracy(model, data.test_x, data.test_y),
            "parameters": count_parameters(model), **extra}


def _global_row(data: ServerData, settings: ComparisonOptions) -> dict[str, object]:
    """Global: the model trained on every node's training rows pooled (where the server
    holds them)."""
    rows = data.with_all_rows()
    if len(rows.train_y) == 0:
        return {"accuracy": None, "skipped": "the server holds no node data (dataset='node-files')"}
    log(INFO, "Global: training on all %d node training samples pooled", len(rows.train_y))
    torch.manual_seed(settings.seed)
    global_model = settings.training.new_model(data.test_x.shape[1], data.num_classes)
    report = settings.training.recipe.train(global_model, rows.train_x, rows.train_y,
                                            settings.seed)
    row = _test_row(global_model, data, epochs=report.epochs)
    log(INFO, "Global: %d epochs, test accuracy %.4f", report.epochs, row["accuracy"])
    return row


def _local_rows(models: Candidates, data: ServerData, settings: ComparisonOptions,
                wanted: set[str]) -> dict[str, dict[str, object]]:
    """Local (the mean of the nodes' own models), Averaged and Ensemble, where wanted and
    the server holds the nodes' models."""
    rows: dict[str, dict[str, object]] = {}
    if "Local" in wanted and models.local:
        per_node = {name: accuracy(m, data.test_x, data.test_y)
                    for name, m in models.local.items()}
        first = next(iter(models.local.values()))
        rows["Local"] = {"accuracy": float(np.mean(list(per_node.values()))),
                         "per_node": per_node, "parameters": count_parameters(first)}
        rows["Averaged"] = _test_row(models.averaged, data)
    elif "Local" in wanted:
        for name in ("Local", "Averaged"):
            rows[name] = {"accuracy": None, "skipped": "secure-aggregation or dp-epsilon: "
                          "the server holds no node's model"}
    if "Ensemble" in wanted and models.local:
        local = list(models.local.values())
        votes = ensemble_predict(local, data.test_x, settings.seed)
        rows["Ensemble"] = {"accuracy": float(np.mean(votes == data.test_y)),
                            "parameters": sum(count_parameters(m) for m in local)}
    return rows


def _public_rows(gems: nn.Module, data: ServerData,
                 settings: ComparisonOptions) -> dict[str, dict[str, object]]:
    """GEMS tuned, Raw and Raw converged: on the public sample, where there is one."""
    num_features, num_classes = data.test_x.shape[1], data.num_classes
    rows: dict[str, dict[str, object]] = {}
    if len(data.public_y) == 0 or settings.public_samples == 0:
        reason = ("public-data holds a test split only: no public sample to tune on"
                  if settings.public_data.strip() and settings.public_samples else
                  "public-samples=0: no public sample to tune on")
        return {name: {"accuracy": None, "skipped": reason}
                for name in ("GEMS tuned", "Raw", "Raw converged")}
    tune = settings.tune
    log(INFO, "GEMS tuned (tune-layers=%s) and Raw: %s on %d public samples; Raw "
        "converged: until convergence", settings.tune_layers, tune.describe(),
        len(data.public_y))
    tuned, report = tune.tune_or_fresh(copy.deepcopy(gems), data.public_x,
                                       data.public_y, settings.seed, settings.tune_layers,
                                       lambda: raw_start(settings, num_features, num_classes))
    rows["GEMS tuned"] = _test_row(tuned, data, tuned_layers=report.layers, **_tuned(report))
    if report.rival_score is not None:
        log(INFO, "GEMS tuned: kept %s (held-out accuracy %.4f) over %s (%.4f)",
            "a fresh model trained to convergence" if report.fresh else "the tuned h_G",
            report.holdout_score[0],
            "the tuned h_G" if report.fresh else "a fresh model trained to convergence",
            report.rival_score[0])
    raw = raw_start(settings, num_features, num_classes)
    raw_converged = copy.deepcopy(raw)
    report = tune.tune(raw, data.public_x, data.public_y, settings.seed)
    rows["Raw"] = _test_row(raw, data, **_tuned(report))
    report = settings.training.recipe.train(raw_converged, data.public_x, data.public_y,
                                            settings.seed)
    rows["Raw converged"] = _test_row(raw_converged, data, epochs=report.epochs)
    return rows


def raw_start(settings: ComparisonOptions, num_features: int, num_classes: int) -> nn.Module:
    """Raw's fresh start (seeded ``seed + 1``), the same model at every call."""
    torch.manual_seed(settings.seed + 1)
    return settings.training.new_model(num_features, num_classes)


def _tuned(report) -> dict[str, object]:
    """How a fine-tuning went, for its row: epochs run and, held out, the epoch kept
    (``fresh``: a fresh model trained to convergence scored better there and was kept)."""
    out: dict[str, object] = {}
    if report.rival_score is not None:  # tune-fresh compared the two on the held-out rows
        out = {"fresh": report.fresh, "held_out_accuracy": report.holdout_score[0],
               "other_held_out_accuracy": report.rival_score[0]}
    if report.fresh:
        return {**out, "epochs": report.epochs}
    out["tune_epochs"] = report.epochs
    if report.best_epoch is not None:
        out["kept_epoch"] = report.best_epoch
    if report.shrink is not None:
        out["start_shrunk_by"] = report.shrink
    return out


def ensemble_predict(models: list[nn.Module], x: np.ndarray, seed: int) -> np.ndarray:
    """Majority vote of ``models``; ties broken uniformly at random (seeded)."""
    votes = np.stack([predict(m, x) for m in models])  # (M, N)
    num_classes = int(votes.max()) + 1
    counts = np.zeros((x.shape[0], num_classes))
    for vote in votes:
        counts[np.arange(len(vote)), vote] += 1
    rng = np.random.default_rng(seed)
    noise = rng.random(counts.shape)  # only decides between classes with the top count
    best = counts == counts.max(axis=1, keepdims=True)
    return np.argmax(np.where(best, noise, -1.0), axis=1)


def skipped_rows(reason: str, names: tuple[str, ...] = ROW_NAMES) -> dict[str, dict[str, object]]:
    """Every row marked as not computed, with the reason."""
    return {name: {"accuracy": None, "skipped": reason} for name in names}


def tune_on_public(run, public: PublicData, settings: ComparisonOptions, num_features: int,
                   num_classes: int) -> dict[str, dict[str, np.ndarray]]:
    """GEMS tuned and Raw, trained on the server's public data with the same recipe as the
    server-side rows, as state dicts for the evaluate round (the nodes score them)."""
    if len(public.y) == 0 or not settings.tune.active:
        return {}
    tune = settings.tune
    tuned, _ = tune.tune_or_fresh(copy.deepcopy(run.gems_model), public.x, public.y,
                                  settings.seed, settings.tune_layers,
                                  lambda: raw_start(settings, num_features, num_classes))
    raw = raw_start(settings, num_features, num_classes)
    tune.tune(raw, public.x, public.y, settings.seed)
    as_state = lambda m: {k: v.detach().cpu().numpy() for k, v in m.state_dict().items()}
    return {"gems-tuned": as_state(tuned), "raw": as_state(raw)}
