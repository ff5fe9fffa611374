"""The exact local solve (gems_fl.learning.exact): it reaches its stated gradient
tolerance, its optimum is the problem's, it is deterministic, and a run's nodes use it for
the convex models (the paper's profile keeps Adam's epochs)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

from gems_fl.learning.exact import DEFAULT_L2, DEFAULT_TOLERANCE, solve_softmax
from gems_fl.learning.recipe import LocalTraining, TrainRecipe
from gems_fl.settings import Settings


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y


def _objective(w, x, y, l2):
    xa = np.hstack([x, np.ones((len(x), 1))]).astype(np.float64)
    logits = xa @ w.T
    logits -= logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -log_p[np.arange(len(y)), y].mean() + 0.5 * l2 * (w * w).sum()


def test_the_solve_reaches_its_tolerance_at_the_problems_optimum(digits):
    x, y = digits
    w, report = solve_softmax(x, y, 10)
    assert report.stopped_by == "tolerance"
    assert report.gradient_norm <= DEFAULT_TOLERANCE and report.l2 == DEFAULT_L2
    # an independent check of optimality: torch's own L-BFGS, run far longer in float64,
    # finds no lower objective than the solve's (to the tolerance's order)
    xt = torch.as_tensor(np.hstack([x, np.ones((len(x), 1))]), dtype=torch.float64)
    yt = torch.as_tensor(y)
    v = torch.zeros(10, 65, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([v], max_iter=3000, tolerance_grad=1e-10, tolerance_change=0,
                            history_size=50, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ v.T, yt) + 0.5 * DEFAULT_L2 * (v * v).sum()
        loss.backward()
        return loss

    opt.step(closure)
    reference = _objective(v.detach().numpy(), x, y, DEFAULT_L2)
    ours = _objective(w, x, y, DEFAULT_L2)
    assert ours == pytest.approx(report.objective, abs=1e-7)  # float32 products
    assert reference <= ours + 1e-8  # the reference is the (near-)exact optimum
    # strong convexity (modulus l2) bounds the gap by |g|^2 / (2 l2), |g|^2 <= entries * tol^2
    assert ours - reference <= w.size * report.gradient_norm ** 2 / (2 * DEFAULT_L2)


def test_the_same_rows_give_the_same_model_bit_for_bit(digits):
    x, y = digits
    first, a = solve_softmax(x[:600], y[:600], 10)
    second, b = solve_softmax(x[:600], y[:600], 10)
    assert first.tobytes() == second.tobytes() and a.iterations == b.iterations


def test_a_label_skewed_site_converges_and_keeps_absent_classes_unlikely(digits):
    x, y = digits
    rows = np.isin(y, [0, 1])
    w, report = solve_softmax(x[rows], y[rows], 10)
    assert report.stopped_by == "tolerance"
    logits = x[rows] @ w[:, :-1].T + w[:, -1]
    assert np.all(np.argmax(logits, 1) < 2)  # never predicts a class it never saw


def test_bad_input_is_refused_with_what_to_fix(digits):
    x, y = digits
    with pytest.raises(ValueError, match="NaN"):
        solve_softmax(np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x), y, 10)
    with pytest.raises(ValueError, match="labels must lie in 0..4"):
        solve_softmax(x, y, 5)
    with pytest.raises(ValueError, match="positive L2"):
        solve_softmax(x, y, 10, l2=0.0)
    with pytest.raises(ValueError, match="no training rows"):
        solve_softmax(x[:0], y[:0], 10)


def test_a_node_solves_convex_models_exactly_and_the_paper_profile_keeps_adam():
    assert Settings().local_training.exact
    assert not Settings.from_run_config({"lab": "profile=paper"}).local_training.exact
    assert not Settings(model="mlp").local_training.exact  # the MLP trains by epochs
    # auto: the kernel model's features need hundreds of iterations where Adam's epochs
    # stop in seconds (ModelKind.exact_solve); asked for, it is solved exactly
    assert not Settings(model="kernel").local_training.exact
    assert Settings(model="kernel", local_solve="exact").local_training.exact
    recipe = TrainRecipe(lr=1e-3, batch_size=32, max_epochs=2, patience=1)
    with pytest.raises(ValueError, match="solve=.newton. is not one of auto, exact, adam"):
        LocalTraining("logistic", (), 0.5, recipe, solve="newton")


def test_a_nodes_reply_reports_its_solve(digits):
    from gems_fl.protocol.node import build_local_space, encode_layer_space
    from gems_fl.protocol.replies import read_metrics
    from gems_fl.settings.options import node_work

    x, y = digits
    work = node_work(Settings())
    local = build_local_space(x[:800], y[:800], x[800:1000], y[800:1000], 10, work, seed=0)
    content = encode_layer_space(local.layer, 64, 10, eps=0.4, num_train=800, num_val=200,
                                 val_accuracy=local.val_accuracy, solve=local.solve_metrics)
    metrics = read_metrics(content)
    assert metrics["solve-gradient-norm"] <= DEFAULT_TOLERANCE
    assert metrics["solve-iterations"] >= 2 and metrics["solve-l2"] == DEFAULT_L2


def test_a_site_may_choose_epochs_for_itself():
    """A site whose rows do not fit in memory at once trains by epochs: its own
    ``--node-config "local-solve='adam'"`` overrides the run's exact solve."""
    received = Settings.from_node_config(Settings().for_nodes())
    assert received.local_training.exact
    assert not received.for_node({"local-solve": "adam"}).local_training.exact
