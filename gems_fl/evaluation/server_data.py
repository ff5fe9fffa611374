"""What a simulation's server holds for the baselines: the nodes' training data pooled
(Global), the test set, and a public sample that no node used (fine-tuning, Raw)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gems_fl.data import FeatureOptions, load_dataset, node_data
from gems_fl.settings import Settings


@dataclass
class ServerData:
    """Data the server holds in a simulation (none of it is a node's)."""

    train_x: np.ndarray  # all nodes' training data pooled, for Global only
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    public_x: np.ndarray  # drawn from data that no node used
    public_y: np.ndarray
    num_classes: int
    node_parts: list = field(default_factory=list)  # (x_tr, y_tr, x_val, y_val) per node
    pool_x: np.ndarray | None = None  # the whole public pool (fine-tuning study)
    pool_y: np.ndarray | None = None


def draw_public_sample(
    x: np.ndarray, y: np.ndarray, size: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """``size`` rows drawn without replacement (seeded) from the public pool."""
    if size > len(y):
        raise ValueError(f"public sample of {size} requested but the pool holds {len(y)}")
    idx = np.random.default_rng(seed).choice(len(y), size=size, replace=False)
    return x[idx], y[idx]


def pooled_in_canonical_order(parts: list[tuple]) -> tuple[np.ndarray, np.ndarray]:
    """All nodes' training rows pooled, in an order that does not depend on the division.

    Global is "trained on all the nodes' data". Sorting the pool by a fixed projection of
    each row makes it the same model for every K whose nodes hold the same samples, as
    in the paper's tables, instead of one that changes with the partitions' order. Rows
    that tie are identical, so their relative order cannot change the training.
    """
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    direction = np.random.default_rng(20_240_611).standard_normal(x.shape[1])
    order = np.lexsort((y, x.astype(np.float64) @ direction))
    return x[order], y[order]


def load_server_data(
    settings: Settings, division: list[list[int]]
) -> tuple[ServerData, dict[str, Any], list[str]]:
    """What a simulation's server holds: pooled train (Global), test, public sample."""
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=settings.data_dir or None,
                          features=FeatureOptions.from_settings(settings))
    num_nodes = len(division)
    parts = [node_data(splits, division, k, settings.seed) for k in range(num_nodes)]
    notes = []
    size = settings.public_samples
    if size > len(splits.public_y):
        notes.append(f"public-samples={size} but {settings.dataset}'s public pool holds "
                     f"{len(splits.public_y)} samples no node uses; using all of them")
        size = len(splits.public_y)
    public_x, public_y = draw_public_sample(splits.public_x, splits.public_y, size, settings.seed)
    train_x, train_y = pooled_in_canonical_order(parts)
    data = ServerData(
        train_x=train_x, train_y=train_y,
        test_x=splits.test_x, test_y=splits.test_y,
        public_x=public_x, public_y=public_y, num_classes=splits.num_classes,
        node_parts=parts, pool_x=splits.public_x, pool_y=splits.public_y,
    )
    meta = {
        "name": settings.dataset, "num_nodes": num_nodes, "label_division": division,
        "num_features": splits.num_features, "num_classes": splits.num_classes,
        "node_train_total": int(len(data.train_y)),
        "node_val_total": int(sum(len(p[3]) for p in parts)),
        "test": int(len(splits.test_y)), "public_pool": int(len(splits.public_y)),
        "public_used": int(size),
    }
    return data, meta, notes


