"""Dirichlet label divisions: ``label-division='dirichlet:ALPHA'`` (``:MIN`` for a minimum
node size), the field's common benchmark of label skew.

For each class, the shares of the nodes are drawn from Dirichlet(alpha) (small alpha:
each class on few nodes) by flwr-datasets' ``DirichletPartitioner``. A node's training
and validation samples follow the same draw: the training and validation pools are
shuffled together (seeded), partitioned once, and each node's share is split back by
the pool each row came from; a share with no row of one pool takes one of its own rows
into it (see :func:`dirichlet_shares`). The partitioner sees only a label column and a row
index (``Dataset.from_dict``), never the pixels.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

DEFAULT_MIN_SIZE = 10  # flwr-datasets' default min_partition_size


@dataclass(frozen=True)
class DirichletDivision:
    """Label shares per class drawn from Dirichlet(``alpha``) over ``num_nodes`` nodes;
    every node gets at least ``min_size`` samples (train and validation together)."""

    alpha: float
    num_nodes: int
    min_size: int = DEFAULT_MIN_SIZE

    def __len__(self) -> int:
        return self.num_nodes

    def to_json(self) -> dict:
        return {"dirichlet": self.alpha, "min_size": self.min_size, "nodes": self.num_nodes}


def parse_dirichlet(spec: str, value: str, num_nodes: int) -> DirichletDivision:
    """``ALPHA`` or ``ALPHA:MIN`` (the part after ``dirichlet:``) as a division."""
    parts = value.split(":")
    try:
        alpha = float(parts[0])
        min_size = int(parts[1]) if len(parts) > 1 else DEFAULT_MIN_SIZE
    except (ValueError, IndexError):
        raise ValueError(f"label-division {spec!r}: expected 'dirichlet:ALPHA' or "
                         "'dirichlet:ALPHA:MIN', e.g. 'dirichlet:0.1' or 'dirichlet:0.1:20'") from None
    if len(parts) > 2 or not alpha > 0 or min_size < 2:
        raise ValueError(f"label-division {spec!r}: ALPHA must be > 0 and MIN >= 2 (a node "
                         "needs a training and a validation sample)")
    return DirichletDivision(alpha, int(num_nodes), min_size)


def dirichlet_shares(train_labels: np.ndarray, val_labels: np.ndarray,
                     division: DirichletDivision, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per node, its ``(training rows, validation rows)``, sorted; seeded.

    Rows index the two pools one after the other: ``i < len(train_labels)`` is training
    pool row ``i``, a larger ``i`` validation pool row ``i - len(train_labels)``
    (:func:`pool_rows` takes them). A node's rows come from its pools, except that a
    node whose share holds no validation row keeps one of its training rows, drawn with
    the seed, for validation (and a node with no training row the reverse): with many
    small nodes some shares miss the smaller pool, and every node needs both.

    Raises ``ValueError`` naming the setting when no draw gives every node ``min_size``
    samples.
    """
    return _shares(np.ascontiguousarray(train_labels, dtype=np.int64).tobytes(),
                   np.ascontiguousarray(val_labels, dtype=np.int64).tobytes(), division, int(seed))


def pool_rows(train: tuple[np.ndarray, np.ndarray], val: tuple[np.ndarray, np.ndarray],
              rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)`` of ``rows`` (as :func:`dirichlet_shares` numbers them) from the training
    pool ``train = (x, y)`` and the validation pool ``val``: fresh arrays."""
    cut = len(train[1])
    own, other = rows[rows < cut], rows[rows >= cut] - cut
    if not len(other):
        return train[0][own], train[1][own]
    if not len(own):
        return val[0][other], val[1][other]
    return (np.concatenate([train[0][own], val[0][other]]),
            np.concatenate([train[1][own], val[1][other]]))


@lru_cache(maxsize=8)  # every node of a process asks for the same partition
def _shares(train_bytes: bytes, val_bytes: bytes, division: DirichletDivision,
            seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    train = np.frombuffer(train_bytes, dtype=np.int64)
    val = np.frombuffer(val_bytes, dtype=np.int64)
    spec = f"dirichlet:{division.alpha:g}:{division.min_size}"
    rows = _draw(train, val, division, seed, spec)
    cut = len(train)
    rng = np.random.default_rng([int(seed), 0x5E1F])  # which row a short node lends itself
    shares = []
    for share in rows:
        tr, va = share[share < cut], share[share >= cut]
        if not len(va):
            pick = rng.integers(len(tr))
            tr, va = np.delete(tr, pick), tr[pick:pick + 1]
        elif not len(tr):
            pick = rng.integers(len(va))
            tr, va = va[pick:pick + 1], np.delete(va, pick)
        shares.append((np.sort(tr), np.sort(va)))
    return shares


def _draw(train: np.ndarray, val: np.ndarray, division: DirichletDivision, seed: int,
          spec: str) -> list[np.ndarray]:
    """One seeded Dirichlet draw over the training and validation pools together: each
    node's rows, numbered as in :func:`dirichlet_shares`."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    labels = np.concatenate([train, val])
    order = np.random.default_rng(seed).permutation(len(labels))
    part = DirichletPartitioner(num_partitions=division.num_nodes, partition_by="label",
                                alpha=division.alpha, min_partition_size=division.min_size,
                                self_balancing=False, shuffle=True, seed=seed)
    part.dataset = Dataset.from_dict({"label": labels[order], "row": order})
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # it warns at every retry; we say it once below
            return [np.asarray(part.load_partition(k)["row"], dtype=np.int64)
                    for k in range(division.num_nodes)]
    except ValueError:
        raise ValueError(
            f"label-division '{spec}' with {division.num_nodes} nodes: no Dirichlet draw "
            f"gave every node {division.min_size} samples in 10 tries; use a larger alpha, "
            "a smaller MIN ('dirichlet:ALPHA:MIN') or fewer nodes") from None
