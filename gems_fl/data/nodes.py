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
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gems_fl.data import (
    DATASET_SHAPES,
    FeatureOptions,
    load_dataset,
    node_data,
    parse_division,
)
from gems_fl.data.agreement import NODE_FILES, DataAgreement
from gems_fl.data.categories import parse_categories
from gems_fl.data.datasets import shared_splits
from gems_fl.data.site_columns import ID_AUTO
from gems_fl.data.site_files import (
    SiteFile,
    SiteFileError,
    align_columns,
    combine_stats,
    encode_labels,
    feature_stats,
    parse_classes,
    read_site_file,
    site_problems,
    split_off_test,
    split_validation,
)

NPZ_KEYS = ("x_train", "y_train", "x_val", "y_val")  # plus optional x_test, y_test


class NodeDataError(ValueError):
    """A node's config or data does not fit the run; the message says what to fix."""


@dataclass(frozen=True)
class NodeDataOptions:
    """What a node's data loading reads of the run's settings
    (``gems_fl.settings.options.node_data_options`` builds it): the dataset and how it
    is divided, how a site file is read, and how the rows are scaled."""

    dataset: str = "digits"
    seed: int = 0
    data_dir: str = ""
    label_division: str = "paper"
    num_features: int = 0
    classes: str = ""
    label_column: str = ""
    id_columns: str = ID_AUTO
    categories: str = ""  # declared category values (required under dp-epsilon)
    private: bool = False  # dp-epsilon: category values must be declared, never sent
    val_fraction: float = 0.2
    standardize: str = "off"
    features: FeatureOptions = field(default_factory=FeatureOptions)


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
    classes: list[str] = field(default_factory=list)  # class name of each label index
    scale: tuple[np.ndarray, np.ndarray] | None = None  # (mean, std) applied, if any
    columns: list[str] | None = None  # feature names (a CSV header), in the run's order
    notes: list[str] = field(default_factory=list)  # what the node did to its file's rows
    categories: list[str] = field(default_factory=list)  # its category columns, by name

    @property
    def present_classes(self) -> list[str]:
        """Names of the classes this node holds rows of (any split)."""
        ys = [self.y_train, self.y_val] + ([self.y_test] if self.y_test is not None else [])
        held = np.unique(np.concatenate([np.asarray(y).astype(np.int64) for y in ys]))
        names = self.classes or [str(i) for i in range(self.num_classes)]
        return [names[int(i)] for i in held]

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


def site_files(text: str) -> list[str]:
    """The paths of the ``site-files`` setting."""
    return [part.strip() for part in str(text or "").split(",") if part.strip()]


def own_node_config(node_config: Mapping[str, Any], files: str) -> Mapping[str, Any]:
    """The node config a node works with: in a simulation on site files (``site-files``),
    node ``partition-id`` gets that file as its ``data-path`` and its stem as its name;
    a node with its own ``data-path`` keeps it."""
    paths = site_files(files)
    if not paths or node_config.get("data-path") or "partition-id" not in node_config:
        return node_config
    k = int(node_config["partition-id"])
    if not 0 <= k < len(paths):
        raise NodeDataError(f"partition {k}: site-files names {len(paths)} files; the "
                            f"simulation has more nodes than site files")
    return {key: v for key, v in node_config.items()
            if key not in ("partition-id", "num-partitions")} | {
        "data-path": paths[k], "node-name": node_config.get("node-name") or Path(paths[k]).stem}


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


def load_node_data(settings: NodeDataOptions, node_config: Mapping[str, Any],
                   agreement: DataAgreement | None = None) -> NodeData:
    """This node's data for the run, from ``data-path`` or ``partition-id``.

    ``agreement`` (sent by the server with every train and evaluate message) fixes the
    number of features, the class list (labels become indices in it) and, with
    ``standardize='federated'``, the scaling. Without it (the identity query) the
    node's own class names are used and nothing is scaled federatedly.

    Raises
    ------
    NodeDataError
        The node config names no data, the file is missing or malformed, or its
        number of features or classes disagrees with the run; the message starts with
        ``node '<name>'``.
    """
    name = node_name(node_config)
    has_partition = "partition-id" in node_config
    seed = node_seed(settings.seed, int(node_config["partition-id"]) if has_partition
                     else name_number(name))
    data_path = str(node_config.get("data-path", "")).strip()
    if data_path:
        data = _load_file_node(settings, node_config, agreement, name, seed, data_path)
    else:
        data = _load_partition_node(settings, node_config, name, seed, has_partition)
    _split_test(data, node_config)
    _standardize(data, settings, agreement)
    if agreement is not None and agreement.features is not None:
        data.x_train, data.x_val, data.x_test = (agreement.map_features(x) for x in
                                                 (data.x_train, data.x_val, data.x_test))
    return data


def _run_shape(settings: NodeDataOptions, agreement: DataAgreement | None,
               site: SiteFile | None) -> tuple[int | None, list[str] | None, str]:
    """Features, class names and how to call the run in messages."""
    if agreement is not None:
        return agreement.num_features, agreement.classes, "the run"
    if settings.dataset != NODE_FILES:
        num_features, num_classes = DATASET_SHAPES[settings.dataset]
        return num_features, [str(i) for i in range(num_classes)], \
            f"the run's dataset '{settings.dataset}'"
    pinned = parse_classes(settings.classes)
    classes = pinned if isinstance(pinned, list) else None
    if isinstance(pinned, int) and site is not None and all(
            n.lstrip("-").isdigit() for n in site.labels):
        classes = [str(i) for i in range(pinned)]
    return settings.num_features or None, classes, "the run"


def read_node_site(name: str, data_path: str, label_column: str = "",
                   id_columns: str = ID_AUTO, val_fraction: float = 0.2, seed: int = 0,
                   categories: str = "", private: bool = False) -> SiteFile:
    """The node's file, read as :func:`gems_fl.data.site_files.read_site_file` reads it,
    with validation rows split off when it has none (:func:`split_validation`); errors
    name the node. ``private`` (``dp-epsilon``): a category column whose values the
    operator did not declare is refused, since the values a site holds would tell."""
    try:
        site = read_site_file(data_path, label_column, id_columns=id_columns,
                              categories=categories)
        split_validation(site, val_fraction, seed)
    except SiteFileError as exc:
        raise NodeDataError(f"node '{name}': {exc}") from None
    undeclared = sorted(set(site.categories) - set(parse_categories(categories)))
    if private and undeclared:
        raise NodeDataError(
            f"node '{name}': {data_path}: category column(s) {', '.join(undeclared)} under "
            "dp-epsilon: which values a site holds would reach the server unnoised, so the "
            "operator declares them up front, e.g. categories='"
            + "; ".join(f"{b}={'|'.join(site.categories[b])}" for b in undeclared)
            + "' (every value any site may hold), or drop the column(s)")
    return site


def _load_file_node(settings: NodeDataOptions, node_config: Mapping[str, Any],
                    agreement: DataAgreement | None, name: str, seed: int,
                    data_path: str) -> NodeData:
    site = read_node_site(name, data_path, settings.label_column, settings.id_columns,
                          settings.val_fraction, seed, settings.categories, settings.private)
    num_features, classes, run = _run_shape(settings, agreement, site)
    columns = align_columns(site, agreement.columns if agreement is not None else None)
    problems = ([columns] if columns else []) + site_problems(site, num_features, classes, run=run)
    if problems:
        hint = ("; give this node data with the run's features and classes, or run with the "
                "matching dataset setting") if settings.dataset != NODE_FILES else ""
        raise NodeDataError(f"node '{name}': {data_path}: {'; '.join(problems)}{hint}")
    if classes is None:
        classes = site.labels
    y = {split: encode_labels(labels, classes) for split, labels in site.y.items()}
    data = NodeData(name, seed, f"data-path={data_path}", site.x["train"], y["train"],
                    site.x["val"], y["val"], num_classes=len(classes),
                    x_test=site.x.get("test"), y_test=y.get("test"))
    data.classes = list(classes)
    data.columns = site.columns
    data.categories = sorted(site.categories)
    data.notes = site_notes(site)
    return data


def site_notes(site: SiteFile) -> list[str]:
    """What a user should know about how a site file was read: ID-like columns left out,
    validation rows split off, a single class (one line each; shown in the run's summary
    and by ``gems-fl check-data``)."""
    notes = []
    if site.dropped:
        notes.append(f"left out {len(site.dropped)} ID-like column(s): {', '.join(site.dropped)} "
                     "(id-columns='none' keeps them)")
    if site.val_split:
        notes.append(f"no validation rows: {len(site.y['val'])} of its training rows "
                     f"({site.val_split:.0%}, val-fraction, per class, seeded) were set aside")
    if site.categories:
        notes.append("category column(s), one 0/1 column per value: " + "; ".join(
            f"{b} ({len(v)} value(s): {', '.join(v[:6])}{', ...' if len(v) > 6 else ''})"
            for b, v in site.categories.items()))
    held = site.labels
    if len(held) == 1:
        notes.append(f"holds one class ({held[0]}): its own model predicts it everywhere; h_G "
                     "is checked on its rows all the same")
    return notes


def _load_partition_node(settings: NodeDataOptions, node_config: Mapping[str, Any], name: str,
                         seed: int, has_partition: bool) -> NodeData:
    if not has_partition or "num-partitions" not in node_config:
        raise NodeDataError(
            f"node '{name}': the node config has neither data-path nor both partition-id "
            "and num-partitions; give --node-config \"data-path='/path/to/site.npz'\"")
    if settings.dataset == NODE_FILES:
        raise NodeDataError(f"node '{name}': dataset='node-files' needs every node to give "
                            "data-path in its node config; partition-id slices a named dataset")
    partition_id = int(node_config["partition-id"])
    num_partitions = int(node_config["num-partitions"])
    data_dir = str(node_config.get("data-dir", settings.data_dir)) or None
    splits = shared_splits(settings.dataset, settings.seed, data_dir, settings.features)
    division = parse_division(settings.label_division, num_partitions, splits.num_classes)
    arrays = node_data(splits, division, partition_id, settings.seed)
    data = NodeData(name, seed, f"partition {partition_id} of {num_partitions}", *arrays,
                    num_classes=splits.num_classes)
    data.classes = [str(i) for i in range(splits.num_classes)]
    return data


def _split_test(data: NodeData, node_config: Mapping[str, Any]) -> None:
    """``test-fraction`` (node config): split a seeded test split off the training rows,
    unless the node's file already holds one."""
    fraction = float(node_config.get("test-fraction", 0.0) or 0.0)
    if fraction <= 0.0 or data.y_test is not None:
        return
    if fraction >= 1.0:
        raise NodeDataError(f"node '{data.name}': test-fraction={fraction} must be in (0, 1)")
    try:
        data.x_train, data.y_train, data.x_test, data.y_test = split_off_test(
            data.x_train, data.y_train, fraction, data.seed)
    except ValueError as exc:
        raise NodeDataError(f"node '{data.name}': {exc}") from None


def _standardize(data: NodeData, settings: NodeDataOptions, agreement: DataAgreement | None) -> None:
    """Scale features: ``node`` with this node's training mean/std, ``federated`` with the
    mean/std the server combined from every node's sums (carried by ``agreement``)."""
    mode = settings.standardize
    if mode == "off":
        return
    if mode == "node":
        mean, std = combine_stats([feature_stats(data.x_train)])
    elif agreement is not None and agreement.mean is not None and agreement.std is not None:
        mean, std = agreement.mean, agreement.std
    else:
        return  # the identity query: the node reports its sums, nothing is scaled yet
    data.scale = (np.asarray(mean), np.asarray(std))
    data.x_train = (np.asarray(data.x_train, dtype=np.float64) - mean) / std
    data.x_val = (np.asarray(data.x_val, dtype=np.float64) - mean) / std
    if data.x_test is not None:
        data.x_test = (np.asarray(data.x_test, dtype=np.float64) - mean) / std


def load_node_file(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_val, y_val)`` of a node file (see
    :mod:`gems_fl.data.site_files`); integer labels come back as integers."""
    try:
        site = read_site_file(path)
    except SiteFileError as exc:
        raise NodeDataError(str(exc)) from None

    def labels(y: np.ndarray) -> np.ndarray:
        try:
            return y.astype(np.int64)
        except ValueError:
            return y

    return site.x["train"], labels(site.y["train"]), site.x["val"], labels(site.y["val"])


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
