"""What ``gems-fl run`` knows before it starts anything: the app, its settings, the checks.

Light on purpose: a misspelt setting, a bad value or a division that cannot be made is
reported before torch, scikit-learn or Flower's server side are imported
(:func:`prepare_run`); the run itself (:mod:`gems_fl.running.launch`) imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gems_fl.running.packaged_app import resolve_app
from gems_fl.running.run_config import app_config, resolve_overrides
from gems_fl.serverapp.preflight import preflight
from gems_fl.settings import Settings


@dataclass(frozen=True)
class PreparedRun:
    """A run that passed every check that needs no process: the app folder, the
    ``--run-config`` overrides it runs with, their settings and the node count."""

    app: Path
    overrides: dict
    settings: Settings
    num_nodes: int
    sites: tuple[str, ...] = ()


def prepare_run(app_dir: str | Path | None = None, *, num_nodes: int = 5,
                run_config: str | None = None, output_dir: str | None = None,
                sites: list[str] | None = None) -> PreparedRun:
    """Resolve the app and the overrides, parse the settings and run the preflight
    checks (data files, label division, node count, output folder); ``sites``: site
    files, one node each (their count is then the node count).

    Raises
    ------
    ValueError
        A setting is unknown or invalid, or a check failed (a ``SettingsError`` for
        settings); the message says what to change.
    FileNotFoundError
        A ``--site`` file does not exist.
    """
    app, _ = resolve_app(app_dir)
    overrides = resolve_overrides(app, run_config, output_dir)
    if sites:
        overrides.update(site_overrides(sites, overrides))
        num_nodes = len(sites)
    settings = Settings.from_run_config({**app_config(app), **overrides})
    in_child_process(preflight, settings, num_nodes)
    return PreparedRun(app, overrides, settings, num_nodes, tuple(sites or ()))


def in_child_process(function: Callable[..., None], *args: Any) -> None:
    """``function(*args)`` in a child process, its exception raised here as it was there;
    a child that could not start or died runs it here instead. For the preflight: its
    division check loads the dataset and flwr-datasets (pandas, pyarrow: 350 MB
    resident), which this process would otherwise hold while it waits on the whole run."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    # fork where there is one: no second interpreter to start and import into
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context(method)) as pool:
            pool.submit(function, *args).result()
    except (BrokenProcessPool, OSError):
        function(*args)


def site_overrides(sites: list[str], overrides: dict) -> dict:
    """The run settings of a simulation on site files: ``dataset='node-files'``, the files
    as ``site-files`` (absolute), and ``evaluate-on-server=false`` unless set or unless a
    ``public-data`` file gives the server a test set."""
    if overrides.get("dataset", "node-files") != "node-files":
        raise ValueError(f"--site runs on the sites' own files (dataset='node-files'), but "
                         f"--run-config sets dataset='{overrides['dataset']}'")
    paths = [Path(s).expanduser().absolute() for s in sites]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"--site: no such file: {', '.join(missing)}")
    if any("," in str(p) for p in paths):
        raise ValueError("--site: a site file's path must not contain a comma")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        raise ValueError(f"--site: every file names its node by its stem, and {stems} repeat "
                         "one; rename the files")
    out = {"dataset": "node-files", "site-files": ",".join(map(str, paths))}
    if "evaluate-on-server" not in overrides and not overrides.get("public-data"):
        out["evaluate-on-server"] = False
    return out
