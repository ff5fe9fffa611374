"""Radius search: the guarantee it gives, and batched == one-at-a-time evaluation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gems_fl.geometry.fisher import diagonal_fisher, fisher_axes
from gems_fl.geometry.radius import (
    perturbed_accuracies,
    sample_directions,
    search_radius,
)
from gems_fl.learning.models import build_model, load_vector


def _one_at_a_time(center, x, y, directions, radius):
    """Reference: build each perturbed model and evaluate it with the torch model."""
    model = build_model("logistic", x.shape[1], center.shape[0]).double()
    accs = []
    for u in directions:
        load_vector(model, (center + radius * u.numpy()).reshape(-1))
        with torch.no_grad():
            pred = model(torch.as_tensor(x, dtype=torch.float64)).argmax(1).numpy()
        accs.append(np.mean(pred == y))
    return np.array(accs)


@pytest.mark.parametrize("radius", [0.0, 0.3, 1.0, 5.0])
def test_batched_equals_one_at_a_time(random_linear_problem, radius):
    p = random_linear_problem
    dirs = sample_directions(40, p["center"].shape, seed=3)
    batched = perturbed_accuracies(p["center"], p["x"], p["y"], dirs, radius).numpy()
    np.testing.assert_array_equal(batched, _one_at_a_time(p["center"], p["x"], p["y"], dirs, radius))


def test_batched_equals_one_at_a_time_ellipsoid(random_linear_problem):
    p = random_linear_problem
    axes = fisher_axes(diagonal_fisher(p["center"], p["x"]), 0.1)
    dirs = sample_directions(40, p["center"].shape, seed=4, axes=axes)
    batched = perturbed_accuracies(p["center"], p["x"], p["y"], dirs, 2.0).numpy()
    np.testing.assert_array_equal(batched, _one_at_a_time(p["center"], p["x"], p["y"], dirs, 2.0))


def _fresh_surface_accuracies(center, x, y, radius, seed, n=300, axes=None):
    dirs = sample_directions(n, center.shape, seed=seed, axes=axes)
    return perturbed_accuracies(center, x, y, dirs, radius).numpy()


@pytest.mark.parametrize("kind", ["ball", "ellipsoid"])
def test_radius_guarantee_on_real_validation_data(digits_node, kind):
    center, x, y = digits_node["center"], digits_node["x_val"], digits_node["y_val"]
    eps = 0.8
    axes = fisher_axes(diagonal_fisher(center, x), 0.1) if kind == "ellipsoid" else None
    res = search_radius(center, x, y, eps=eps, num_directions=500, r_max=4000.0,
                        delta=0.01, seed=11, axes=axes)
    assert res.center_passes and 0 < res.radius < 4000.0 and not res.saturated
    assert res.min_accuracy_at_radius >= eps
    # Fresh directions (another seed) at the returned radius, and inside the ball.
    fresh = _fresh_surface_accuracies(center, x, y, res.radius, seed=12345, axes=axes)
    assert fresh.min() >= eps
    inner = _fresh_surface_accuracies(center, x, y, 0.5 * res.radius, seed=999, axes=axes)
    assert inner.min() >= eps
    # A clearly larger radius: some direction fails.
    larger = _fresh_surface_accuracies(center, x, y, 2.0 * res.radius, seed=54321, axes=axes)
    assert larger.min() < eps


def test_returned_radius_was_tested_and_passed(random_linear_problem):
    p = random_linear_problem
    res = search_radius(p["center"], p["x"], p["y"], eps=0.6, num_directions=200,
                        r_max=100.0, delta=0.01, seed=5)
    dirs = sample_directions(200, p["center"].shape, seed=5)
    accs = perturbed_accuracies(p["center"], p["x"], p["y"], dirs, res.radius).numpy()
    assert accs.min() >= 0.6
    assert accs.min() == pytest.approx(res.min_accuracy_at_radius)
    # One delta further out, the same directions fail: bisection stopped at the edge.
    accs_out = perturbed_accuracies(p["center"], p["x"], p["y"], dirs, res.radius + 0.011).numpy()
    assert accs_out.min() < 0.6


def test_center_failing_q_gets_radius_zero(random_linear_problem):
    p = random_linear_problem
    res = search_radius(p["center"], p["x"], p["y"], eps=0.999, num_directions=10,
                        r_max=10.0, delta=0.01, seed=0)
    assert res.radius == 0.0 and not res.center_passes
    assert res.center_accuracy < 0.999


def test_saturated_search_returns_r_max(random_linear_problem):
    p = random_linear_problem
    res = search_radius(p["center"], p["x"], p["y"], eps=0.0, num_directions=10,
                        r_max=3.0, delta=0.01, seed=0)
    assert res.radius == 3.0 and res.saturated


def test_search_is_deterministic(random_linear_problem):
    p = random_linear_problem
    kw = dict(eps=0.6, num_directions=100, r_max=50.0, delta=0.01, seed=9)
    assert search_radius(p["center"], p["x"], p["y"], **kw) == search_radius(p["center"], p["x"], p["y"], **kw)


def test_bad_center_shape_is_rejected(random_linear_problem):
    p = random_linear_problem
    with pytest.raises(ValueError, match="features \\+ 1"):
        search_radius(p["center"][:, :-1], p["x"], p["y"], eps=0.5, num_directions=5,
                      r_max=1.0, delta=0.1, seed=0)


def test_fisher_closed_form_matches_autograd(random_linear_problem):
    p = random_linear_problem
    x, w = p["x"][:50], p["center"]
    fisher = diagonal_fisher(w, x)
    wt = torch.tensor(w, requires_grad=True)
    xa = torch.cat([torch.as_tensor(x), torch.ones(len(x), 1, dtype=torch.float64)], 1)
    expected = torch.zeros_like(wt)
    for n in range(len(x)):
        logp = torch.log_softmax(xa[n] @ wt.T, dim=0)
        probs = logp.exp().detach()
        for c in range(w.shape[0]):
            (g,) = torch.autograd.grad(logp[c], wt, retain_graph=True)
            expected += probs[c] * g * g
    np.testing.assert_allclose(fisher, (expected / len(x)).numpy(), rtol=1e-10, atol=1e-12)


def test_fisher_axes_paper_formula_collapses_on_a_zero_entry():
    fisher = np.array([[0.0, 1.0, 4.0], [0.5, 2.0, 100.0]])
    axes = fisher_axes(fisher, c=0.1, floor="paper")
    assert axes[0] == 1.0  # zero Fisher: the longest axis
    assert np.all(axes[1:] == 0.1)  # min F = 0, so every other ratio is clipped at c
    axes = fisher_axes(fisher + 1.0, c=0.1, floor="paper")
    np.testing.assert_allclose(axes, np.maximum(1.0 / (fisher.reshape(-1) + 1.0), 0.1))
    assert axes.min() >= 0.1 and axes.max() == 1.0


def test_fisher_axes_quantile_floor_keeps_following_the_fisher_information():
    fisher = np.array([[0.0, 0.0, 1.0, 2.0], [4.0, 8.0, 16.0, 1000.0]])
    axes = fisher_axes(fisher, c=0.01)  # default: 5 % quantile of the nonzero entries
    nonzero = fisher[fisher > 0]
    f_ref = np.quantile(nonzero, 0.05)
    flat = fisher.reshape(-1)
    assert np.all(axes[flat <= f_ref] == 1.0)  # zeros and the smallest entries: longest
    above = flat > f_ref
    np.testing.assert_allclose(axes[above], np.maximum(f_ref / flat[above], 0.01))
    # Not collapsed to c as the paper's formula is with a zero entry:
    assert len(np.unique(axes)) > 3
    with pytest.raises(ValueError, match="floor="):
        fisher_axes(fisher, c=0.1, floor="median")
