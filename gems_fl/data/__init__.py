"""Datasets, IDX files and label divisions over nodes for GEMS.

``LabelDivisionPartitioner`` (flwr-datasets) is loaded on first access so that
importing this package does not pay for importing ``flwr_datasets``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gems_fl.data.datasets import (
    DATASET_NAMES,
    DATASET_SHAPES,
    DATASETS,
    DEFAULT_FASHION_MNIST_DIR,
    Dataset,
    DatasetSplits,
    FeatureOptions,
    clear_dataset_cache,
    dataset_named,
    load_dataset,
)
from gems_fl.data.dirichlet import DirichletDivision
from gems_fl.data.idx import read_idx, write_idx
from gems_fl.data.partition import (
    PAPER_DIVISIONS,
    check_division,
    node_data,
    parse_division,
    partition_indices,
)

if TYPE_CHECKING:
    from gems_fl.data.hf_partitioner import LabelDivisionPartitioner

__all__ = [
    "DATASET_NAMES",
    "DATASET_SHAPES",
    "DATASETS",
    "DEFAULT_FASHION_MNIST_DIR",
    "Dataset",
    "DatasetSplits",
    "DirichletDivision",
    "FeatureOptions",
    "LabelDivisionPartitioner",
    "PAPER_DIVISIONS",
    "check_division",
    "clear_dataset_cache",
    "dataset_named",
    "load_dataset",
    "node_data",
    "parse_division",
    "partition_indices",
    "read_idx",
    "write_idx",
]


def __getattr__(name: str) -> Any:
    """Import ``LabelDivisionPartitioner`` lazily (PEP 562)."""
    if name == "LabelDivisionPartitioner":
        from gems_fl.data.hf_partitioner import LabelDivisionPartitioner

        return LabelDivisionPartitioner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
