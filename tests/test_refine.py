"""Refinement rounds: the nodes' gradients, Bohning's step (never increases the pooled
loss), and refine-rounds through the real apps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.refine import bohning_step, pooled_gradient, softmax_gradient
from gems_fl.settings import Settings, SettingsError
from tests.helpers import run_in_process


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(30, 4)), rng.integers(0, 3, 30), rng.normal(size=(3, 5))
    grad, loss = softmax_gradient(w, x, y)
    eps = 1e-6
    for i, j in [(0, 0), (1, 4), (2, 2)]:
        up, down = w.copy(), w.copy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (softmax_gradient(up, x, y)[1] - softmax_gradient(down, x, y)[1]) / (2 * eps)
        assert grad[i, j] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
    assert loss > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4), st.floats(0.0, 1e-1))
def test_bohning_steps_never_increase_the_pooled_loss(seed, nodes, ridge):
    rng = np.random.default_rng(seed)
    parts = [(rng.normal(size=(n, 3)) * rng.uniform(0.1, 5), rng.integers(0, 4, n))
             for n in rng.integers(5, 40, nodes)]
    x = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    counts = [len(p[1]) for p in parts]
    pooled_gram = np.tensordot(np.array(counts) / sum(counts),
                               np.stack([gram_matrix(p[0]) for p in parts]), 1)
    w = rng.normal(size=(4, 4)) * 3
    loss = softmax_gradient(w, x, y)[1]
    for _ in range(5):
        g = pooled_gradient([softmax_gradient(w, *p)[0] for p in parts], counts)
        np.testing.assert_allclose(g, softmax_gradient(w, x, y)[0], atol=1e-12)
        w = bohning_step(w, g, pooled_gram, ridge)
        new = softmax_gradient(w, x, y)[1]
        assert new <= loss + 1e-12
        loss = new


def test_refine_rounds_need_gram_and_the_logistic_model():
    with pytest.raises(SettingsError, match="refine-rounds=2 .* space='gram' and model='logistic'"):
        Settings(refine_rounds=2, space="ball")
    with pytest.raises(SettingsError, match="model='logistic'"):
        Settings(refine_rounds=1, model="mlp")


def test_a_run_with_refinement_rounds_reports_each_round(tmp_path):
    results, grid = run_in_process(3, tmp_path, return_grid=True,
                                   **{"refine-rounds": 3, "label-division": "paper"})
    rounds = results["refinement"]
    assert [r["refine_round"] for r in rounds] == [0, 1, 2, 3]
    assert all(r["test_accuracy"] is not None for r in rounds)
    losses = [r["loss_before"] for r in rounds[1:]]
    assert all(b <= a + 1e-9 for a, b in zip(losses, losses[1:]))  # monotone
    assert rounds[-1]["test_accuracy"] == results["rows"]["GEMS"]["accuracy"]
    bytes_so_far = [r["cumulative_bytes"] for r in rounds]
    assert all(b > a for a, b in zip(bytes_so_far, bytes_so_far[1:]))
    train = [e for e in grid.exchanges if e["type"] == "train"]
    assert len(train) == 4 and train[1]["up"] < train[0]["up"]  # a gradient, not a space
    from gems_fl.evaluation.results import gems_note

    assert "then refined over 3 rounds" in gems_note(results)
