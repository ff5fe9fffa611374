"""The node's whitening of its Gram metric: from the factor form's structure (no n^3 step)
it equals the eigendecomposition's, up to a rotation of the whitened coordinates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gems_fl.geometry.gram import from_factor, gram_matrix, residual_diagonal, sent_factor
from gems_fl.geometry.whitening import eigen_whitening, factor_whitening


def _factor_form(rows: int, features: int, rank: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features)) * np.geomspace(0.05, 5, features)
    x[:, 3] = 0.0  # a feature constant on the rows: G's null space
    g = gram_matrix(x)
    factor = sent_factor(g, rank, x)
    residual = residual_diagonal(g, factor)
    return factor, residual, from_factor(factor, residual)


@pytest.mark.parametrize("rows, features, rank", [
    (400, 60, 8),    # more rows than inputs: a residual on nearly every coordinate
    (50, 300, 40),   # fewer rows than inputs, a factor below their rank
    (500, 300, 40),
])
def test_the_factor_whitening_equals_the_eigendecomposition_up_to_a_rotation(rows, features, rank):
    factor, residual, g = _factor_form(rows, features, rank)
    fast = factor_whitening(factor, residual)
    slow = eigen_whitening(torch.as_tensor(g))
    val = torch.as_tensor(np.c_[np.random.default_rng(9).standard_normal((25, features)),
                                np.ones(25)])
    a, b = fast.apply(val), slow.apply(val)
    assert fast.dim == slow.dim
    # the same whitened inner products (W W^T is G's pseudo-inverse on its range)
    np.testing.assert_allclose((a @ a.T).numpy(), (b @ b.T).numpy(), rtol=1e-6,
                               atol=1e-8 * float((b @ b.T).abs().max()))
    assert (fast.outside is None) == (slow.outside is None)
    if fast.outside is not None:  # the rows' part in G's null space: the same size
        assert torch.linalg.matrix_norm(fast.outside(val), 2).item() == pytest.approx(
            torch.linalg.matrix_norm(slow.outside(val), 2).item(), rel=1e-6)


def test_a_few_rows_node_at_a_large_width_builds_its_space_without_an_eigendecomposition(monkeypatch):
    """50 rows, 2,048 inputs, the factor form (gram-rank auto): no n x n eigh anywhere."""
    from gems_fl.geometry.kinds import SpaceOptions, build_layer_space

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 2048)), rng.integers(0, 3, 50)
    xv, yv = rng.standard_normal((20, 2048)), rng.integers(0, 3, 20)
    center = rng.standard_normal((3, 2049)) * 0.01

    def no_eigh(*_args, **_kwargs):
        raise AssertionError("an n x n eigendecomposition ran")

    monkeypatch.setattr(torch.linalg, "eigh", no_eigh)
    layer = build_layer_space(center, (x, y), xv, yv,
                              SpaceOptions(kind="gram", eps=0.1, gram_rank="auto",
                                           num_directions=50), seed=0)
    assert layer.factor is not None and layer.space.radius > 0
