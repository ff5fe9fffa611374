"""The end of a watched run, shared by ``gems-fl run`` and ``gems-fl submit``: from the
run's final status and its results folder to a :class:`RunOutcome` or the error that
says why there is none, with the log kept next to the results and the wall-time split
added to them."""

from __future__ import annotations

import os
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path

from gems_fl.evaluation.run_files import RESULTS_FILE
from gems_fl.running.outcome import RunFailed, RunOutcome, incomplete_run
from gems_fl.running.runlog import RunLog, summarise_errors
from gems_fl.running.timing import add_launch_timing

KEPT_LOG = "run.log"
LOG_FOLDER = "logs"


def new_log_path(out_dir: Path, command: str) -> Path:
    """Where a watched run's log goes until it has a results folder:
    ``<out_dir>/logs/gems-fl[-<command>]-<UTC stamp>-<pid>.log``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = "gems-fl" if command == "run" else f"gems-fl-{command}"
    return out_dir / LOG_FOLDER / f"{name}-{stamp}-{os.getpid()}.log"


def conclude(run_id: int, status: str, out_dir: Path, run_log: RunLog,
             launched_unix: float) -> RunOutcome:
    """The outcome of run ``run_id`` that ended with ``status``, whose results are (or
    should be) in ``out_dir/run-<id>/``.

    Raises :class:`RunIncomplete` when the results say a required site was left out
    (:class:`RunNotGoodEnough`: too few sites found h_G good enough),
    :class:`RunFailed` for any other status than ``finished:completed`` (with the log's
    distinct errors) or when no results were written.
    """
    folder = out_dir / f"run-{run_id}"
    path = folder / RESULTS_FILE
    if status != "finished:completed":
        incomplete = incomplete_run(path)
        if incomplete is not None:
            error, line = incomplete
            kept = _keep_log(run_log, folder)
            add_launch_timing(path, launched_unix, time.time())  # every exit's same fields
            raise error(f"run {run_id}: {line}", path, log_path=kept)
        raise RunFailed(f"run {run_id} ended with status '{status}'",
                        [e.line() for e in summarise_errors(run_log.lines)], run_log.path)
    if not path.is_file():
        raise RunFailed(f"run {run_id} completed but wrote no results at {path}",
                        log_path=run_log.path)
    kept = _keep_log(run_log, folder)
    results = add_launch_timing(path, launched_unix, time.time())
    return RunOutcome(run_id, status, path, results, kept)


def _keep_log(run_log: RunLog, folder: Path) -> Path:
    """Move the run's log next to its results (``run.log``); the log folder goes if empty."""
    run_log.close()
    kept = folder / KEPT_LOG
    shutil.move(str(run_log.path), kept)
    try:
        run_log.path.parent.rmdir()
    except OSError:
        pass
    return kept
