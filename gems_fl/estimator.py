"""GEMS as a scikit-learn classifier: ``GEMSClassifier().fit(X, y, sites=site_of_row)``.

``fit`` runs the real protocol through :func:`gems_fl.fitting.fit`, the same ServerApp
and ClientApp code as ``gems-fl run --site``, over an in-process grid (no Flower
processes, no Ray, no files written): each site trains its own model, sends its
good-enough space, the server intersects them (the run's point selection), and each site
checks ``h_G`` on its own validation rows. So the model is
the one ``gems-fl run --site`` gives on the same rows, labels may be text and each site
may hold any subset of the classes, and features are scaled as a run scales them
(``standardize='auto'``: one mean and std from the sites' sums).

Two ways to give the sites' rows:

- ``fit(X, y, sites=s)``: one table, ``s`` names each row's site (like ``groups`` in
  scikit-learn); each site's node sets its validation rows aside itself (``val-fraction``,
  per class, seeded). Without ``sites`` every row is one site's. This is the form
  ``cross_val_score``, ``GridSearchCV`` and ``Pipeline`` call
  (``cross_val_score(clf, X, y, params={"sites": s})``).
- ``fit({"site-a": {"x_train": ..., "y_train": ..., "x_val": ..., "y_val": ...}, ...})``:
  the sites' own splits, as their files hold them.

A table with column names (a pandas DataFrame) is matched by name, site by site and at
``predict``, as a run matches its sites' headers; arrays are taken by position.

Flower is imported when ``fit`` runs, not when this module is.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import (
    check_array,
    check_consistent_length,
    check_is_fitted,
    column_or_1d,
)

from gems_fl.api import rows_in_order
from gems_fl.fitting import fit as fit_sites
from gems_fl.learning.model_kinds import MODEL_KINDS

__all__ = ["GEMSClassifier", "GoodEnoughWarning", "PooledRowsWarning"]

SITE_KEYS = ("x_train", "y_train", "x_val", "y_val")  # plus optional x_test, y_test
FIXED = ("dataset", "site-files", "output-dir")  # what fit sets itself (output-dir: unused)
ONE_SITE = "site-0"  # fit(X, y) without sites: every row is this site's


class GoodEnoughWarning(UserWarning):
    """``fit`` returned an ``h_G`` that fewer sites found good enough than
    ``min-good-enough`` asks (``warnings.simplefilter("error", GoodEnoughWarning)`` makes
    it an error)."""


class PooledRowsWarning(UserWarning):
    """``fit(X, y)`` without ``sites``: every row is one site's, so nothing is aggregated."""


class GEMSClassifier(ClassifierMixin, BaseEstimator):
    """GEMS over several sites' data, fitted in one call.

    Parameters
    ----------
    eps : float in [0, 1]
        The accuracy each site asks of ``h_G`` on its own validation rows (run setting
        ``eps``). It sizes each site's good-enough space and decides each site's verdict
        (``results_["nodes"][k]["good_enough"]``). With the default space (``gram``), ``h_G``
        is picked from the sites' pooled statistics by validation accuracy and does not
        depend on eps: a grid search over eps returns the same model (scikit-learn's wine,
        3 sites: identical weights for eps 0.3 to 0.9). Set it to the accuracy the sites
        require; it is not a tuning knob.
    model : str, one of gems_fl.learning.model_kinds.MODEL_KINDS (a registered model)
        The model (run setting ``model``).
    seed : int
        Fixes every draw: the same seed and data give the same model.
    settings : mapping, optional
        Any other run settings, keys as in ``pyproject.toml`` (``{"gram-point": "lda"}``);
        ``dataset``, ``site-files`` and ``output-dir`` are the fit's own.
    verbose : bool
        Show the run's log and tables. Default: nothing is printed; Flower's log records
        still reach the ``flwr`` logger (for a handler of your own) and a model the sites
        do not find good enough raises a :class:`GoodEnoughWarning`.

    Attributes
    ----------
    classes_ : np.ndarray
        The class labels, sorted (as ``np.unique`` sorts them); ``predict`` returns them.
    n_features_in_ : int
        Features the model takes.
    feature_names_in_ : np.ndarray of str
        The feature names it was fitted on (only when the sites' tables had column names).
    model_ : GEMSModel
        ``h_G`` with the classes and the scaling of the run (``save`` writes it).
    results_ : dict
        The run's results (what ``results.json`` holds): per-site checks, attendance, ...
    """

    def __init__(self, eps: float = 0.4, model: str = "logistic", seed: int = 0,
                 settings: Mapping[str, Any] | None = None, verbose: bool = False) -> None:
        self.eps = eps
        self.model = model
        self.seed = seed
        self.settings = settings
        self.verbose = verbose

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        return tags

    def run_config(self) -> dict[str, Any]:
        """The run settings ``fit`` uses (validated), keys as in ``pyproject.toml``."""
        from gems_fl.running.run_config import refuse_unknown_settings
        from gems_fl.settings import Settings

        self._check_parameters()
        extra = dict(self.settings or {})
        taken = sorted(set(extra) & {*FIXED, "eps", "model", "seed"})
        if taken:
            raise ValueError(f"settings sets {', '.join(taken)}: pass eps, model and seed as "
                             "parameters; dataset, site-files and output-dir are fit's own")
        refuse_unknown_settings(extra)
        # a library call takes the rows it is given (a run's guard against a tiny site is
        # min-rows=10) and has no server test set
        config = {"min-rows": 2, "evaluate-on-server": False, **extra, "eps": float(self.eps),
                  "model": str(self.model), "seed": int(self.seed)}
        Settings.from_run_config({**config, "dataset": "node-files"})  # a clear SettingsError
        return config

    def _check_parameters(self) -> None:
        """Each parameter's type and range, the error naming the parameter."""
        eps = self.eps
        if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0.0 <= eps <= 1.0:
            raise ValueError(f"GEMSClassifier: the parameter eps={eps!r} must be a number in "
                             "[0, 1] (the accuracy each site's good-enough space keeps)")
        if self.model not in MODEL_KINDS:
            raise ValueError(f"GEMSClassifier: the parameter model={self.model!r} must be one "
                             f"of {', '.join(MODEL_KINDS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"GEMSClassifier: the parameter seed={self.seed!r} must be an "
                             "integer")
        if self.settings is not None and not isinstance(self.settings, Mapping):
            raise ValueError(f"GEMSClassifier: the parameter settings must be a mapping of run "
                             f"settings (or None), got {type(self.settings).__name__}")

    def fit(self, X: Any, y: Any = None, sites: Any = None) -> GEMSClassifier:
        """Fit ``h_G`` over the sites' rows.

        Parameters
        ----------
        X : array-like or DataFrame of shape (n_samples, n_features), or the sites
            The rows of every site. Or, with ``y`` left out, the sites themselves: a
            mapping of site name to ``{x_train, y_train, x_val, y_val[, x_test, y_test]}``
            (or a sequence of such mappings, named ``site-0``, ``site-1``, ...).
        y : array-like of shape (n_samples,)
            Class labels, numbers or text.
        sites : array-like of shape (n_samples,), optional
            The site of each row (any names). None: every row is one site's.

        Returns
        -------
        self

        Raises
        ------
        ValueError
            A parameter, a site or a setting is invalid (the message names it).
        RequiredNodesMissing
            A site's data did not fit the others' (the message says which and why), as
            ``gems-fl run`` exits 3; ``settings={"required-nodes": "2"}`` accepts fewer.

        Warns
        -----
        GoodEnoughWarning
            ``h_G`` was good enough on fewer sites than ``min-good-enough`` asks (where
            ``gems-fl run`` exits 4): the model is returned all the same, the warning names
            each site's figure.
        PooledRowsWarning
            ``sites`` was not given: every row is one site's.
        """
        config = self.run_config()
        if y is None and _holds_sites(X):
            if sites is not None:
                raise ValueError("sites= names each row's site in fit(X, y, sites=...); with "
                                 "the sites' own splits in X, leave it out")
            named = _named_sites(X)
        else:
            named = _sites_of_rows(X, y, sites, self)
            if sites is None:
                warnings.warn("GEMSClassifier: fit(X, y) without sites= takes every row as one "
                              "site's, so there is nothing to aggregate and h_G is that site's "
                              "own model; pass sites= (the site of each row) to fit across "
                              "sites", PooledRowsWarning, stacklevel=2)
        self.classes_ = _all_classes(named)
        if len(self.classes_) < 2:
            raise ValueError(f"GEMSClassifier needs at least 2 classes in y; the sites hold 1 "
                             f"class ({self.classes_[0]!r})")
        named = {name: _encoded(data, self.classes_) for name, data in named.items()}
        if len(named) == 1 and "min-replies" not in config:
            config["min-replies"] = 1  # one site: its own model, checked like a run's
        fitted = fit_sites(named, config, verbose=self.verbose)
        self.results_ = fitted.results
        if not fitted.good_enough:  # where a run exits 4, a library call warns
            warnings.warn(_not_good_enough(self.results_), GoodEnoughWarning, stacklevel=2)
        model = fitted.model
        # the run named the classes by their index; the model names them as fit was given
        self.model_ = replace(model, classes=[str(self.classes_[int(i)]) for i in model.classes])
        self.n_features_in_ = int(self.model_.num_features)
        if self.model_.feature_names is not None:
            self.feature_names_in_ = np.asarray(self.model_.feature_names, dtype=object)
        elif hasattr(self, "feature_names_in_"):
            del self.feature_names_in_
        return self

    def _logits(self, X: Any) -> np.ndarray:
        """``h_G``'s logits ``(n, C)`` for ``X``, its columns matched by name where both
        sides have names, else by position."""
        check_is_fitted(self)
        names = self.model_.feature_names
        if names is not None and _column_names(X) is not None:
            X = rows_in_order(X, names, self.n_features_in_, "GEMSClassifier")
        x = check_array(X, dtype=np.float64, estimator=self)
        if x.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {x.shape[1]} features, but GEMSClassifier is expecting "
                             f"{self.n_features_in_} features as input")
        return self.model_.logits(x)  # in the model's column order already

    def decision_function(self, X: Any) -> np.ndarray:
        """Scores for rows ``X`` ``(n, d)`` in the sites' raw feature units: the logits
        ``(n, C)``, columns as ``classes_``; with two classes, as scikit-learn's binary
        classifiers, one score ``(n,)`` that is positive for ``classes_[1]``."""
        z = self._logits(X)
        return z[:, 1] - z[:, 0] if z.shape[1] == 2 else z

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities ``(n, C)`` (softmax of the logits), columns as ``classes_``."""
        z = self._logits(X)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict(self, X: Any) -> np.ndarray:
        """Class labels ``(n,)`` for rows ``X`` ``(n, d)``, as ``classes_`` holds them."""
        best = self._logits(X).argmax(axis=1)
        return self.classes_[best]

    def save(self, folder: str | Path) -> Path:
        """Write the model where :func:`gems_fl.api.load_model` reads it back (class names
        as text, feature names, scaling)."""
        check_is_fitted(self)
        return self.model_.save(folder)


def _not_good_enough(results: Mapping[str, Any]) -> str:
    """The warning's text: the verdict and each site's figure, as ``results_`` holds them."""
    sites = ", ".join(
        f"{n['name']} {n['h_g_verdict_accuracy']:.3f}"
        + ("" if n["good_enough"] else " (not good enough)")
        for n in results.get("nodes", []) if n.get("h_g_verdict_accuracy") is not None)
    return (f"GEMSClassifier: {results['good_enough']['line']}; h_G's accuracy on each site's "
            f"own validation rows against eps={results['nodes'][0]['eps']}: {sites} "
            "(results_['nodes']). The model is returned all the same: a lower eps asks less "
            "of it, and warnings.simplefilter('error', GoodEnoughWarning) makes this an error")


def _holds_sites(X: Any) -> bool:
    """Whether ``X`` is the sites' own splits (a mapping, or a sequence of mappings)."""
    if isinstance(X, Mapping):
        return True
    return isinstance(X, Sequence) and not isinstance(X, str) and len(X) > 0 and all(
        isinstance(item, Mapping) for item in X)


def _column_names(x: Any) -> list[str] | None:
    columns = getattr(x, "columns", None)
    return None if columns is None else [str(c) for c in columns]


def _sites_of_rows(X: Any, y: Any, sites: Any, estimator: BaseEstimator
                   ) -> dict[str, dict[str, Any]]:
    """``fit(X, y, sites)``: each site's training rows (its node sets validation rows
    aside), with the table's column names."""
    if y is None:
        raise ValueError("GEMSClassifier requires y to be passed, but the target y is None "
                         "(or pass the sites' own splits as one mapping: "
                         "fit({'site-a': {...}, ...}))")
    names = _column_names(X)
    x = check_array(X, dtype=np.float64, ensure_min_samples=2, estimator=estimator)
    y = column_or_1d(y, warn=True)
    check_consistent_length(x, y)
    check_classification_targets(y)
    if sites is None:
        site_of = np.full(len(y), ONE_SITE, dtype=object)
    else:
        site_of = np.asarray(sites).astype(str)
        if site_of.shape != y.shape:
            raise ValueError(f"sites has shape {site_of.shape}; expected ({len(y)},), the site "
                             "of each row of X")
    out = {}
    for name in sorted(set(site_of.tolist())):
        rows = site_of == name
        out[name] = {"x_train": x[rows], "y_train": y[rows], "columns": names}
    return out  # fit checks the names


def _named_sites(sites: Any) -> dict[str, dict[str, Any]]:
    if isinstance(sites, Mapping):
        named = {str(name): data for name, data in sites.items()}
    else:
        named = {f"site-{k}": data for k, data in enumerate(sites)}
    if not named:
        raise ValueError("fit() needs at least one site")
    out = {}
    for name, data in named.items():
        if not isinstance(data, Mapping):
            raise ValueError(f"site {name!r}: expected a mapping with {', '.join(SITE_KEYS)}, "
                             f"got {type(data).__name__}")
        missing = [k for k in SITE_KEYS if k not in data]
        if missing:
            raise ValueError(f"site {name!r} lacks {', '.join(missing)}; each site needs "
                             f"{', '.join(SITE_KEYS)} (x_test, y_test optional)")
        columns = _column_names(data["x_train"])
        site: dict[str, Any] = {"columns": columns}
        for split in ("train", "val", "test"):
            if f"x_{split}" not in data:
                continue
            x = data[f"x_{split}"]
            other = _column_names(x)
            if columns is not None and other is not None and other != columns:
                x = rows_in_order(x, columns, len(columns), f"site {name!r}'s x_train")
            site[f"x_{split}"], site[f"y_{split}"] = x, np.asarray(data[f"y_{split}"])
        out[name] = site
    return out  # fit checks the names


def _all_classes(named: Mapping[str, Mapping[str, Any]]) -> np.ndarray:
    """Every label the sites hold, sorted as ``np.unique`` sorts them."""
    labels = [np.asarray(data[k]).ravel() for data in named.values()
              for k in ("y_train", "y_val", "y_test") if k in data]
    return np.unique(np.concatenate(labels))


def _encoded(data: Mapping[str, Any], classes: np.ndarray) -> dict[str, Any]:
    """The site's labels as their index in ``classes`` (a run then orders the classes
    as ``classes`` does, whatever their names)."""
    out = dict(data)
    for key in ("y_train", "y_val", "y_test"):
        if key in out:
            out[key] = np.searchsorted(classes, np.asarray(out[key]).ravel()).astype(np.int64)
    return out
