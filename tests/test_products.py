"""The pooled LDA point from rounds of Gram products (geometry.products)."""

import numpy as np
import pytest

from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.pooled import pooled_lda
from gems_lab.products import lda_by_products


def _nodes(seed=0, features=6, classes=3, held=3):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((n, features)) + k for k, n in enumerate((40, 60, 30))]
    ys = [rng.integers(0, held, len(x)) for x in xs]
    ys[2][:] = 0  # a node holding one class
    grams = [gram_matrix(x) for x in xs]
    moments = [np.eye(classes)[y].T @ np.c_[x, np.ones(len(x))] / len(x) for x, y in zip(xs, ys)]
    counts = [len(x) for x in xs]
    w = np.asarray(counts) / sum(counts)
    pooled_a = sum(wk * g for wk, g in zip(w, grams))
    pooled_b = sum(wk * m for wk, m in zip(w, moments))
    return grams, moments, counts, pooled_a, pooled_b


def _product(a):
    d = len(a) - 1
    calls = []

    def product(v):
        calls.append(v.shape)
        return (a @ np.vstack([v, np.zeros((1, v.shape[1]))]))[:d]
    return product, calls


def test_products_reach_the_pooled_lda_point_in_d_rounds():
    grams, moments, counts, a, b = _nodes()
    product, calls = _product(a)
    points = lda_by_products(product, b, np.diag(a), rounds=6)
    exact = pooled_lda(grams, moments, counts)
    errors = [np.abs(p - exact).max() for p in points]
    assert errors[0] > 1e-2  # one round is not the answer
    assert errors[-1] < 1e-9  # d rounds are, in exact arithmetic
    assert calls == [(6, 3)] * 6  # one model-sized product per round


def test_products_of_a_class_no_node_holds_keep_it_unpredicted():
    grams, moments, counts, a, b = _nodes(classes=4, held=3)  # class 3 held by no node
    product, _ = _product(a)
    last = lda_by_products(product, b, np.diag(a), rounds=6)[-1]
    np.testing.assert_allclose(last, pooled_lda(grams, moments, counts), atol=1e-9)
    assert np.all(last[3, :-1] == 0) and last[3, -1] < -10


def test_products_reject_bad_inputs_with_the_reason():
    _, _, _, a, b = _nodes()
    product, _ = _product(a)
    with pytest.raises(ValueError, match="rounds"):
        lda_by_products(product, b, np.diag(a), rounds=0)
    with pytest.raises(ValueError, match="shrinkage"):
        lda_by_products(product, b, np.diag(a), rounds=2, shrinkage=0.0)
    with pytest.raises(ValueError, match="diagonal has 3 entries"):
        lda_by_products(product, b, np.diag(a)[:3], rounds=2)
    with pytest.raises(ValueError, match="returned shape"):
        lda_by_products(lambda v: v[:2], b, np.diag(a), rounds=2)
