"""GEMS without Flower: build a node's space, aggregate spaces, check a model, and load a
finished run's model to predict on new rows.

A notebook needs nothing else::

    from gems_fl.api import node_space, aggregate, check, load_model

    spaces = [node_space(w_k, x_tr, y_tr, x_val, y_val, eps=0.7) for ...]  # one per node
    merged = aggregate(spaces)             # h_G, and whether it lies in every space
    check(merged.weights, spaces[0])       # distance, radius, inside
    model = load_model("gems-results/run-1")
    model.predict(x_new)                   # class names, with the run's own scaling

A linear layer ``W`` is the ``(C, d + 1)`` matrix ``[weight | bias]``: ``C`` classes,
``d`` input features, the bias last (what ``torch.nn.Linear`` holds as ``weight`` and
``bias``). Everything here is numpy in, numpy out; nothing imports ``flwr``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gems_fl.data.agreement import FeatureMap, feature_map_from_saved
from gems_fl.data.categories import encode_raw_columns
from gems_fl.geometry import linalg
from gems_fl.geometry.kinds import (
    AggregateOptions,
    LayerSpace,
    SpaceOptions,
    build_layer_space,
    space_kind,
)
from gems_fl.geometry.spaces import GramSpace, Space
from gems_fl.learning.threads import compute_threads

__all__ = ["Aggregate", "Check", "GEMSModel", "NodeSpace", "aggregate", "check", "load_model",
           "model_from_state", "node_space"]

MODEL_FILE = "gems_model.npz"  # what a run writes beside results.json
RESULTS_FILE = "results.json"
SAVED_FILE = "gems_model.json"  # GEMSModel.save: the classes and the scaling


@dataclass(frozen=True)
class NodeSpace:
    """One node's good-enough space and what it was found from.

    Attributes
    ----------
    space : Space or GramSpace
        The space: ``space.center`` is the node's ``W`` flattened (``C * (d + 1)``),
        ``space.radius`` its radius in the kind's units.
    kind : str
        ``"gram"``, ``"ball"`` or ``"ellipsoid"``.
    certified_radius : float
        Closed-form radius within which no model drops below ``eps`` on the node's
        validation data (``inf`` when ``eps`` is 0).
    center_accuracy : float
        The node's own model's validation accuracy.
    num_train : int
        The node's training-sample count (its weight in :func:`aggregate`).
    shape : tuple of int
        ``(C, d + 1)``, the shape of the node's ``W``.
    """

    space: Space | GramSpace
    kind: str
    certified_radius: float
    center_accuracy: float
    num_train: int
    shape: tuple[int, int]

    @property
    def weights(self) -> np.ndarray:
        """The node's ``W``, shape ``(C, d + 1)``."""
        return self.space.center.reshape(self.shape)


@dataclass(frozen=True)
class Aggregate:
    """``h_G`` and where it lies.

    Attributes
    ----------
    weights : np.ndarray
        ``h_G`` as ``(C, d + 1)`` ``[weight | bias]``.
    inside : list of bool
        Per space, whether ``h_G`` lies in it.
    found : bool
        ``h_G`` lies in every space.
    method : str
        How ``h_G`` was chosen (``closed-form``, ``shared``, ``dykstra``, a fallback).
    """

    weights: np.ndarray
    inside: list[bool]
    found: bool
    method: str


@dataclass(frozen=True)
class Check:
    """A model against one space: ``distance <= radius`` means inside."""

    distance: float
    radius: float
    inside: bool


def _as_matrix(name: str, value: np.ndarray) -> np.ndarray:
    """A finite 2-D float64 array, else ``ValueError`` naming ``name``."""
    return linalg.layer_matrix(name, value).numpy()


def node_space(
    weights: np.ndarray,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    *,
    kind: str = "gram",
    eps: float = 0.4,
    seed: int = 0,
    num_directions: int = 500,
    r_max: float = 0.0,
    delta: float = 0.01,
    gram_rank: int | str = 0,
    label_moments: bool = True,
    class_grams: bool = False,
    class_components: int = 1,
) -> NodeSpace:
    """A node's good-enough space around its trained linear model.

    Parameters
    ----------
    weights : np.ndarray, shape (C, d + 1)
        The node's trained model ``[weight | bias]``.
    x_train : np.ndarray, shape (n, d)
        The node's training inputs (the Gram matrix of ``kind='gram'``).
    y_train : np.ndarray, shape (n,)
        Its training labels in ``[0, C)`` (their count weighs the node in :func:`aggregate`).
    x_val : np.ndarray, shape (m, d)
        Validation inputs: the radius keeps accuracy ``>= eps`` on them.
    y_val : np.ndarray, shape (m,)
        Validation labels in ``[0, C)``.
    kind : {"gram", "ball", "ellipsoid"}
        The kind of space (docs/method.md, "Good-enough spaces").
    eps : float
        Minimum validation accuracy of a good-enough model, in ``[0, 1]``.
    seed, num_directions, r_max, delta, gram_rank
        The radius search and the Gram form (as the run settings of the same names;
        ``gram_rank=0``, the exact matrix, where the run's default is ``"auto"``).
    label_moments : bool
        ``kind='gram'``: keep the label moments, which :func:`aggregate`'s
        ``gram_point='pooled'`` and ``'lda'`` need.
    class_grams : bool
        ``kind='gram'`` with ``label_moments``: also keep the node's Gram matrix of each
        class it holds, which :func:`aggregate`'s ``gram_point='gaussian'`` needs.
    class_components : int
        With ``class_grams``: one matrix per k-means component of each class, up to this
        many (:mod:`gems_fl.geometry.components`), for ``gram_point='mixture'``.

    Returns
    -------
    NodeSpace
    """
    w = _as_matrix("weights", weights)
    xt, xv = _as_matrix("x_train", x_train), _as_matrix("x_val", x_val)
    yt, yv = np.asarray(y_train), np.asarray(y_val)
    if w.shape[1] != xt.shape[1] + 1 or xv.shape[1] != xt.shape[1]:
        raise ValueError(f"weights has shape {w.shape}, x_train {xt.shape}, x_val {xv.shape}: "
                         "weights must be (C, d + 1) for d input features (bias last)")
    if yt.shape != (len(xt),) or yv.shape != (len(xv),):
        raise ValueError(f"y_train {yt.shape} / y_val {yv.shape} must hold one label per row "
                         f"of x_train ({len(xt)}) / x_val ({len(xv)})")
    options = SpaceOptions(kind=kind, eps=eps, num_directions=num_directions, r_max=r_max,
                           delta=delta, gram_rank=gram_rank, label_moments=label_moments,
                           class_grams="true" if class_grams else "false",
                           class_components=int(class_components))
    layer: LayerSpace = build_layer_space(w, (xt, yt), xv, yv, options, seed)
    return NodeSpace(layer.space, kind, layer.certified_radius, layer.center_accuracy, len(yt),
                     (int(w.shape[0]), int(w.shape[1])))


def aggregate(spaces: Sequence[NodeSpace], *, seed: int = 0, no_intersection: str = "min-penalty",
              gram_ridge: float = 1e-6, gram_point: str = "closed-form",
              pooled_ridge: float = 1e-3) -> Aggregate:
    """``h_G`` for the spaces of several nodes (all of one kind and one layer shape).

    Parameters
    ----------
    spaces : sequence of NodeSpace
        One per node, from :func:`node_space`.
    seed, no_intersection, gram_ridge, gram_point, pooled_ridge
        As the run settings of the same names. A run's ``gram-point='auto'`` chooses among
        the points on the nodes' validation rows (the selection round); spaces alone do not
        carry those rows, so this function solves the one point named (``closed-form``, the
        paper's). :class:`gems_fl.estimator.GEMSClassifier` runs the whole protocol,
        selection included, and gives the model a run gives.

    Returns
    -------
    Aggregate
        ``weights`` has shape ``(C, d + 1)``.
    """
    if not spaces:
        raise ValueError("aggregate() needs at least one NodeSpace")
    kinds = {s.kind for s in spaces}
    if len(kinds) != 1:
        raise ValueError(f"spaces of several kinds {sorted(kinds)}: aggregate one kind at a time")
    kind = kinds.pop()
    options = AggregateOptions(kind=kind, no_intersection=no_intersection, seed=seed,
                               gram_ridge=gram_ridge, gram_point=gram_point,
                               pooled_ridge=pooled_ridge)
    with compute_threads():  # the run's thread policy: the same bits as a run's point
        result = space_kind(kind).aggregate([s.space for s in spaces],
                                            [s.num_train for s in spaces], options)
    shape = spaces[0].weights.shape
    return Aggregate(np.asarray(result.point, dtype=np.float64).reshape(shape),
                     [bool(i) for i in result.inside], bool(result.found), str(result.method))


def check(weights: np.ndarray, space: NodeSpace) -> Check:
    """Whether the model ``weights`` ``(C, d + 1)`` lies in ``space``."""
    w = _as_matrix("weights", weights)
    if w.size != space.space.center.size:
        raise ValueError(f"weights has {w.size} entries; the space's models have "
                         f"{space.space.center.size}")
    distance = space.space.distance(w.reshape(-1))
    return Check(float(distance), float(space.space.radius), bool(space.space.contains(w.reshape(-1))))


@dataclass(frozen=True)
class GEMSModel:
    """A finished run's ``h_G`` with the run's class names and feature scaling.

    Attributes
    ----------
    layers : list of (weight, bias)
        Hidden layers (ReLU) then the output layer; a logistic model has only the latter.
    classes : list of str
        Class names in index order (the identity round's agreement).
    mean, std : np.ndarray or None
        The run's federated standardisation, applied before the model; None when the
        run did not scale features (``standardize='off'``).
    features : FeatureMap or None
        The run's fixed map of the rows (``model='random-features'``, ``'kernel'``),
        applied after the scaling.
    feature_names : list of str or None
        The feature columns the run matched the sites by (their header names), in the
        model's order; None when the sites' files had no names (matched by position).
        A category column's 0/1 columns are named ``<column>=<value>``.
    categories : dict of str to list of str
        The category columns' values: a table holding the raw column (text) is encoded
        as the run encoded the sites' files; a value no site held raises, named.
    """

    layers: list[tuple[np.ndarray, np.ndarray]]
    classes: list[str]
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    features: FeatureMap | None = None
    feature_names: list[str] | None = None
    categories: dict[str, list[str]] = field(default_factory=dict)

    @property
    def num_features(self) -> int:
        if self.features is not None:
            return int(self.features.num_inputs)
        return int(self.layers[0][0].shape[1])

    def logits(self, x) -> np.ndarray:
        """Logits ``(n, C)`` for rows ``x`` ``(n, d)`` in the run's raw feature units.

        ``x`` with column names (a pandas DataFrame) is matched by name, in any order;
        an array is taken by position, as scikit-learn does."""
        z = rows_in_order(encode_table(x, self.categories), self.feature_names,
                          self.num_features)
        if self.mean is not None:
            z = (z - self.mean) / self.std
        if self.features is not None:
            z = self.features.transform(z).astype(np.float64)
        for i, (w, b) in enumerate(self.layers):
            z = z @ w.T + b
            if i < len(self.layers) - 1:
                z = np.maximum(z, 0.0)
        return z

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Class names ``(n,)`` for rows ``x`` ``(n, d)``."""
        return np.asarray(self.classes, dtype=object)[self.logits(x).argmax(axis=1)]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Class probabilities ``(n, C)`` (the softmax of :meth:`logits`), columns in the
        order of :attr:`classes`; each row's largest is :meth:`predict`'s class."""
        z = self.logits(x)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def save(self, folder: str | Path) -> Path:
        """Write the model into ``folder`` (``gems_model.npz`` as a run writes it, and
        ``gems_model.json`` with the classes and the scaling); :func:`load_model` reads
        it back. Returns the folder."""
        folder = Path(folder).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        *hidden, (weight, bias) = self.layers
        for i, (w, b) in enumerate(hidden):
            arrays[f"hidden.{i}.weight"], arrays[f"hidden.{i}.bias"] = w, b
        out = "output." if hidden else ""
        arrays[f"{out}weight"], arrays[f"{out}bias"] = weight, bias
        if self.features is not None:
            arrays.update(self.features.arrays())
        np.savez(folder / MODEL_FILE, **arrays)
        meta: dict[str, object] = {"classes": list(self.classes),
                                   "standardize": "off" if self.mean is None else "federated"}
        if self.mean is not None and self.std is not None:
            meta["scale"] = {"mean": self.mean.tolist(), "std": self.std.tolist()}
        if self.features is not None:
            meta[self.features.JSON_KEY] = self.features.to_json()
        if self.feature_names is not None:
            meta["columns"] = list(self.feature_names)
        if self.categories:
            meta["categories"] = {k: list(v) for k, v in self.categories.items()}
        (folder / SAVED_FILE).write_text(json.dumps({"dataset": meta}, indent=1) + "\n")
        return folder


def encode_table(x, categories: dict[str, list[str]]):
    """A table (anything with ``columns``, such as a pandas DataFrame) with its raw
    category columns replaced by their 0/1 columns ``<column>=<value>``, as the run
    encoded the sites' files; anything else as it is."""
    given = getattr(x, "columns", None)
    if not categories or given is None:
        return x
    given = [str(c) for c in given]
    if not any(c in categories for c in given):
        return x
    names, cells = encode_raw_columns(given, np.asarray(x, dtype=object), categories, "x")
    return _Table(cells, names)


@dataclass(frozen=True)
class _Table:
    """Rows with column names (what :func:`rows_in_order` matches by name)."""

    values: np.ndarray
    columns: list[str]

    def __array__(self, dtype=None, copy=None):
        return self.values if dtype is None else self.values.astype(dtype)


def rows_in_order(x, names: list[str] | None, width: int, who: str = "the model") -> np.ndarray:
    """``x`` as a float64 ``(n, width)`` matrix with its columns in the order ``names``.

    A table with column names (anything with ``columns``, such as a pandas DataFrame) is
    matched by name when ``names`` is known: extra or missing columns raise a
    ``ValueError`` naming them. An array (or a table when ``names`` is None) is taken by
    position and must have ``width`` columns.
    """
    given = getattr(x, "columns", None)
    if given is not None and names is not None:
        given = [str(c) for c in given]
        extra = [c for c in given if c not in names]
        missing = [c for c in names if c not in given]
        if extra or missing:
            parts = ([f"lacks column(s) {', '.join(missing)}"] if missing else []) + (
                [f"has column(s) {', '.join(extra)} that {who} was not trained on (drop them)"]
                if extra else [])
            raise ValueError(f"x {'; '.join(parts)}; {who} takes the columns "
                             f"{', '.join(names)} (matched by name, in any order)")
        repeated = sorted({c for c in given if given.count(c) > 1})
        if repeated:
            raise ValueError(f"x holds column(s) {', '.join(repeated)} more than once")
        z = _numbers(np.asarray(x)[:, [given.index(c) for c in names]])
    else:
        z = _numbers(x)
    if z.ndim != 2:
        raise ValueError(f"x has shape {z.shape}; expected a 2-D array (samples x features)")
    if z.shape[1] != width:
        raise ValueError(f"x has {z.shape[1]} features, but {who} is expecting {width} features "
                         "as input" + (f" ({', '.join(names)})" if names else ""))
    if not np.all(np.isfinite(z)):
        raise ValueError("x holds NaN or infinite values; the model takes finite numbers")
    return z


def _numbers(x) -> np.ndarray:
    try:
        return np.asarray(x, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"x holds values that are not numbers ({exc}); every feature must "
                         "be a number") from None


def load_model(run_folder: str | Path) -> GEMSModel:
    """The ``h_G`` a run wrote (``gems_model.npz``) with its classes and scaling.

    Parameters
    ----------
    run_folder : str or Path
        The run's folder (``<output-dir>/run-<id>``) holding ``results.json`` and
        ``gems_model.npz`` (or its ``results.json`` itself), or a folder
        :meth:`GEMSModel.save` wrote.
    """
    folder = Path(run_folder).expanduser()
    if folder.is_file() and folder.name in (RESULTS_FILE, MODEL_FILE, SAVED_FILE):
        folder = folder.parent  # the run's results.json (or model file) names its folder
    model_path, results_path = folder / MODEL_FILE, folder / RESULTS_FILE
    if (folder / SAVED_FILE).is_file():  # GEMSModel.save's
        results_path = folder / SAVED_FILE
    for path in (model_path, results_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: pass the folder of a finished run "
                                    "(<output-dir>/run-<id>)")
    dataset = json.loads(results_path.read_text()).get("dataset", {})
    with np.load(model_path) as state:
        return model_from_state(dataset, state, str(folder))


def model_from_state(dataset: Mapping[str, Any], state: Mapping[str, np.ndarray],
                     where: str = "the run") -> GEMSModel:
    """The model of a run's ``dataset`` record (its classes, scaling, columns and feature
    map, as ``results.json`` holds it) and its model arrays (``gems_model.npz``'s, or
    :class:`gems_fl.serverapp.finish.RunOutcome`'s ``model_state``)."""
    if dataset.get("standardize") == "node":
        raise ValueError(f"{where}: the run used standardize='node' (each node scaled its "
                         "features its own way), so there is no one scaling for new rows; "
                         "rerun with standardize='federated' or 'off'")
    names = list(state.keys())
    hidden = sorted({int(k.split(".")[1]) for k in names if k.startswith("hidden.")})
    layers = [(state[f"hidden.{i}.weight"], state[f"hidden.{i}.bias"]) for i in hidden]
    out = "output." if hidden else ""
    layers.append((state[f"{out}weight"], state[f"{out}bias"]))
    features = feature_map_from_saved(dataset, state)
    layers = [(np.asarray(w, dtype=np.float64), np.asarray(b, dtype=np.float64)) for w, b in layers]
    classes = [str(c) for c in dataset.get("classes", range(layers[-1][0].shape[0]))]
    scale = dataset.get("scale")
    mean = None if scale is None else np.asarray(scale["mean"], dtype=np.float64)
    std = None if scale is None else np.asarray(scale["std"], dtype=np.float64)
    names = dataset.get("columns")
    categories = {str(k): [str(v) for v in values]
                  for k, values in dataset.get("categories", {}).items()}
    return GEMSModel(layers, classes, mean, std, features,
                     None if names is None else [str(c) for c in names], categories)
