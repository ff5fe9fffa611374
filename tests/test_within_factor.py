"""A Gram matrix cut to a low-rank factor beside label moments: the factor is of the
within-class scatter, the class means come exactly from the moments, so a within-class
matrix built from sums of such Gram matrices (the LDA point's) is PSD by construction."""

from __future__ import annotations

import numpy as np
import pytest

from gems_fl.geometry.gram import (
    from_factor,
    gram_matrix,
    label_moments,
    mean_columns,
    within_root,
)
from gems_fl.geometry.kinds import node_gram
from gems_fl.geometry.pooled import class_priors_and_means, pooled_system


def _site(rng: np.random.Generator, rows: int, shares: list[float], d: int = 60):
    """Rows of 4 classes with far-apart means and correlated noise, in ``shares``."""
    centers = np.random.default_rng(0).normal(scale=4.0, size=(4, d))
    mix = np.random.default_rng(1).normal(size=(d, d)) / np.sqrt(d)
    y = rng.choice(4, size=rows, p=shares)
    x = centers[y] + rng.normal(size=(rows, d)) @ mix * rng.uniform(0.2, 2.0, size=d)
    return x, y


def _within(grams, moments, num_train) -> np.ndarray:
    """The pooled within-class matrix, as the LDA point forms it from the sums."""
    a, b = pooled_system(grams, moments, num_train, 0.0)
    d = a.shape[0] - 1
    prior, mu = class_priors_and_means(b)
    within = a[:d, :d] - (mu.T * prior) @ mu
    return (0.5 * (within + within.T)).numpy()


def test_a_factor_beside_label_moments_keeps_the_class_means_exactly():
    """``F F^T + diag(r) + C C^T``: at full rank it is the node's Gram matrix; cut, its
    diagonal is still exact and its within-class part PSD."""
    rng = np.random.default_rng(3)
    x, y = _site(rng, 400, [0.4, 0.3, 0.2, 0.1])
    moments, counts = label_moments(x, y, 4)
    exact = gram_matrix(x)
    full, factor, residual = node_gram(x, 61, classes=(y, moments, counts))
    assert factor.shape == (61, 61) and residual.shape == (61,)
    np.testing.assert_allclose(full, exact, atol=1e-4 * np.abs(exact).max())
    cut, factor, residual = node_gram(x, 5, classes=(y, moments, counts))
    means = mean_columns(moments, counts)
    np.testing.assert_array_equal(cut, from_factor(factor, residual, means))
    np.testing.assert_allclose(np.diag(cut), np.diag(exact), rtol=1e-5)
    # what the cut leaves of the within-class scatter is PSD: the class means never
    # outweigh it, as they may a cut of the whole matrix
    within = np.linalg.eigvalsh(cut - means @ means.T)
    assert within[0] > -1e-9 * within[-1]


def test_fewer_rows_than_inputs_give_the_same_within_factor_by_the_thin_svd():
    rng = np.random.default_rng(4)
    x, y = _site(rng, 30, [0.25, 0.25, 0.25, 0.25])  # 30 rows, 61 inputs
    moments, counts = label_moments(x, y, 4)
    means = mean_columns(moments, counts)
    root = within_root(x, y, means).numpy()
    np.testing.assert_allclose(root.T @ root, gram_matrix(x) - means @ means.T, atol=1e-4)
    assert np.all(root[:, -1] == pytest.approx(0.0, abs=1e-6))  # the bias column is centred
    thin = node_gram(x, 8, classes=(y, moments, counts))[0]
    # past TOP_EIGEN's size the dense path is LAPACK's: both the same matrix to float32
    dense_factor = node_gram(np.vstack([x, x]), 8, classes=(np.r_[y, y], moments, counts))[0]
    np.testing.assert_allclose(thin, dense_factor, atol=1e-4 * np.abs(thin).max())


def test_a_node_with_fewer_rows_than_inputs_never_forms_its_gram_matrix(monkeypatch):
    """Its metric stays factored (F, residual, class means), the same as the dense route
    builds from the whole matrix: the same factor, the residual to rounding."""
    import gems_fl.geometry.kinds as kinds
    from gems_fl.geometry.gram import FactoredGram

    rng = np.random.default_rng(5)
    x, y = _site(rng, 30, [0.4, 0.3, 0.2, 0.1])  # 30 rows, 61 inputs
    moments, counts = label_moments(x, y, 4)
    dense, dense_factor, dense_residual = node_gram(x, 8, exact=gram_matrix(x),
                                                    classes=(y, moments, counts))

    def refuse(*args, **kwargs):
        raise AssertionError("an (n, n) matrix was formed")
    for name in ("gram_matrix", "float32_gram", "from_factor"):
        monkeypatch.setattr(kinds, name, refuse)
    metric, factor, residual = node_gram(x, 8, classes=(y, moments, counts))
    assert isinstance(metric, FactoredGram) and metric.shape == (61, 61)
    np.testing.assert_array_equal(factor, dense_factor)
    np.testing.assert_allclose(residual, dense_residual, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(metric), dense, atol=1e-5 * np.abs(dense).max())
    diff = rng.normal(size=(4, 61))
    assert metric.quadratic(diff) == pytest.approx(float(np.sum((diff @ dense) * diff)), rel=1e-5)


def test_the_pooled_within_class_matrix_of_cut_factors_is_psd_by_construction():
    """Sites with different class mixes, each sending a rank-3 factor: the old form (the
    factor of the whole Gram matrix) leaves the pooled within-class matrix indefinite,
    which sent the LDA point to a full eigendecomposition; the within-class factor never."""
    rng = np.random.default_rng(7)
    mixes = [[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.4, 0.4]]
    sites = [_site(rng, 300, mix) for mix in mixes]
    stats = [label_moments(x, y, 4) for x, y in sites]
    moments = [m for m, _ in stats]
    num_train = [len(y) for _, y in sites]
    old = [node_gram(x, 3)[0] for x, _ in sites]
    new = [node_gram(x, 3, classes=(y, m, c))[0] for (x, y), (m, c) in zip(sites, stats)]
    old_low = np.linalg.eigvalsh(_within(old, moments, num_train))[0]
    new_eigen = np.linalg.eigvalsh(_within(new, moments, num_train))
    assert old_low < -1e-3 * new_eigen[-1]  # the case the change is for
    assert new_eigen[0] > -1e-9 * new_eigen[-1]


def test_the_server_and_the_nodes_evaluate_round_build_the_nodes_own_matrix(tmp_path, monkeypatch):
    """What the server decodes from the reply is the matrix the node's space was built with,
    bit for bit, and what the node kept for the evaluate round measures in that matrix."""
    from flwr.app import Context, RecordDict

    from gems_fl.geometry.kinds import SpaceOptions, build_layer_space
    from gems_fl.protocol import space_replies
    from gems_fl.protocol.node import encode_layer_space
    from gems_fl.protocol.node_store import ENV_VAR
    from gems_fl.protocol.verify import keep_own_factor, kept_gram

    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    rng = np.random.default_rng(2)
    x, y = _site(rng, 240, [0.5, 0.3, 0.2, 0.0], d=70)
    w = rng.normal(size=(4, 71)) * 0.01
    options = SpaceOptions(kind="gram", eps=0.0, num_directions=20, gram_rank=6,
                           label_moments=True)
    layer = build_layer_space(w, (x, y), x[:60], y[:60], options, seed=0)
    assert layer.factor.shape == (71, 6) and layer.factor_means.shape == (71, 3)
    content = encode_layer_space(layer, 70, 4, eps=0.0, num_train=240, num_val=60,
                                 val_accuracy=0.5)
    space, _ = space_replies.decode_reply(content, {"weight": (4, 70), "bias": (4,)}, "gram", 6,
                                          labels=True)
    np.testing.assert_array_equal(space.gram, layer.space.gram)
    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    keep_own_factor(context, layer.factor, layer.residual, layer.factor_means)
    diff = rng.normal(size=(4, 71))  # the evaluate round measures in that matrix, by its factor
    assert kept_gram(context).quadratic(diff) == pytest.approx(
        np.trace(diff @ layer.space.gram @ diff.T), rel=1e-9)
