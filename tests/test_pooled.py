"""The pooled points: the ridge least-squares classifier and the linear discriminant of all
nodes, from sums of their statistics."""

from __future__ import annotations

import numpy as np
import pytest

from gems_fl.geometry.gram import gram_matrix, label_moments
from gems_fl.geometry.points import aggregate_gram
from gems_fl.geometry.pooled import pooled_point
from gems_fl.geometry.spaces import GramSpace

C, D = 3, 4


def _data(seed: int, num: int = 300):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, num)
    x = rng.normal(size=(num, D)) + np.eye(C, D)[y] * 2.0
    return x, y


def _pooled_direct(x, y, ridge):
    xa = np.hstack([x, np.ones((len(x), 1))])
    yy = np.eye(C)[y]
    a = xa.T @ xa / len(x) + ridge * np.eye(D + 1)
    return np.linalg.solve(a, xa.T @ yy / len(x)).T


def _nodes(x, y, parts):
    grams, moments, counts = [], [], []
    for rows in parts:
        grams.append(gram_matrix(x[rows]))
        moments.append(label_moments(x[rows], y[rows], C)[0])
        counts.append(len(rows))
    return grams, moments, counts


@pytest.mark.parametrize("ridge", [0.0, 1e-3, 1e-1])
def test_pooled_point_is_the_pooled_ridge_fit_whatever_the_split(ridge):
    x, y = _data(0)
    direct = _pooled_direct(x, y, ridge)
    by_label = [np.flatnonzero(y == c) for c in range(C)]  # each node one class
    uneven = [np.arange(0, 20), np.arange(20, 250), np.arange(250, 300)]
    for parts in (by_label, uneven):
        got = pooled_point(*_nodes(x, y, parts), ridge=ridge)
        np.testing.assert_allclose(got, direct, rtol=1e-9, atol=1e-10)


def _spaces(x, y, parts, radii):
    """Each node's Gram space around its own least-squares model (radius per node, or one)."""
    grams, moments, counts = _nodes(x, y, parts)
    radii = np.broadcast_to(np.asarray(radii, dtype=np.float64), (len(parts),))
    spaces = []
    for rows, g, m, radius in zip(parts, grams, moments, radii):
        w = _pooled_direct(x[rows], y[rows], 1e-2)
        spaces.append(GramSpace(w.reshape(-1), g, float(radius), 0.0, m,
                                np.bincount(y[rows], minlength=C)))
    return spaces, counts


def _fit(w, a_b):
    a, b = a_b
    return float(((w @ a) * w).sum() - 2 * (b * w).sum())


def test_pooled_points_need_label_moments():
    x, y = _data(4)
    spaces, counts = _spaces(x, y, np.array_split(np.arange(len(y)), 2), 1.0)
    bare = [GramSpace(s.center, s.gram, s.radius) for s in spaces]
    with pytest.raises(ValueError, match="needs every node's label moments"):
        aggregate_gram(bare, counts, point="pooled")


def test_a_run_with_the_pooled_point(tmp_path):
    from tests.helpers import run_in_process

    results = run_in_process(3, tmp_path, **{"gram-point": "pooled", "label-moments": True,
                                            "label-division": "paper"})
    assert results["intersection"]["method"] == "pooled"
    assert results["rows"]["GEMS"]["accuracy"] > 0.5


def test_the_api_offers_the_pooled_points():
    from gems_fl.api import aggregate, node_space

    x, y = _data(5)
    parts = np.array_split(np.arange(len(y)), 3)
    spaces = [node_space(_pooled_direct(x[r], y[r], 1e-2), x[r], y[r], x[r], y[r], eps=0.5)
              for r in parts]
    merged = aggregate(spaces, gram_point="pooled")
    np.testing.assert_allclose(merged.weights, _pooled_direct(x, y, 1e-3), rtol=1e-6, atol=1e-6)


def test_pooled_lda_from_sums_is_the_lda_of_the_pooled_rows():
    """The LDA point from the nodes' Gram matrices and label moments equals LDA computed
    on all rows pooled (class means, shared within-class covariance, log priors), for any
    split of the rows; a class no node holds is never predicted."""
    from gems_fl.geometry.gram import gram_matrix, label_moments
    from gems_fl.geometry.pooled import pooled_lda

    rng = np.random.default_rng(3)
    x = rng.normal(size=(600, 6)) + np.repeat(np.eye(6)[:4] * 3, 150, axis=0)
    y = np.repeat(np.arange(4), 150)
    shrink = 0.05
    mu = np.stack([x[y == c].mean(0) for c in range(4)])
    prior = np.bincount(y, minlength=5) / len(y)
    within = sum(np.outer(r - mu[c], r - mu[c]) for r, c in zip(x, y)) / len(y)
    a = within + shrink * np.trace(within) / 6 * np.eye(6)
    w = np.linalg.solve(a, mu.T).T
    b = -0.5 * np.sum(w * mu, 1) + np.log(prior[:4])
    for parts in (np.array_split(np.arange(600), 3), np.array_split(rng.permutation(600), 5)):
        grams = [gram_matrix(x[p]) for p in parts]
        moments = [label_moments(x[p], y[p], 5)[0] for p in parts]
        point = pooled_lda(grams, moments, [len(p) for p in parts], shrink)
        assert point.shape == (5, 7)
        np.testing.assert_allclose(point[:4, :6], w, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(point[:4, 6], b, rtol=1e-8, atol=1e-10)
        scores = np.c_[x, np.ones(600)] @ point.T
        assert (scores.argmax(1) != 4).all()
    with pytest.raises(ValueError, match="shrinkage"):
        pooled_lda(grams, moments, [len(p) for p in parts], -1.0)


def test_lda_at_a_grid_of_shrinkages_is_each_shrinkage_alone_and_survives_an_indefinite_matrix():
    """The selection round's LDA grid from one pooled system: each value equals the point
    asked alone; where the within-class matrix is not positive definite (Gram matrices
    from low-rank factors) one eigendecomposition serves every value, and each is the
    minimum-norm solution of its own shrunk system."""
    from gems_fl.geometry.gram import from_factor, gram_matrix, label_moments, low_rank_factor
    from gems_fl.geometry.pooled import pooled_lda, pooled_ldas

    rng = np.random.default_rng(8)
    x = rng.normal(size=(400, 30)) * rng.uniform(0.2, 2.0, size=30)
    y = rng.integers(0, 4, size=400)
    x[np.arange(400), y] += 2.0
    parts = np.array_split(np.arange(400), 3)
    moments = [label_moments(x[p], y[p], 4)[0] for p in parts]
    counts = [len(p) for p in parts]
    shrinkages = [1e-3, 1e-2, 1e-1]
    exact = [gram_matrix(x[p]) for p in parts]
    factored = [from_factor(low_rank_factor(g, 6)) for g in exact]  # not PSD less the means
    for grams in (exact, factored):
        many = pooled_ldas(grams, moments, counts, shrinkages)
        for s, point in zip(shrinkages, many):
            np.testing.assert_allclose(point, pooled_lda(grams, moments, counts, s),
                                       rtol=1e-9, atol=1e-12)
    # the factored case really took the spectral path, and it is the min-norm solution
    import torch

    from gems_fl.geometry.linalg import cholesky_solve_right
    from gems_fl.geometry.pooled import class_priors_and_means, pooled_system

    a, b = pooled_system(factored, moments, counts, 0.0)
    prior, mu = class_priors_and_means(b)
    within = a[:30, :30] - (mu.T * prior) @ mu
    within = 0.5 * (within + within.T)
    shift = 1e-3 * float(torch.trace(within)) / 30
    assert cholesky_solve_right(within + shift * torch.eye(30), mu) is None
    lam, vec = np.linalg.eigh((within + shift * torch.eye(30)).numpy())
    keep = lam > 1e-10 * lam[-1]
    expected = (mu.numpy() @ vec[:, keep]) / lam[keep] @ vec[:, keep].T
    np.testing.assert_allclose(pooled_ldas(factored, moments, counts, [1e-3])[0][:, :30],
                               expected, rtol=1e-6, atol=1e-8)
