"""What a simulation's server holds for the baselines: the nodes' training data pooled
(Global), the test set, and a public sample that no node used (fine-tuning, Raw)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from logging import INFO
from typing import Any

import numpy as np
from flwr.common.logger import log

from gems_fl.data import FeatureOptions, load_dataset, node_data
from gems_fl.data.agreement import SHARED_SCALING, Scaling
from gems_fl.data.partition import division_json


@dataclass(frozen=True)
class ServerDataOptions:
    """What the server's data loading reads of the run's settings
    (``gems_fl.settings.options.server_data_options`` builds it)."""

    dataset: str = "digits"
    seed: int = 0
    data_dir: str = ""
    features: FeatureOptions = field(default_factory=FeatureOptions)
    public_samples: int = 1000
    public_data: str = ""
    label_column: str = ""
    id_columns: str = "auto"
    standardize: str = "off"
    #: whether a comparison row tunes on the public sample (``baselines='all'``): then a
    #: public pool smaller than ``public_samples`` is noted
    tunes_on_public: bool = False


@dataclass
class ServerData:
    """Data the server holds in a simulation (none of it is a node's).

    The rows only the comparison rows that train on them read (the nodes' training rows
    pooled for Global, each node's part for the MLP's Local rows, the public pool of the
    fine-tuning curve) are not held: :meth:`with_all_rows` builds them (``load_rows``)
    and puts them through the run's scaling and map (``pending``) the first time one is
    asked for: a default run builds none of those rows, and held through every round
    they were the largest part of the simulation process's memory (docs/scale.md)."""

    test_x: np.ndarray
    test_y: np.ndarray
    public_x: np.ndarray  # drawn from data that no node used
    public_y: np.ndarray
    num_classes: int
    train_x: np.ndarray | None = None  # all nodes' training rows pooled: with_all_rows
    train_y: np.ndarray | None = None
    node_parts: list = field(default_factory=list)  # (x_tr, y_tr, x_val, y_val) per node
    pool_x: np.ndarray | None = None  # the whole public pool (fine-tuning study)
    pool_y: np.ndarray | None = None
    #: ``(train_x, train_y, node_parts, pool_x)`` as loaded, before ``pending``; None
    #: once built
    load_rows: Callable[[], tuple[np.ndarray, np.ndarray, list, np.ndarray | None]] | None = (
        field(default=None, repr=False))
    #: what the test and public rows went through (the scaling, the run's feature map), in
    #: order, still to apply to the rows ``load_rows`` gives
    pending: list[Callable[[np.ndarray], np.ndarray]] = field(default_factory=list, repr=False)

    def with_all_rows(self) -> ServerData:
        """This data with the pooled, per-node and pool rows built and put through the
        run's scaling and map (once)."""
        if self.load_rows is not None:
            self.train_x, self.train_y, self.node_parts, self.pool_x = self.load_rows()
            self.load_rows = None
        for f in self.pending:
            self.train_x = f(self.train_x)
            self.pool_x = None if self.pool_x is None else f(self.pool_x)
            self.node_parts = [(f(p[0]), p[1], f(p[2]), p[3]) for p in self.node_parts]
        self.pending = []
        return self


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
    settings: ServerDataOptions, division: list[list[int]]
) -> tuple[ServerData, dict[str, Any], list[str]]:
    """What a simulation's server holds: the test set and public sample, and the way to
    the nodes' rows (pooled train for Global, each node's part, the public pool) when a
    comparison row asks for them (:meth:`ServerData.with_all_rows`)."""

    def load():
        return load_dataset(settings.dataset, seed=settings.seed,
                            data_dir=settings.data_dir or None, features=settings.features)

    def parts_of(splits) -> list[tuple]:
        return [node_data(splits, division, k, settings.seed) for k in range(len(division))]

    splits = load()
    # the division's counts from the labels alone (the parts' rows are built when asked)
    counts = parts_of(replace(splits, train_x=splits.train_x[:, :0], val_x=splits.val_x[:, :0]))
    notes = []
    size = settings.public_samples
    if size > len(splits.public_y):
        if settings.tunes_on_public:  # only the paper's rows tune on the sample
            notes.append(f"public-samples={size} but {settings.dataset}'s public pool holds "
                         f"{len(splits.public_y)} samples no node uses; using all of them")
        size = len(splits.public_y)
    public_x, public_y = draw_public_sample(splits.public_x, splits.public_y, size, settings.seed)

    def load_rows() -> tuple[np.ndarray, np.ndarray, list, np.ndarray]:
        again = load()
        parts = parts_of(again)
        return (*pooled_in_canonical_order(parts), parts, again.public_x)

    data = ServerData(test_x=splits.test_x, test_y=splits.test_y, public_x=public_x,
                      public_y=public_y, num_classes=splits.num_classes,
                      pool_y=splits.public_y, load_rows=load_rows)
    meta = {
        "name": settings.dataset, "num_nodes": len(division), "label_division": division_json(division),
        "num_features": splits.num_features, "num_classes": splits.num_classes,
        "node_train_total": int(sum(len(c[1]) for c in counts)),
        "node_val_total": int(sum(len(c[3]) for c in counts)),
        "test": int(len(splits.test_y)), "public_pool": int(len(splits.public_y)),
        "public_used": int(size),
    }
    return data, meta, notes


def public_map_rows(settings: ServerDataOptions, agreement) -> tuple[np.ndarray, np.ndarray]:
    """The server's own public rows for a map built from rows (the kernel map's landmarks)
    under ``dp-epsilon``,
    scaled as the nodes scale theirs (the agreement's scaling; ``node``: the rows' own),
    with their class indices: the ``public-data`` file, else (a named dataset) the public
    sample a simulation's server draws (``public-samples`` rows no node holds)."""
    from gems_fl.data.agreement import NODE_FILES
    from gems_fl.data.site_files import combine_stats, feature_stats

    if settings.public_data.strip():
        public = load_public_data(settings, agreement)
        return public.x, public.y
    if settings.dataset == NODE_FILES:
        raise ValueError("under dp-epsilon the model's map is built from the server's own public "
                         "rows: give the server a public-data file of the sites' features")
    splits = load_dataset(settings.dataset, seed=settings.seed, data_dir=settings.data_dir or None,
                          features=settings.features)
    x, y = draw_public_sample(splits.public_x, splits.public_y,
                              min(settings.public_samples, len(splits.public_y)), settings.seed)
    x = np.asarray(x, dtype=np.float64)
    if agreement.mean is not None:
        x = (x - agreement.mean) / agreement.std
    elif settings.standardize == Scaling.NODE and len(x):
        mean, std = combine_stats([feature_stats(x)])
        x = (x - mean) / std
    return x.astype(np.float32), np.asarray(y)


@dataclass
class PublicData:
    """The server's own ``public-data`` file: a sample to tune on (``x``, ``y``) and
    optionally a test split, mapped to the run's classes and scaled like the nodes."""

    x: np.ndarray
    y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray

    def as_server_data(self, num_classes: int) -> ServerData:
        """A :class:`ServerData` with no pooled node data (Global is skipped)."""
        if len(self.test_y) == 0:
            raise ValueError("evaluate-on-server=true with dataset='node-files' evaluates on "
                             "public-data's test split (x_test/y_test, or <stem>_test.csv), "
                             "which the file lacks; add one or set evaluate-on-server=false")
        empty = np.zeros((0, self.x.shape[1]), dtype=np.float32)
        return ServerData(train_x=empty, train_y=np.zeros(0, dtype=np.int64),
                          test_x=self.test_x, test_y=self.test_y, public_x=self.x,
                          public_y=self.y, num_classes=num_classes,
                          pool_x=self.x, pool_y=self.y)


def load_public_data(settings: ServerDataOptions, agreement) -> PublicData:
    """Read ``public-data`` (npz ``x``/``y`` [+ ``x_test``/``y_test``] or csv [+ ``_test.csv``])
    the way a node reads its file, check it against the run's agreed features and
    classes, map the labels, and scale it (federated: the nodes' mean/std; node: its own).

    Raises ``ValueError`` naming the file and the problem.
    """
    from gems_fl.data.categories import format_categories
    from gems_fl.data.site_files import (
        SiteFileError,
        align_columns,
        combine_stats,
        encode_labels,
        feature_stats,
        public_data_path,
        read_site_file,
        site_problems,
    )

    path = str(public_data_path(settings.public_data) or settings.public_data.strip())
    try:
        site = read_site_file(path, settings.label_column, public=True,
                              id_columns=settings.id_columns,
                              categories=format_categories(agreement.categories or {}))
    except SiteFileError as exc:
        raise ValueError(f"public-data: {exc}") from None
    columns = align_columns(site, agreement.columns)
    problems = ([columns] if columns else []) + site_problems(site, agreement.num_features,
                                                              agreement.classes)
    if problems:
        raise ValueError(f"public-data {path}: {'; '.join(problems)}")
    x = site.x.get("train", np.zeros((0, agreement.num_features)))
    test_x = site.x.get("test", np.zeros((0, agreement.num_features)))
    if "train" not in site.x:
        log(INFO, "public-data %s holds a test split only (%d rows): the server evaluates on "
            "it; nothing to fine-tune on, so no GEMS tuned and no Raw", path, len(test_x))
    mean = std = None
    if settings.standardize in SHARED_SCALING and agreement.mean is not None:
        mean, std = agreement.mean, agreement.std
    elif settings.standardize == Scaling.NODE:
        mean, std = combine_stats([feature_stats(x)])
    if mean is not None:
        x, test_x = (x - mean) / std, (test_x - mean) / std
    x, test_x = agreement.map_features(x), agreement.map_features(test_x)
    test_y = site.y.get("test", np.array([], dtype=str))
    train_y = site.y.get("train", np.array([], dtype=str))
    return PublicData(np.asarray(x, dtype=np.float32), encode_labels(train_y, agreement.classes),
                      np.asarray(test_x, dtype=np.float32), encode_labels(test_y, agreement.classes))


def scale_server_data(data: ServerData, agreement, settings: ServerDataOptions) -> None:
    """Scale what a simulation's server holds as the nodes scale theirs (``standardize``):
    federated with the nodes' combined mean/std, node with the pooled training rows'; then
    through the run's random-feature map, as the nodes map theirs. The rows built later
    (:meth:`ServerData.with_all_rows`) go through the same steps."""
    steps = []
    if settings.standardize != Scaling.OFF:
        steps.append(_scaling(data, agreement, settings))
    if agreement is not None and agreement.features is not None:
        steps.append(agreement.map_features)
    for f in steps:
        data.test_x, data.public_x = f(data.test_x), f(data.public_x)
        if data.load_rows is None:  # rows already held (node files: the public pool)
            data.train_x = f(data.train_x)
            data.pool_x = None if data.pool_x is None else f(data.pool_x)
            data.node_parts = [(f(p[0]), p[1], f(p[2]), p[3]) for p in data.node_parts]
        else:
            data.pending.append(f)


def _scaling(data: ServerData, agreement, settings: ServerDataOptions
             ) -> Callable[[np.ndarray], np.ndarray]:
    from gems_fl.data.site_files import combine_stats, feature_stats

    if settings.standardize in SHARED_SCALING and agreement is not None and agreement.mean is not None:
        mean, std = agreement.mean, agreement.std
    else:
        # the pooled training rows' own: built (and let go) where the server does not
        # hold them, a non-default path
        pooled = data.train_x if data.load_rows is None else data.load_rows()[0]
        mean, std = combine_stats([feature_stats(pooled)])

    def scale(x):
        return None if x is None else ((np.asarray(x, dtype=np.float64) - mean) / std).astype(np.float32)

    return scale
