"""The server's pooled solves without full-size temporaries (the kernel model's selection
round solves several 4,252-square systems at once): the same numbers as the plain
expressions, formed once, factored in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gems_fl.geometry.gram import FactoredGram, gram_matrix, label_moments
from gems_fl.geometry.gram_sums import FRACTION_BITS, GramSums
from gems_fl.geometry.linalg import (
    EIGEN_FLOOR,
    cholesky_solve_right,
    spectral_solve_right,
    symmetrize_,
)
from gems_fl.geometry.points import SummedStatistics, solve_point
from gems_fl.geometry.pooled import (
    class_priors_and_means,
    lda_classifier,
    pooled_ldas,
    pooled_point,
)

C, D = 3, 11


def _nodes(rows: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for k in range(3):
        y = rng.integers(0, C, rows + k)
        x = rng.normal(size=(rows + k, D)) + np.eye(C, D)[y] * 2.0
        moments, counts = label_moments(x, y, C)
        out.append((rows + k, rng.normal(size=(C, D + 1)), gram_matrix(x), moments, counts))
    return out


def _plain_solve_right(a, b):
    """solve_right as it was: Cholesky and ``torch.cholesky_solve``, else the spectrum."""
    chol, info = torch.linalg.cholesky_ex(a)
    if int(info) == 0 and float((torch.diagonal(chol) ** 2).min()) > \
            EIGEN_FLOOR * float(torch.diagonal(a).max()):
        return torch.cholesky_solve(b.T.contiguous(), chol).T
    return spectral_solve_right(torch.linalg.eigh(a), b)


@pytest.mark.parametrize("size,block", [(37, 8), (16, 16), (5, 512)])
def test_symmetrize_in_place_gives_the_plain_expressions_numbers(size, block):
    rng = np.random.default_rng(size)
    a = rng.normal(size=(size + 1, size + 1))
    expected = 0.5 * (a + a.T)
    out = symmetrize_(a, block)
    assert out is a
    np.testing.assert_array_equal(a, expected)
    t = torch.as_tensor(rng.normal(size=(size + 1, size + 1)))
    view = t[:size, :size]  # a corner of a larger matrix, as the LDA point's is
    expected = 0.5 * (view + view.T)
    symmetrize_(view, block)
    assert torch.equal(view, expected)


def test_the_pooled_gram_is_the_plain_expression_of_the_integer_sums():
    sums = GramSums(C, D + 1)
    for node in _nodes(40):
        sums.add(*node)
    g = np.ldexp(sums._gram.astype(np.float64), -FRACTION_BITS) / sums.count
    np.testing.assert_array_equal(sums.pooled_gram(), 0.5 * (g + g.T))


@pytest.mark.parametrize("overwrite", [False, True])
def test_the_cholesky_solve_gives_torch_cholesky_solves_numbers(overwrite):
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.normal(size=(80, 41)))
    a = symmetrize_(x.T @ x / 80)
    b = torch.as_tensor(rng.normal(size=(4, 41)))
    expected = torch.cholesky_solve(b.T.contiguous(), torch.linalg.cholesky(a)).T
    given = a.clone()
    solved = cholesky_solve_right(given, b, overwrite=overwrite)
    assert torch.equal(solved, expected)
    assert torch.equal(given, a) != overwrite  # factored in place only when allowed
    singular = symmetrize_(x[:10].T @ x[:10] / 10)  # rank 10 of 41
    assert cholesky_solve_right(singular.clone(), b, overwrite=overwrite) is None


def _plain_system(grams, moments, counts, ridge):
    w = np.asarray(counts, dtype=np.float64) / sum(counts)
    a = sum(float(wk) * torch.as_tensor(g) for wk, g in zip(w, grams))
    a = 0.5 * (a + a.T)
    a.diagonal().add_(ridge)
    return a, sum(float(wk) * torch.as_tensor(m) for wk, m in zip(w, moments))


def _plain_ldas(grams, moments, counts, shrinkages):
    a, b = _plain_system(grams, moments, counts, 0.0)
    d = a.shape[0] - 1
    prior, mu = class_priors_and_means(b)
    within = a[:d, :d] - (mu.T * prior) @ mu
    within = 0.5 * (within + within.T)
    scale = float(torch.trace(within).clamp(min=0.0))
    out = []
    for shrinkage in shrinkages:
        shrunk = within.clone()
        shrunk.diagonal().add_(float(shrinkage) * scale / d)
        out.append(lda_classifier(_plain_solve_right(shrunk, mu), prior, mu))
    return out


# 2: nine rows in all, fewer than the 12 inputs, so neither system is positive definite
@pytest.mark.parametrize("rows,definite", [(2, False), (60, True)])
def test_the_pooled_points_are_the_plain_solves_numbers(rows, definite):
    nodes = _nodes(rows)
    grams, moments, counts = [n[2] for n in nodes], [n[3] for n in nodes], [n[0] for n in nodes]
    for ridge in (0.0, 1e-3):
        a, b = _plain_system(grams, moments, counts, ridge)
        assert (cholesky_solve_right(a.clone(), b) is not None) == (definite or ridge > 0)
        np.testing.assert_array_equal(pooled_point(grams, moments, counts, ridge),
                                      _plain_solve_right(a, b).numpy())
    shrinkages = [0.0, 1e-3, 1e-1]
    for lean, plain in zip(pooled_ldas(grams, moments, counts, shrinkages),
                           _plain_ldas(grams, moments, counts, shrinkages)):
        np.testing.assert_array_equal(lean, plain)


def test_the_selection_rounds_solves_share_one_pooled_gram(monkeypatch):
    """Every candidate solved from the sums reads the same pooled matrix, formed once."""
    sums = GramSums(C, D + 1)
    nodes = _nodes(40)
    for node in nodes:
        sums.add(*node)
    formed = []
    plain = GramSums.pooled_gram
    monkeypatch.setattr(GramSums, "pooled_gram",
                        lambda self: formed.append(1) or plain(self))
    stats = SummedStatistics(sums, [n[0] for n in nodes])
    for name, value in [("pooled", 1e-4), ("pooled", 1e-2), ("lda", 1e-2)]:
        solve_point(stats, [], name, value, ridge=1e-3)
    assert len(formed) == 1


def test_a_factored_gram_folds_into_the_sums_as_its_matrix_and_stays_as_it_was():
    """The server forms a factored G once and scales that array in place."""
    rng = np.random.default_rng(3)
    factor, residual = rng.normal(size=(D + 1, 4)), rng.uniform(0.1, 1.0, D + 1)
    factored = FactoredGram(factor, residual)
    dense = np.asarray(factored, dtype=np.float64)
    center, moments, counts = rng.normal(size=(C, D + 1)), rng.normal(size=(C, D + 1)), \
        np.array([5, 0, 9])
    by_factor, by_matrix = GramSums(C, D + 1), GramSums(C, D + 1)
    by_factor.add(14, center, factored, moments, counts)
    by_matrix.add(14, center, dense, moments, counts)
    np.testing.assert_array_equal(by_factor.pooled_gram(), by_matrix.pooled_gram())
    np.testing.assert_array_equal(by_factor.center_system()[1], by_matrix.center_system()[1])
    np.testing.assert_array_equal(np.asarray(factored, dtype=np.float64), dense)
