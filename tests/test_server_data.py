"""The server's copy of a simulation's data: it holds the test set and the public sample
through the rounds, and builds the nodes' rows (Global's pooled train, each node's part,
the public pool) only when a comparison row asks for them, the same arrays bit for bit
as the nodes' own loading gives, through the same scaling and map."""

from __future__ import annotations

import numpy as np
import pytest

from gems_fl.data import load_dataset, node_data
from gems_fl.data.agreement import DataAgreement
from gems_fl.data.partition import parse_division
from gems_fl.data.random_features import RandomFeatures
from gems_fl.data.site_files import combine_stats, feature_stats
from gems_fl.evaluation.server_data import (
    load_server_data,
    pooled_in_canonical_order,
    scale_server_data,
)
from gems_fl.settings import Settings
from gems_fl.settings.options import server_data_options


def _scaled(x, mean, std):
    return ((np.asarray(x, dtype=np.float64) - mean) / std).astype(np.float32)


@pytest.mark.parametrize("standardize", ["off", "federated", "node"])
def test_the_nodes_rows_are_built_when_asked_as_they_were_loaded(standardize):
    settings = Settings(dataset="digits", seed=2, standardize=standardize)
    options = server_data_options(settings)
    division = parse_division("dirichlet:0.5", 4, 10)
    splits = load_dataset("digits", seed=2)
    parts = [node_data(splits, division, k, 2) for k in range(4)]
    pooled_x, pooled_y = pooled_in_canonical_order(parts)
    mean = std = None
    if standardize == "federated":  # the nodes' combined sums, as the identity round gives
        mean, std = combine_stats([feature_stats(p[0]) for p in parts])
    features = RandomFeatures("relu", 64, 48, 3.0, 5)
    agreement = DataAgreement(64, [str(c) for c in range(10)], mean, std, features=features)

    data, meta, _ = load_server_data(options, division)
    scale_server_data(data, agreement, options)
    # through the rounds the server holds no node's rows
    assert data.train_x is None and data.train_y is None and data.node_parts == []
    assert data.pool_x is None
    assert meta["node_train_total"] == len(pooled_y)
    assert meta["node_val_total"] == sum(len(p[3]) for p in parts)

    if standardize == "node":  # the server's own scaling: the pooled training rows'
        mean, std = combine_stats([feature_stats(pooled_x)])

    def as_run(x):
        return agreement.map_features(x if mean is None else _scaled(x, mean, std))

    np.testing.assert_array_equal(data.test_x, as_run(splits.test_x))
    built = data.with_all_rows()
    np.testing.assert_array_equal(built.train_x, as_run(pooled_x))
    np.testing.assert_array_equal(built.train_y, pooled_y)
    np.testing.assert_array_equal(built.pool_x, as_run(splits.public_x))
    assert len(built.node_parts) == 4
    for got, want in zip(built.node_parts, parts):
        np.testing.assert_array_equal(got[0], as_run(want[0]))
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_array_equal(got[2], as_run(want[2]))
        np.testing.assert_array_equal(got[3], want[3])
    again = built.with_all_rows()  # built once: a second call maps nothing twice
    assert again.train_x is built.train_x
