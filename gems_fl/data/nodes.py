"""A node's identity and its data, from its Flower node config.

A SuperNode says who it is and where its data lies in ``--node-config``:

- ``data-path='/srv/site-a.npz'``: its own data file (``.npz`` with arrays
  ``x_train``, ``y_train``, ``x_val``, ``y_val``; or a ``.csv`` pair, see
  :func:`load_node_file`), checked against the run's dataset shape;
- or ``partition-id=k num-partitions=K`` (demos, and the simulation engine): slice
  ``k`` of the run's dataset under the run's label division (``data-dir`` optionally
  points at the dataset's files).

``node-name`` names the node in logs and results. Flower's node id changes whenever
a SuperNode restarts; the name does not. Without ``node-name`` a partition node is
called ``partition-<k>`` and a file node the file's stem. The node's seed comes from
the same stable identity (``partition-id`` if given, else the name), never from the
Flower node id, so a rerun with the same data and seed gives the same numbers.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from gems_fl.data import DATASET_SHAPES, FeatureOptions, load_dataset, node_data, parse_division

if TYPE_CHECKING:  # settings sit above data; data only reads a few attributes
    from gems_fl.settings import Settings

NPZ_KEYS = ("x_train", "y_train", "x_val", "y_val")


class NodeDataError(ValueError):
    """A node's config or data does not fit the run; the message says what to fix."""


@dataclass
class NodeData:
    """One node's identity, seed and local train/validation data."""

    name: str
    seed: int
    source: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    num_classes: int
    x_test: np.ndarray | None = None  # the node's own test split, where it holds one
    y_test: np.ndarray | None = None

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(x_train, y_train, x_val, y_val)``."""
        return self.x_train, self.y_train, self.x_val, self.y_val

    @property
    def num_features(self) -> int:
        """Features per sample."""
        return int(self.x_train.shape[1])


def node_seed(seed: int, partition_id: int) -> int:
    """Per-node seed: different nodes initialise differently, reproducibly."""
    return seed * 10_007 + partition_id


def name_number(name: str) -> int:
    """A stable number for a node name (seeds nodes that have no ``partition-id``)."""
    return int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 1_000_000


def node_name(node_config: Mapping[str, Any]) -> str:
    """The node's stable name: ``node-name``, else derived from its data source."""
    name = str(node_config.get("node-name", "")).strip()
    if name:
        return name
    if "partition-id" in node_config:
        return f"partition-{int(node_config['partition-id'])}"
    if node_config.get("data-path"):
        return Path(str(node_config["data-path"])).stem
    raise NodeDataError(
        "the node config names no data: start the SuperNode with "
        "--node-config \"data-path='/path/to/site.npz' node-name='site-a'\" "
        "(or partition-id=<k> num-partitions=<K> for a demo slice of the run's dataset)"
    )


def load_node_data(settings: "Settings", node_config: Mapping[str, Any]) -> NodeData:
    """This node's data for the run, from ``data-path`` or ``partition-id``.

    Raises
    ------
    NodeDataError
        The node config names no data, the file is missing or malformed, or its
        number of features or classes disagrees with the run's ``dataset``.
    """
    name = node_name(node_config)
    has_partition = "partition-id" in node_config
    seed = node_seed(settings.seed, int(node_config["partition-id"]) if has_partition
                     else name_number(name))
    data_path = str(node_config.get("data-path", "")).strip()
    if data_path:
        num_features, num_classes = DATASET_SHAPES[settings.dataset]
        arrays = load_node_file(data_path)
        check_node_arrays(arrays, num_features, num_classes, settings.dataset,
                          where=f"node '{name}': {data_path}")
        return NodeData(name, seed, f"data-path={data_path}", *arrays, num_classes=num_classes)
    if not has_partition or "num-partitions" not in node_config:
        raise NodeDataError(
            f"node '{name}': the node config has neither data-path nor both partition-id "
            "and num-partitions; give --node-config \"data-path='/path/to/site.npz'\""
        )
    partition_id = int(node_config["partition-id"])
    num_partitions = int(node_config["num-partitions"])
    data_dir = str(node_config.get("data-dir", settings.data_dir)) or None
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=data_dir,
                          features=FeatureOptions.from_settings(settings))
    division = parse_division(settings.label_division, num_partitions, splits.num_classes)
    arrays = node_data(splits, division, partition_id, settings.seed)
    return NodeData(name, seed, f"partition {partition_id} of {num_partitions}", *arrays,
                    num_classes=splits.num_classes)


def load_node_file(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read a node's data file: ``.npz`` (``x_train``, ``y_train``, ``x_val``, ``y_val``)
    or ``.csv`` (``<stem>.csv`` is training data, ``<stem>_val.csv`` validation data; one
    sample per row, the label in the last column, no header).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise NodeDataError(f"data-path {path} does not exist or is not a file")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                missing = [k for k in NPZ_KEYS if k not in f.files]
                if missing:
                    raise NodeDataError(
                        f"{path} lacks array(s) {', '.join(missing)}; a node's .npz must hold "
                        f"{', '.join(NPZ_KEYS)} (found: {', '.join(f.files) or 'none'})")
                arrays = tuple(np.asarray(f[k]) for k in NPZ_KEYS)
        except (OSError, ValueError) as exc:
            if isinstance(exc, NodeDataError):
                raise
            raise NodeDataError(f"{path} cannot be read as .npz: {exc}") from None
        return arrays  # type: ignore[return-value]
    if suffix == ".csv":
        val_path = path.with_name(f"{path.stem}_val.csv")
        if not val_path.is_file():
            raise NodeDataError(f"{path} is a CSV training file, so the validation data must "
                                f"lie next to it as {val_path}; it does not exist")
        out = []
        for p in (path, val_path):
            try:
                table = np.loadtxt(p, delimiter=",", ndmin=2)
            except ValueError as exc:
                raise NodeDataError(f"{p} is not a numeric CSV without header: {exc}") from None
            out += [table[:, :-1], table[:, -1]]
        return tuple(out)  # type: ignore[return-value]
    raise NodeDataError(f"data-path {path}: unknown file type '{suffix}'; use .npz or .csv")


def check_node_arrays(
    arrays: tuple[np.ndarray, ...], num_features: int, num_classes: int, dataset: str, where: str
) -> None:
    """Check shapes, labels and values of a node's arrays against the run's dataset."""
    x_tr, y_tr, x_val, y_val = arrays
    for label, x, y in (("train", x_tr, y_tr), ("val", x_val, y_val)):
        if x.ndim != 2:
            raise NodeDataError(f"{where}: x_{label} has shape {x.shape}; expected a 2-D "
                                "array (samples x features)")
        if x.shape[1] != num_features:
            raise NodeDataError(
                f"{where}: x_{label} has {x.shape[1]} features but the run's dataset "
                f"'{dataset}' has {num_features}; give this node data with {num_features} "
                "features per sample, or run with the matching dataset setting")
        if y.ndim != 1 or len(y) != len(x):
            raise NodeDataError(f"{where}: y_{label} has shape {y.shape}; expected "
                                f"({len(x)},), one label per row of x_{label}")
        if len(y) == 0:
            raise NodeDataError(f"{where}: the {label} split is empty")
        if not np.issubdtype(x.dtype, np.number) or not np.all(np.isfinite(x)):
            raise NodeDataError(f"{where}: x_{label} must be finite numbers")
        if not np.issubdtype(y.dtype, np.number) or not np.all(np.equal(np.mod(y, 1), 0)):
            raise NodeDataError(f"{where}: y_{label} must be integer class labels")
        if y.min() < 0 or y.max() >= num_classes:
            raise NodeDataError(
                f"{where}: y_{label} has labels in [{int(y.min())}, {int(y.max())}] but the "
                f"run's dataset '{dataset}' has {num_classes} classes (labels 0..{num_classes - 1})")


def cast_node_arrays(data: NodeData) -> NodeData:
    """The node's arrays in the dtypes the trainers use (float32 features, int64 labels)."""
    data.x_train = np.ascontiguousarray(data.x_train, dtype=np.float32)
    data.x_val = np.ascontiguousarray(data.x_val, dtype=np.float32)
    data.y_train = np.asarray(data.y_train).astype(np.int64)
    data.y_val = np.asarray(data.y_val).astype(np.int64)
    if data.y_test is not None:
        data.x_test = np.ascontiguousarray(data.x_test, dtype=np.float32)
        data.y_test = np.asarray(data.y_test).astype(np.int64)
    return data


def write_partition_files(folder: str | Path, num_nodes: int, *, dataset: str = "digits",
                          label_division: str = "paper", seed: int = 0,
                          data_dir: str | None = None) -> list[Path]:
    """Write each partition of ``dataset`` as ``site-<k>.npz`` (demo node data files).

    The files hold exactly what partition node ``k`` trains on in a simulation with
    the same ``label-division`` and ``seed``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    splits = load_dataset(dataset, seed=seed, data_dir=data_dir)
    division = parse_division(label_division, num_nodes, splits.num_classes)
    paths = []
    for k in range(num_nodes):
        x_tr, y_tr, x_val, y_val = node_data(splits, division, k, seed)
        paths.append(folder / f"site-{k}.npz")
        np.savez(paths[-1], x_train=x_tr, y_train=y_tr, x_val=x_val, y_val=y_val)
    return paths
