"""Dirichlet label divisions: ``label-division='dirichlet:ALPHA'`` (``:MIN`` for a minimum
node size), the field's common benchmark of label skew.

For each class, the shares of the nodes are drawn from Dirichlet(alpha) (small alpha:
each class on few nodes) by flwr-datasets' ``DirichletPartitioner``. A node's training
and validation samples follow the same draw: the training and validation pools are
shuffled together (seeded), partitioned once, and each node's share is split back by
the pool each row came from. The partitioner sees only a label column and a row
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
    """Per node, its ``(train indices, validation indices)``, sorted; seeded.

    Raises ``ValueError`` naming the setting when no draw gives every node ``min_size``
    samples in 10 tries, or a node has no training or no validation sample.
    """
    return _shares(np.ascontiguousarray(train_labels, dtype=np.int64).tobytes(),
                   np.ascontiguousarray(val_labels, dtype=np.int64).tobytes(), division, int(seed))


#: Draws tried before a division is refused: a draw must give every node ``min_size``
#: samples (flwr-datasets retries that itself) and at least one training and one
#: validation row (we retry that, with the next draw of the same seed).
DRAWS = 10


@lru_cache(maxsize=8)  # every node of a process asks for the same partition
def _shares(train_bytes: bytes, val_bytes: bytes, division: DirichletDivision,
            seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    train = np.frombuffer(train_bytes, dtype=np.int64)
    val = np.frombuffer(val_bytes, dtype=np.int64)
    spec = f"dirichlet:{division.alpha:g}:{division.min_size}"
    short = ""
    for draw in range(DRAWS):  # draw 0 is the seed's own; later ones only when it fails
        shares = _draw(train, val, division, seed + 7919 * draw, spec)
        empty = [(k, len(tr), len(va)) for k, (tr, va) in enumerate(shares)
                 if len(tr) == 0 or len(va) == 0]
        if not empty:
            return shares
        k, n_tr, n_va = empty[0]
        short = f"node {k} got {n_tr} training and {n_va} validation samples"
    raise ValueError(
        f"label-division '{spec}' with {division.num_nodes} nodes: in {DRAWS} draws some "
        f"node always lacked training or validation samples (last: {short}); every node "
        "needs both: raise MIN ('dirichlet:ALPHA:MIN'), alpha, or use fewer nodes")


def _draw(train: np.ndarray, val: np.ndarray, division: DirichletDivision, seed: int,
          spec: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """One seeded Dirichlet draw over the training and validation pools together."""
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
            rows = [np.asarray(part.load_partition(k)["row"], dtype=np.int64)
                    for k in range(division.num_nodes)]
    except ValueError:
        raise ValueError(
            f"label-division '{spec}' with {division.num_nodes} nodes: no Dirichlet draw "
            f"gave every node {division.min_size} samples in 10 tries; use a larger alpha, "
            "a smaller MIN ('dirichlet:ALPHA:MIN') or fewer nodes") from None
    return [(np.sort(r[r < len(train)]), np.sort(r[r >= len(train)] - len(train)))
            for r in rows]
