"""The fine-tuning study: every starting model tuned the same way on growing samples.

For each public sample size ``n`` (setting ``tune-curve``), the server takes the first
``n`` rows of one seeded permutation of its public pool (so the samples are nested) and
fine-tunes, with the identical recipe (Adam, ``tune-lr``, ``batch-size``, and the
``tune-stop`` rule: held-out early stopping or ``tune-epochs`` fixed epochs):

- **GEMS tuned**: the aggregated model ``h_G`` (tuned as it is: the study compares
  starts, so the run row's ``tune-fresh`` choice of a fresh model is not made here);
- **Local tuned**: each node's local model (the row is their mean accuracy);
- **Averaged tuned**: the parameter mean of the local models;
- **Raw**: a freshly initialised model of the same architecture.

For an MLP, ``tune-layers`` says which layers of the three pretrained starting points
are updated (``auto``: the output layer or all, whichever scores better on the held-out
rows); Raw, having no trained hidden layer to keep, updates all.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from logging import INFO

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from gems_fl.extensions import StudyInputs
from gems_fl.learning.train import accuracy
from gems_fl.settings import Settings

CURVE_ROWS = ("GEMS tuned", "Local tuned", "Averaged tuned", "Raw")


def nested_samples(
    x: np.ndarray, y: np.ndarray, sizes: list[int], seed: int
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """For each size, the first ``size`` rows of one seeded permutation of ``(x, y)``."""
    if max(sizes) > len(y):
        raise ValueError(f"tune-curve asks for {max(sizes)} public samples but the public "
                         f"pool holds {len(y)}; use sizes up to {len(y)}")
    order = np.random.default_rng(seed).permutation(len(y))
    return {n: (x[order[:n]], y[order[:n]]) for n in sizes}


def fine_tuning_curve(
    gems_model: nn.Module,
    local_models: list[nn.Module],
    averaged_model: nn.Module,
    fresh_model: Callable[[], nn.Module],
    pool: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    settings: Settings,
) -> dict[str, object]:
    """Test accuracy of every curve row at every size of ``settings.tune_sizes``."""
    sizes = settings.tune_sizes
    samples = nested_samples(pool[0], pool[1], sizes, settings.seed)
    recipe = settings.tune_recipe

    def tuned_accuracy(start: nn.Module, x: np.ndarray, y: np.ndarray, pretrained: bool) -> float:
        model = copy.deepcopy(start)
        if pretrained:
            recipe.tune_trained(model, x, y, settings.seed, settings.tune_layers)
        else:
            recipe.tune(model, x, y, settings.seed)
        return accuracy(model, *test)

    curve: dict[str, list[float]] = {name: [] for name in CURVE_ROWS}
    for n in sizes:
        x, y = samples[n]
        log(INFO, "Fine-tuning study: %d public samples", n)
        curve["GEMS tuned"].append(tuned_accuracy(gems_model, x, y, True))
        curve["Local tuned"].append(float(np.mean(
            [tuned_accuracy(m, x, y, True) for m in local_models])))
        curve["Averaged tuned"].append(tuned_accuracy(averaged_model, x, y, True))
        torch.manual_seed(settings.seed + 1)
        curve["Raw"].append(tuned_accuracy(fresh_model(), x, y, False))
    return {"sizes": list(sizes), "accuracy": curve, "epochs": settings.tune_epochs,
            "stop": settings.tune_stop, "max_epochs": settings.tune_max_epochs,
            "lr": settings.tune_lr, "tuned_layers": settings.tune_layers}


def study(inputs: StudyInputs) -> dict[str, object]:
    """The ``fine-tuning`` study of the ``gems_fl.studies`` entry point: the run's
    :func:`fine_tuning_curve` (the ServerApp runs it when ``tune-curve`` is set)."""
    return fine_tuning_curve(inputs.gems_model, inputs.local_models, inputs.averaged_model,
                             inputs.fresh_model, inputs.pool, inputs.test,
                             Settings.from_run_config(inputs.run_config))
