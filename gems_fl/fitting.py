"""One core fit: ``fit(sites, config)`` runs GEMS over sites in this process and returns
the model, writing nothing.

It runs the real protocol, the same ServerApp and ClientApp code as ``gems-fl run --site``,
over an in-process grid (no Flower processes, no Ray): each site trains its own model,
sends its good-enough space, the server intersects them (the run's point selection), and
each site checks ``h_G`` on its own validation rows. Sites given as arrays are read from
memory as their ``.npz`` files would be read (:mod:`gems_fl.data.site_memory`), the nodes
keep what they keep between rounds in memory (:class:`~gems_fl.protocol.node_store.NodeStore`)
and the results come back instead of going to ``output-dir``: the same model as a run on
the same sites' files gives, bit for bit.
:class:`gems_fl.estimator.GEMSClassifier` fits through it.

Flower is imported when :func:`fit` runs, not when this module is.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gems_fl.api import GEMSModel, model_from_state
from gems_fl.data.site_memory import held_sites

__all__ = ["FittedRun", "fit"]

#: the run settings fit sets itself
OWN_KEYS = ("dataset", "site-files")


@dataclass(frozen=True)
class FittedRun:
    """A finished fit: ``model`` (``h_G`` with the run's classes and scaling) and
    ``results`` (what a run's ``results.json`` holds: per-site checks, attendance, ...).
    ``good_enough`` is whether ``h_G`` was good enough on as many sites as
    ``min-good-enough`` asks."""

    model: GEMSModel
    results: dict[str, Any]

    @property
    def good_enough(self) -> bool:
        return bool(self.results.get("good_enough", {}).get("ok", False))


def fit(sites: Mapping[str, Mapping[str, Any]] | Sequence[str | Path],
        config: Mapping[str, Any], *, verbose: bool = False) -> FittedRun:
    """Run GEMS over ``sites`` in this process with the run settings ``config``.

    Parameters
    ----------
    sites : mapping or sequence
        Either the sites' rows, ``{name: {"x_train", "y_train"[, "x_val", "y_val",
        "x_test", "y_test", "columns"]}}`` as a site's ``.npz`` file holds them (labels
        as numbers or text), or the paths of the sites' files (``.npz`` or ``.csv``; a
        file's stem names its site). A site without validation rows has its node set
        them aside (``val-fraction``).
    config : mapping
        Run settings, keys as in ``pyproject.toml`` (``{"model": "kernel"}``); ``dataset``
        and ``site-files`` are the fit's own; ``output-dir`` is unused (nothing is written).
    verbose : bool
        Print the run's log and tables (else quiet; the ``flwr`` logger still gets them).

    Returns
    -------
    FittedRun
        Also when ``h_G`` was good enough on fewer sites than ``min-good-enough`` asks
        (:attr:`FittedRun.good_enough` is False then; ``gems-fl run`` exits 4 there).

    Raises
    ------
    ValueError
        ``sites`` is empty or malformed, or ``config`` names no run setting or one the fit
        sets itself (``FileNotFoundError``: a site file that is not there).
    SettingsError
        A run setting is invalid (the message names it).
    RequiredNodesMissing
        A site's data did not fit the others' (the message says which and why; the
        results are on the exception), as ``gems-fl run`` exits 3.
    """
    from gems_fl.running.run_config import refuse_unknown_settings

    given = sorted(set(config) & set(OWN_KEYS))
    if given:
        raise ValueError(f"fit() sets {', '.join(given)} itself: give the sites as its first "
                         "argument")
    refuse_unknown_settings(dict(config))
    with _site_paths(sites) as paths:
        # the sites keep their rows: the server evaluates only on public-data's, if asked
        return _fitted({"evaluate-on-server": False, **config, "dataset": "node-files",
                        "site-files": ",".join(paths)}, len(paths), verbose)


def _fitted(run_config: dict[str, Any], num_sites: int, verbose: bool) -> FittedRun:
    """The run's model and results; where a run exits 4 (not good enough), the model all
    the same, from the exception that carries it."""
    from gems_fl.protocol.attendance import ModelNotGoodEnough

    try:
        outcome = _run_in_process(run_config, num_sites, verbose)
        results, state = outcome.results, outcome.model_state
    except ModelNotGoodEnough as stop:
        results, state = stop.results, stop.model_state
        if results is None or state is None:
            raise
    return FittedRun(model_from_state(results["dataset"], state), results)


@contextlib.contextmanager
def _site_paths(sites: Mapping[str, Mapping[str, Any]] | Sequence[str | Path]
                ) -> Iterator[list[str]]:
    """Each site's ``data-path``: a file's own, or the name its arrays are held under."""
    if isinstance(sites, Mapping):
        if not sites:
            raise ValueError("fit() needs at least one site")
        bad = [str(name) for name in sites if not str(name) or "," in str(name)
               or "/" in str(name)]
        if bad:
            raise ValueError(f"site names must be non-empty and hold no ',' or '/': {bad}")
        with held_sites({str(name): data for name, data in sites.items()}) as paths:
            yield paths
        return
    if isinstance(sites, (str, Path)) or not len(sites):
        raise ValueError("fit() takes a mapping of site name to arrays, or a sequence of the "
                         f"sites' file paths; got {sites!r}")
    paths = [str(Path(p).expanduser()) for p in sites]
    if any("," in p for p in paths):
        raise ValueError(f"site file paths must hold no ',': {paths}")
    missing = [p for p in paths if not Path(p).is_file()]
    if missing:
        raise FileNotFoundError(f"site file(s) not found: {', '.join(missing)}")
    yield paths


def _run_in_process(config: dict[str, Any], num_nodes: int, verbose: bool):
    """The ServerApp over an in-process grid of ``num_nodes`` ClientApps, writing no
    files; its log and tables printed only where ``verbose``."""
    from flwr.app import Context, RecordDict
    from flwr.common.logger import console_handler

    from gems_fl.apps import client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp.run import run_without_files

    grid = InProcessGrid(client_app, num_nodes, config, in_memory=True)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=config)
    logger = logging.getLogger("flwr")
    colored = console_handler.colored
    # Flower colours its level names whatever the stream: not in a file or a pipe
    console_handler.colored = bool(getattr(console_handler.stream, "isatty", lambda: False)())
    quiet = logging.NullHandler()  # quiet: no console, and no lastResort printing either
    if not verbose:
        logger.removeHandler(console_handler)
        logger.addHandler(quiet)
    try:
        with contextlib.redirect_stdout(io.StringIO()) if not verbose else contextlib.nullcontext():
            return run_without_files(grid, context)
    finally:
        if not verbose:
            logger.removeHandler(quiet)
            logger.addHandler(console_handler)
        console_handler.colored = colored
