"""What every node of a run must share about the data: features, classes, scaling.

The server settles it in the identity round (:mod:`gems_fl.protocol.roster`) and sends
it with every later message as extra keys of the ``config`` ConfigRecord, so each node
maps its class names to the same indices and scales its features the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from gems_fl.data.feature_map import FeatureMap
from gems_fl.learning.model_kinds import feature_map_classes

NODE_FILES = "node-files"


class Scaling(StrEnum):
    """How a run scales the features (``standardize`` once ``auto`` is resolved); the
    setting stays its text, which compares equal to its member."""

    OFF = "off"
    NODE = "node"
    FEDERATED = "federated"
    RANGES = "ranges"


STANDARDIZE_CHOICES = tuple(s.value for s in Scaling)
AUTO_STANDARDIZE = "auto"  # ranges if declared; federated for node-files (not under DP); off
SHARED_SCALING = (Scaling.FEDERATED.value, Scaling.RANGES.value)  # one centre and scale for all, in the agreement


def resolve_standardize(value: str, dataset: str, private: bool, ranges: bool = False) -> str:
    """``standardize`` as a run applies it: ``auto`` is ``ranges`` when the operator
    declared feature ranges (``ranges``), else ``federated`` for sites' own files (features
    on any scale) unless the run is differentially private (the sums would leave a node
    unnoised), else ``off`` (a named dataset's loader scales it)."""
    if value != AUTO_STANDARDIZE:
        return value
    if ranges:
        return Scaling.RANGES.value
    return (Scaling.FEDERATED if dataset == NODE_FILES and not private else Scaling.OFF).value
FEATURES_KEY = "agreed-num-features"
CLASSES_KEY = "agreed-classes"
MEAN_KEY = "scale-mean"
STD_KEY = "scale-std"
COLUMNS_KEY = "agreed-columns"


@dataclass
class DataAgreement:
    """The run's number of features, class names (index order) and optional scaling."""

    num_features: int
    classes: list[str]
    mean: np.ndarray | None = None  # federated standardisation (all nodes' training rows)
    std: np.ndarray | None = None
    columns: list[str] | None = None  # feature names in the run's order (sites with headers)
    features: FeatureMap | None = None  # the model's map, after scaling
    #: category columns' values, each one's 0/1 columns ``<column>=<value>`` in ``columns``
    categories: dict[str, list[str]] | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def model_features(self) -> int:
        """The width of the model's input: the feature map's, else the data's."""
        return self.features.dim if self.features is not None else int(self.num_features)

    def map_features(self, x: np.ndarray | None) -> np.ndarray | None:
        """``x`` (already scaled) through the run's feature map, if it has one."""
        if x is None or self.features is None:
            return x
        return self.features.transform(x)

    def to_config(self, whole: bool = True) -> dict[str, Any]:
        """Extra ``config`` keys for the train and evaluate messages (``whole=False``: the
        feature map's large parts by their hash only, for the messages after a node got
        them)."""
        out: dict[str, Any] = {FEATURES_KEY: int(self.num_features),
                               CLASSES_KEY: [str(c) for c in self.classes]}
        if self.mean is not None and self.std is not None:
            out[MEAN_KEY] = [float(v) for v in self.mean]
            out[STD_KEY] = [float(v) for v in self.std]
        if self.columns is not None:
            out[COLUMNS_KEY] = list(self.columns)
        if self.features is not None:
            out.update(self.features.to_config(whole))
        return out

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"num_features": int(self.num_features), "classes": list(self.classes)}
        if self.mean is not None and self.std is not None:
            out["scale"] = {"mean": [float(v) for v in self.mean],
                            "std": [float(v) for v in self.std]}
        if self.columns is not None:
            out["columns"] = list(self.columns)
        if self.features is not None:
            out[self.features.JSON_KEY] = self.features.to_json()
        if self.categories:
            out["categories"] = {k: list(v) for k, v in self.categories.items()}
        return out

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DataAgreement | None:
        """The agreement carried by a message's config (None: the identity query)."""
        if FEATURES_KEY not in config or CLASSES_KEY not in config:
            return None
        mean = config.get(MEAN_KEY)
        std = config.get(STD_KEY)
        columns = config.get(COLUMNS_KEY)
        return cls(int(config[FEATURES_KEY]), [str(c) for c in config[CLASSES_KEY]],
                   None if mean is None else np.asarray(mean, dtype=np.float64),
                   None if std is None else np.asarray(std, dtype=np.float64),
                   None if columns is None else [str(c) for c in columns],
                   feature_map_from_config(config))


def feature_map_from_config(config: Mapping[str, Any]) -> FeatureMap | None:
    """The feature map a message's config carries, if any."""
    return next((fmap for kind in feature_map_classes()
                 if (fmap := kind.from_config(config)) is not None), None)


def feature_map_from_saved(dataset: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
                           ) -> FeatureMap | None:
    """The feature map a saved model carries, if any: ``dataset`` is results.json's
    dataset record (each map's own key in it), ``arrays`` the model file's."""
    return next((fmap for kind in feature_map_classes()
                 if (fmap := kind.from_saved(dataset.get(kind.JSON_KEY, {}), arrays)) is not None),
                None)
