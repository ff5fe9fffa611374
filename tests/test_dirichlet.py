"""Dirichlet label divisions: seeded, disjoint, train and validation from one draw, clear
errors, and a run through the real apps."""

from __future__ import annotations

import numpy as np
import pytest

from gems_fl.data import DirichletDivision, load_dataset, node_data, parse_division
from gems_fl.data.partition import check_partition_sizes
from tests.helpers import run_in_process


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def test_parse_forms_and_errors():
    assert parse_division("dirichlet:0.5", 4, 10) == DirichletDivision(0.5, 4, 10)
    assert parse_division("Dirichlet:0.1:20", 3, 10) == DirichletDivision(0.1, 3, 20)
    for bad in ("dirichlet:", "dirichlet:x", "dirichlet:0", "dirichlet:0.1:1", "dirichlet:1:2:3"):
        with pytest.raises(ValueError, match="label-division"):
            parse_division(bad, 3, 10)


def _shares(splits, division, seed):
    return [node_data(splits, division, k, seed) for k in range(division.num_nodes)]


def test_shares_are_seeded_disjoint_and_cover_every_sample(digits):
    division = parse_division("dirichlet:0.3", 4, 10)
    parts = _shares(digits, division, 0)
    assert all(len(p[1]) >= 1 and len(p[3]) >= 1 for p in parts)
    assert sum(len(p[1]) for p in parts) == len(digits.train_y)
    assert sum(len(p[3]) for p in parts) == len(digits.val_y)
    train = np.concatenate([p[0] for p in parts])
    assert len(np.unique(train, axis=0)) == len(np.unique(digits.train_x, axis=0))
    again = _shares(digits, division, 0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(parts, again))
    other = _shares(digits, division, 1)
    assert any(len(a[1]) != len(b[1]) for a, b in zip(parts, other))


def test_small_alpha_skews_labels_and_validation_follows_the_same_draw(digits):
    skewed = _shares(digits, parse_division("dirichlet:0.05", 4, 10), 0)
    even = _shares(digits, parse_division("dirichlet:100", 4, 10), 0)

    def dominant_share(parts):
        return np.mean([np.bincount(p[1], minlength=10).max() / len(p[1]) for p in parts])

    assert dominant_share(skewed) > 0.4 > dominant_share(even)
    for _x_tr, y_tr, _x_val, y_val in skewed:
        train_mix = np.bincount(y_tr, minlength=10) / len(y_tr)
        val_mix = np.bincount(y_val, minlength=10) / len(y_val)
        assert np.abs(train_mix - val_mix).max() < 0.35  # one draw for both pools


def test_an_impossible_minimum_is_refused_with_the_fix(digits):
    division = parse_division(f"dirichlet:0.05:{len(digits.train_y) // 2}", 4, 10)
    with pytest.raises(ValueError, match="larger alpha, a smaller MIN"):
        check_partition_sizes(digits.train_y, digits.val_y, division,
                              spec="dirichlet:0.05:700", seed=0)


def test_a_node_whose_share_misses_the_validation_pool_keeps_a_training_row_for_it(digits):
    """Many small nodes: the seed's own draw leaves some share without a validation row.
    Such a node keeps one of its own training rows (seeded) for validation; no row is
    lost, duplicated or moved between nodes, and every other node's rows stay put."""
    import gems_fl.data.dirichlet as dirichlet

    division = parse_division("dirichlet:0.3", 12, 10)
    raw = dirichlet._draw(digits.train_y, digits.val_y, division, 3, "dirichlet:0.3")
    cut = len(digits.train_y)
    short = [k for k, r in enumerate(raw) if not (r >= cut).any()]
    assert short, "the test needs a draw in which some node has no validation row"
    shares = dirichlet.dirichlet_shares(digits.train_y, digits.val_y, division, 3)
    for k, (tr, va) in enumerate(shares):
        assert len(tr) and len(va)
        np.testing.assert_array_equal(np.sort(np.concatenate([tr, va])), np.sort(raw[k]))
        if k in short:
            assert len(va) == 1 and va[0] < cut  # a training-pool row, kept for validation
        else:
            np.testing.assert_array_equal(va, np.sort(raw[k][raw[k] >= cut]))
    everything = np.concatenate([np.concatenate(s) for s in shares])
    assert len(everything) == len(np.unique(everything)) == cut + len(digits.val_y)
    x_tr, y_tr, x_val, y_val = node_data(digits, division, short[0], 3)
    row = shares[short[0]][1][0]
    np.testing.assert_array_equal(x_val[0], digits.train_x[row])
    assert y_val[0] == digits.train_y[row] and len(y_tr) == len(shares[short[0]][0])
    dirichlet._shares.cache_clear()
    again = dirichlet.dirichlet_shares(digits.train_y, digits.val_y, division, 3)
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(shares, again))


def test_a_run_on_a_dirichlet_division(tmp_path):
    results = run_in_process(4, tmp_path, **{"label-division": "dirichlet:0.5"})
    assert results["dataset"]["label_division"] == {"dirichlet": 0.5, "min_size": 10, "nodes": 4}
    assert len(results["nodes"]) == 4 and results["rows"]["GEMS"]["accuracy"] > 0.5
