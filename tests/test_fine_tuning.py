"""Fine-tuning with held-out early stopping: the kept weights are the best on the
held-out rows (the start included), and the fixed recipe stays the paper's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from gems_fl.learning.recipe import TuneRecipe
from gems_fl.learning.train import accuracy, fine_tune_holdout


def _data(seed: int = 0, n: int = 200):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return x, y


def _holdout(x, y, fraction, seed):
    order = np.random.default_rng(seed).permutation(len(y))
    held = order[:int(round(fraction * len(y)))]
    return x[held], y[held]


def test_the_kept_weights_are_the_best_epoch_on_the_held_out_rows():
    x, y = _data()
    torch.manual_seed(0)
    model = nn.Linear(5, 2)
    report = fine_tune_holdout(model, x, y, max_epochs=30, patience=30, holdout_fraction=0.25,
                               lr=0.05, batch_size=16, seed=1)
    assert report.stopped_by == "holdout" and report.epochs == 30
    hx, hy = _holdout(x, y, 0.25, 1)
    kept = accuracy(model, hx, hy)
    # replay the same run epoch by epoch: no epoch beats the kept weights on the held-out rows
    torch.manual_seed(0)
    replay = nn.Linear(5, 2)
    scores = [accuracy(replay, hx, hy)]
    for epochs in range(1, 31):
        torch.manual_seed(0)
        replay = nn.Linear(5, 2)
        fine_tune_holdout(replay, x, y, max_epochs=epochs, patience=10**6, holdout_fraction=0.25,
                          lr=0.05, batch_size=16, seed=1)
        scores.append(accuracy(replay, hx, hy))
    assert kept == pytest.approx(max(scores))


def test_a_model_that_tuning_would_spoil_is_kept_as_it_was():
    x, y = _data(1)
    model = nn.Linear(5, 2)
    with torch.no_grad():  # already the true rule: any noisy step can only lose held-out accuracy
        model.weight.copy_(torch.tensor([[-10.0, -5.0, 0, 0, 0], [10.0, 5.0, 0, 0, 0]]))
        model.bias.zero_()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = fine_tune_holdout(model, x, y, max_epochs=20, patience=3, holdout_fraction=0.2,
                               lr=1.0, batch_size=8, seed=0)
    assert report.best_epoch == 0 and report.epochs == 3  # stopped after patience epochs
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_the_recipe_keeps_the_papers_fixed_epochs_as_an_option():
    x, y = _data(2)
    fixed = TuneRecipe(epochs=4, lr=0.01, batch_size=32, stop="fixed")
    report = fixed.tune(nn.Linear(5, 2), x, y, seed=0)
    assert report.epochs == 4 and report.best_epoch is None
    assert "4 epochs" in fixed.describe()
    with pytest.raises(ValueError, match="stop='sometimes'"):
        TuneRecipe(epochs=4, lr=0.01, batch_size=32, stop="sometimes")
    assert not TuneRecipe(epochs=0, lr=0.01, batch_size=32, stop="fixed").active
    assert TuneRecipe(epochs=0, lr=0.01, batch_size=32, stop="holdout").active
