"""flwr-datasets partitioner for the GEMS label divisions.

Kept apart from :mod:`gems_fl.data.partition` because importing
``flwr_datasets`` takes seconds; ``import gems_fl.data`` stays fast and loads
this module only when :class:`LabelDivisionPartitioner` is first used.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import Partitioner

from gems_fl.data.dirichlet import DirichletDivision
from gems_fl.data.partition import check_division, parse_division, partition_indices


class LabelDivisionPartitioner(Partitioner):
    """Partition a Hugging Face dataset by a GEMS label division.

    Partition ``k`` receives the samples given to node ``k`` by
    :func:`gems_fl.data.partition_indices`: each class is shuffled and split
    evenly among the partitions holding it, and no sample is repeated.

    Parameters
    ----------
    division : sequence of sequence of int
        Classes held by each partition (see :func:`gems_fl.data.parse_division`).
    partition_by : str, default "label"
        Name of the integer label column.
    seed : int, default 42
        Seed passed to :func:`gems_fl.data.partition_indices`.

    Examples
    --------
    >>> from flwr_datasets import FederatedDataset  # doctest: +SKIP
    >>> part = LabelDivisionPartitioner([[0, 1], [2, 3]], seed=0)  # doctest: +SKIP
    >>> fds = FederatedDataset(dataset="mnist", partitioners={"train": part})  # doctest: +SKIP
    """

    def __init__(
        self, division: Sequence[Sequence[int]], partition_by: str = "label", seed: int = 42
    ) -> None:
        super().__init__()
        if not isinstance(partition_by, str) or not partition_by:
            raise ValueError(f"partition_by must be the name of the label column, got {partition_by!r}.")
        self._division = check_division(division)
        self._partition_by = partition_by
        self._seed = seed
        self._indices: list[np.ndarray] | None = None

    @classmethod
    def from_spec(
        cls, spec: str, num_partitions: int, num_classes: int, partition_by: str = "label", seed: int = 42
    ) -> LabelDivisionPartitioner:
        """Build the partitioner from a ``label-division`` setting string (see ``parse_division``)."""
        division = parse_division(spec, num_partitions, num_classes)
        if isinstance(division, DirichletDivision):
            raise ValueError(f"label-division {spec!r} is a Dirichlet division: use "
                             "flwr_datasets.partitioner.DirichletPartitioner directly")
        return cls(division, partition_by=partition_by, seed=seed)

    @property
    def division(self) -> list[list[int]]:
        """Classes held by each partition."""
        return [list(group) for group in self._division]

    @property
    def num_partitions(self) -> int:
        """Total number of partitions."""
        return len(self._division)

    def partition_indices(self) -> list[np.ndarray]:
        """Return the sorted row indices of every partition (computed once)."""
        if self._indices is None:
            self._indices = partition_indices(self._labels(), self._division, self._seed)
        return self._indices

    def load_partition(self, partition_id: int) -> Dataset:
        """Return the rows of partition ``partition_id``.

        Parameters
        ----------
        partition_id : int
            Partition index in ``0..num_partitions - 1``.

        Returns
        -------
        datasets.Dataset
            The selected rows, in their original order.
        """
        if isinstance(partition_id, bool) or not isinstance(partition_id, (int, np.integer)) or not (
            0 <= partition_id < self.num_partitions
        ):
            raise ValueError(
                f"partition_id must be an integer in 0..{self.num_partitions - 1}, got {partition_id!r}."
            )
        return self.dataset.select(self.partition_indices()[int(partition_id)])

    def _labels(self) -> np.ndarray:
        """Return the label column of the assigned dataset as a numpy array."""
        columns = self.dataset.column_names
        if self._partition_by not in columns:
            raise ValueError(
                f"LabelDivisionPartitioner: the dataset has no column {self._partition_by!r} "
                f"(columns: {columns}); pass the label column as partition_by."
            )
        return np.asarray(self.dataset.with_format("numpy")[self._partition_by])
