"""GEMS with scikit-learn's habits: ``GEMSClassifier().fit(sites).predict(x)``.

``fit`` runs the real protocol, the same ServerApp and ClientApp code as ``gems-fl run
--site``, over an in-process grid (no Flower processes, no Ray): each site trains its
own model, sends its good-enough space, the server intersects them (the run's point
selection), and each site checks ``h_G`` on its own validation rows. So the model is
the one ``gems-fl run --site`` gives on the same rows, labels may be text and each site
may hold any subset of the classes, and features are scaled as a run scales them
(``standardize='auto'``: one mean and std from the sites' sums).

Flower is imported when ``fit`` runs, not when this module is.
"""

from __future__ import annotations

import contextlib
import io
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from gems_fl.api import GEMSModel, load_model

__all__ = ["GEMSClassifier"]

SITE_KEYS = ("x_train", "y_train", "x_val", "y_val")  # plus optional x_test, y_test
FIXED = ("dataset", "site-files", "output-dir")  # what fit sets itself


class GEMSClassifier:
    """GEMS over several sites' data, fitted in one call.

    Parameters
    ----------
    eps : float
        The target accuracy every site's good-enough space keeps (run setting ``eps``).
    model : {"logistic", "random-features", "mlp"}
        The model (run setting ``model``).
    seed : int
        Fixes every draw: the same seed and data give the same model.
    settings : mapping, optional
        Any other run settings, keys as in ``pyproject.toml`` (``{"gram-point": "lda"}``);
        ``dataset``, ``site-files`` and ``output-dir`` are the fit's own.
    verbose : bool
        Show the run's log and tables (default: quiet).

    Attributes
    ----------
    model_ : GEMSModel
        ``h_G`` with the classes and the scaling of the run (``save`` writes it).
    classes_ : np.ndarray
        Class names in index order: every label the sites hold, sorted as a run sorts them.
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

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"eps": self.eps, "model": self.model, "seed": self.seed,
                "settings": self.settings, "verbose": self.verbose}

    def set_params(self, **params: Any) -> GEMSClassifier:
        for key, value in params.items():
            if key not in self.get_params():
                raise ValueError(f"GEMSClassifier has no parameter {key!r}; it has "
                                 f"{', '.join(self.get_params())}")
            setattr(self, key, value)
        return self

    def run_config(self) -> dict[str, Any]:
        """The run settings ``fit`` uses (validated), keys as in ``pyproject.toml``."""
        from gems_fl.running.run_config import refuse_unknown
        from gems_fl.settings import Settings
        from gems_fl.settings.checks import key_of

        extra = dict(self.settings or {})
        taken = sorted(set(extra) & {*FIXED, "eps", "model", "seed"})
        if taken:
            raise ValueError(f"settings sets {', '.join(taken)}: pass eps, model and seed as "
                             "parameters; dataset, site-files and output-dir are fit's own")
        refuse_unknown(extra, {key_of(f) for f in fields(Settings)})
        config = {**extra, "eps": float(self.eps), "model": str(self.model),
                  "seed": int(self.seed), "dataset": "node-files",
                  "evaluate-on-server": bool(extra.get("evaluate-on-server", False))}
        Settings.from_run_config(config)  # a clear SettingsError before anything runs
        return config

    def fit(self, sites: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]
            ) -> GEMSClassifier:
        """Fit ``h_G`` over ``sites``.

        Parameters
        ----------
        sites : sequence of mappings, or a mapping of site name to mapping
            Per site its rows: ``x_train``, ``y_train``, ``x_val``, ``y_val`` and
            optionally ``x_test``, ``y_test`` (arrays, or anything ``np.asarray`` takes;
            labels numbers or text). A sequence names the sites ``site-0``, ``site-1``, ...

        Returns
        -------
        self

        Raises
        ------
        ValueError
            A site lacks a split or a setting is invalid (``SettingsError``).
        RequiredNodesMissing
            A site's data did not fit the others' (the message says which and why), as
            ``gems-fl run`` exits 3; ``settings={"required-nodes": "2"}`` accepts fewer.
        ModelNotGoodEnough
            ``h_G`` was good enough on too few sites, as ``gems-fl run`` exits 4;
            ``settings={"min-good-enough": "0"}`` accepts it.
        """
        config = self.run_config()
        named = _named_sites(sites)
        with tempfile.TemporaryDirectory(prefix="gems-fl-fit-") as tmp:
            paths = [_write_site(Path(tmp), name, data) for name, data in named.items()]
            config = {**config, "site-files": ",".join(map(str, paths)),
                      "output-dir": str(Path(tmp) / "out")}
            self.results_ = _run_in_process(config, len(paths), self.verbose)
            self.model_ = load_model(Path(tmp) / "out" / "run-1")
        self.classes_ = np.asarray(self.model_.classes, dtype=object)
        return self

    def _fitted(self) -> GEMSModel:
        if not hasattr(self, "model_"):
            raise ValueError("this GEMSClassifier is not fitted yet: call fit(sites) first")
        return self.model_

    def decision_function(self, x: Any) -> np.ndarray:
        """Logits ``(n, C)`` for rows ``x`` ``(n, d)`` in the sites' raw feature units."""
        return self._fitted().logits(np.asarray(x, dtype=np.float64))

    def predict_proba(self, x: Any) -> np.ndarray:
        """Class probabilities ``(n, C)`` (softmax of the logits), columns as ``classes_``."""
        z = self.decision_function(x)
        z = np.exp(z - z.max(axis=1, keepdims=True))
        return z / z.sum(axis=1, keepdims=True)

    def predict(self, x: Any) -> np.ndarray:
        """Class names ``(n,)`` for rows ``x`` ``(n, d)``."""
        return self._fitted().predict(np.asarray(x, dtype=np.float64))

    def score(self, x: Any, y: Any) -> float:
        """Accuracy of :meth:`predict` against labels ``y`` (names or numbers)."""
        from gems_fl.data.site_files import label_names  # 3 and 3.0 are "3", as a run names them

        labels = label_names(np.asarray(y).ravel(), "y").astype(object)
        return float(np.mean(self.predict(x) == labels))

    def save(self, folder: str | Path) -> Path:
        """Write the model where :func:`gems_fl.api.load_model` reads it back."""
        return self._fitted().save(folder)


def _named_sites(sites: Any) -> dict[str, Mapping[str, Any]]:
    if isinstance(sites, Mapping):
        named = {str(name): data for name, data in sites.items()}
    else:
        named = {f"site-{k}": data for k, data in enumerate(sites)}
    if not named:
        raise ValueError("fit() needs at least one site")
    if any("," in name or "/" in name for name in named):
        raise ValueError(f"site names must not hold ',' or '/': {sorted(named)}")
    for name, data in named.items():
        if not isinstance(data, Mapping):
            raise ValueError(f"site {name!r}: expected a mapping with {', '.join(SITE_KEYS)}, "
                             f"got {type(data).__name__}")
        missing = [k for k in SITE_KEYS if k not in data]
        if missing:
            raise ValueError(f"site {name!r} lacks {', '.join(missing)}; each site needs "
                             f"{', '.join(SITE_KEYS)} (x_test, y_test optional)")
    return named


def _write_site(folder: Path, name: str, data: Mapping[str, Any]) -> Path:
    """The site as the ``.npz`` file a SuperNode would read (its stem names the node)."""
    arrays = {}
    for key in (*SITE_KEYS, "x_test", "y_test"):
        if key in data:
            value = np.asarray(data[key])
            arrays[key] = value.astype(str) if value.dtype.kind == "O" else value
    path = folder / f"{name}.npz"
    np.savez(path, **arrays)
    return path


def _run_in_process(config: dict[str, Any], num_nodes: int, verbose: bool) -> dict[str, Any]:
    from flwr.app import Context, RecordDict

    from gems_fl.apps import client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server

    grid = InProcessGrid(client_app, num_nodes, config)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=config)
    if verbose:
        return run_server(grid, context)
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            return run_server(grid, context)
    finally:
        logger.setLevel(level)
