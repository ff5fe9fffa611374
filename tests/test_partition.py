"""Divisions for many nodes: every node gets training and validation data, sizes preflight."""

from __future__ import annotations

import os

import numpy as np
import pytest

from gems_fl.data import load_dataset
from gems_fl.data.partition import (
    check_partition_sizes,
    parse_division,
    partition_indices,
    share_sizes,
)

SPECS = ("iid", "classes-per-node:2", "classes-per-node:1")
FASHION = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _check_every_node(splits, spec: str, num_nodes: int, seed: int = 0) -> None:
    division = parse_division(spec, num_nodes, splits.num_classes)
    sizes = check_partition_sizes(splits.train_y, splits.val_y, division, spec=spec)
    assert (sizes > 0).all()
    for labels, part_seed in ((splits.train_y, seed), (splits.val_y, seed + 1)):
        parts = partition_indices(labels, division, part_seed)
        assert [len(p) for p in parts] == list(share_sizes(labels, division).sum(axis=1))
        everything = np.concatenate(parts)
        assert len(np.unique(everything)) == len(everything)  # no sample on two nodes
        for part, group in zip(parts, division):
            assert len(part) > 0
            assert set(np.unique(labels[part])) <= set(group)
    train = share_sizes(splits.train_y, division)
    for node, group in enumerate(division):
        assert all(train[node, c] > 0 for c in group)  # training data of every class held


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("num_nodes", [20, 50, 100])
def test_every_digits_node_gets_train_and_val(digits, spec, num_nodes):
    _check_every_node(digits, spec, num_nodes)


@pytest.mark.skipif(not os.path.isdir(FASHION), reason="Fashion-MNIST not installed")
@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("num_nodes", [20, 50, 100])
def test_every_fashion_node_gets_train_and_val(spec, num_nodes):
    _check_every_node(load_dataset("fashion-mnist", seed=0), spec, num_nodes)


def test_leftovers_are_spread_round_robin():
    labels = np.repeat(np.arange(10), 3)  # 3 samples per class, 10 nodes all holding all
    sizes = share_sizes(labels, parse_division("iid", 10, 10))
    assert list(sizes.sum(axis=1)) == [3] * 10
    # A node that got nothing of one class is first in line for the next.
    labels = np.array([0, 1])
    sizes = share_sizes(labels, [[0, 1], [0, 1]])
    assert list(sizes.sum(axis=1)) == [1, 1]


def test_shares_of_a_class_differ_by_at_most_one(digits):
    division = parse_division("classes-per-node:3", 37, 10)
    sizes = share_sizes(digits.train_y, division)
    for c in range(10):
        held = sizes[[k for k, g in enumerate(division) if c in g], c]
        assert held.max() - held.min() <= 1
        assert held.sum() == (digits.train_y == c).sum()


def test_partition_is_seeded(digits):
    division = parse_division("iid", 50, 10)
    a = partition_indices(digits.val_y, division, seed=3)
    b = partition_indices(digits.val_y, division, seed=3)
    c = partition_indices(digits.val_y, division, seed=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # The sizes do not depend on the seed: a preflight on the server agrees with the nodes.
    assert [len(x) for x in a] == [len(x) for x in c]


def test_too_many_nodes_is_refused_with_the_fix(digits):
    division = parse_division("iid", 200, 10)  # class 8 has 124 training samples
    with pytest.raises(ValueError, match=r"label-division 'iid' with 200 nodes.*"
                                         r"0 training samples of class.*at most 124 nodes"):
        check_partition_sizes(digits.train_y, digits.val_y, division, spec="iid")
    # digits has 128 validation samples in all
    with pytest.raises(ValueError, match=r"0 validation samples.*at most 128 nodes"):
        check_partition_sizes(digits.train_y, digits.val_y, division, spec="iid",
                              min_train_per_class=0)


def test_per_class_validation_minimum_suggests_fewer_classes(digits):
    division = parse_division("classes-per-node:2", 100, 10)
    with pytest.raises(ValueError, match=r"per class.*'classes-per-node:1' with 100 nodes"):
        check_partition_sizes(digits.train_y, digits.val_y, division,
                              spec="classes-per-node:2", min_val_per_class=1)
    sizes = check_partition_sizes(digits.train_y, digits.val_y,
                                  parse_division("classes-per-node:1", 100, 10),
                                  spec="classes-per-node:1", min_val_per_class=1)
    assert sizes.shape == (100, 2) and sizes.min() >= 1


def test_paper_divisions_are_unchanged_for_one_holder_per_class(digits):
    # Each class on one node: the whole class goes there, as before.
    division = parse_division("paper", 5, 10)
    sizes = share_sizes(digits.train_y, division)
    assert list(sizes.sum(axis=1)) == [int(np.isin(digits.train_y, g).sum()) for g in division]
