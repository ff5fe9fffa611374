"""Run the app with ``flwr run`` against a private, short-lived local SuperLink.

``flwr run .`` on its own starts a detached SuperLink that outlives the run, reuses
whatever SuperLink already listens on its fixed port (possibly one started with other
settings), installs the app's dependencies into a fresh environment unless told not
to, and exits 0 even when the run failed. :func:`run_app` avoids all four: it starts
its own SuperLink on a free port with runtime dependency installation disabled, runs
the app through the real ``flwr`` CLI, asks the SuperLink for the run's final status,
checks that the results file exists, and always stops the SuperLink it started.

Before anything starts, :func:`gems_fl.serverapp.preflight.preflight` checks what can be
known up front (data files, label division, node count, output folder). While the run
goes, its log is kept in a file and shown without the SuperLink's access log, with the
phases on a progress line. On SIGINT, SIGTERM or SIGHUP everything the run started is
stopped: the SuperLink's process group, and every process whose environment carries the
run's marker (SuperExec, ``flwr-simulation``, Ray and its workers, which start sessions
of their own), see :mod:`gems_fl.running.processes`; temp folders go with them.
"""

from __future__ import annotations

import re
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

from gems_fl.evaluation.run_files import RESULTS_FILE, git_commit
from gems_fl.running.outcome import RunFailed, RunInterrupted, RunOutcome
from gems_fl.running.prepare import PreparedRun, prepare_run
from gems_fl.running.processes import describe
from gems_fl.running.runlog import Progress, RunLog, summarise_errors
from gems_fl.running.signals import Signalled, hold_signals, signals_raise
from gems_fl.running.superlink import CONNECTION, LocalSuperLink, run_status
from gems_fl.running.watch import conclude, new_log_path

GIT_COMMIT_VARIABLE = "GEMS_FL_GIT_COMMIT"
GIT_DIRTY_VARIABLE = "GEMS_FL_GIT_DIRTY"


def _git_env(app: Path) -> dict[str, str]:
    """The checkout's commit for ``results.json`` (the app runs from a copy, not the checkout)."""
    git = git_commit(app / "pyproject.toml")
    if not git:
        return {}
    return {GIT_COMMIT_VARIABLE: git["commit"], GIT_DIRTY_VARIABLE: "1" if git["dirty"] else "0"}


def run_app(
    app_dir: str | Path | None = None,
    *,
    num_nodes: int = 5,
    run_config: str | None = None,
    output_dir: str | None = None,
    progress: bool | Progress | None = None,
    cpus_per_node: int = 1,
    sites: list[str] | None = None,
    ray_address: str | None = None,
    prepared: PreparedRun | None = None,
    verbose: bool = False,
) -> RunOutcome:
    """``flwr run`` the app as a simulation with ``num_nodes`` SuperNodes; check it.

    ``app_dir``: the Flower app folder; None: the current folder when it holds one (a
    checkout), else the app the package carries (:mod:`gems_fl.running.packaged_app`).
    ``cpus_per_node``: the CPUs Flower's simulation engine reserves for each ClientApp
    (Flower's default, 2, runs one node at a time on a 2-core machine; with 1 every core
    runs a node, each on one thread: ``learning.threads``).
    ``sites``: site files (``gems-fl run --site``), one simulated node each, as deployed
    SuperNodes with those files would run (:func:`site_overrides`); ``num_nodes`` is then
    their count.
    ``ray_address``: run the nodes on an existing Ray cluster (``HOST:PORT`` of its head,
    as ``ray start --head`` prints it; checked to answer first) instead of a private Ray
    instance, through Ray's own ``RAY_ADDRESS`` (Flower 1.42's simulation config has no
    address field).
    ``prepared``: what :func:`gems_fl.running.prepare.prepare_run` made of these
    arguments (``gems-fl run`` checks them before importing this module); the app,
    settings, node count and sites then come from it.
    ``verbose``: show Flower's and the ServerApp's INFO lines too (always in the log file).
    ``progress``: ``True`` shows the phases (a live line on a terminal, plain lines
    otherwise) above the streamed log; ``None``/``False`` only streams the log.

    Raises ValueError where a run setting is invalid or a preflight check failed (before
    anything starts); RunFailed where the run failed or finished without writing its
    results (``errors``: the distinct error lines, ``log_path``: the full log);
    RunInterrupted where SIGINT, SIGTERM or SIGHUP arrived (everything the run started
    has been stopped).
    """
    started = time.monotonic(), time.time()
    if int(cpus_per_node) < 1:
        raise ValueError(f"--cpus-per-node={cpus_per_node} must be >= 1")
    if prepared is None:
        prepared = prepare_run(app_dir, num_nodes=num_nodes, run_config=run_config,
                               output_dir=output_dir, sites=sites)
    return _launch(prepared, cpus_per_node, ray_address,
                   Progress() if progress is True else progress, verbose, started)


def _launch(prepared: PreparedRun, cpus_per_node: int, ray_address: str | None,
            progress: Progress | None, verbose: bool, started: tuple[float, float]) -> RunOutcome:
    """:func:`run_app` once its arguments are checked: a private SuperLink, the run, its
    final status; everything stopped and cleaned up whatever ends it (``started``: the
    monotonic and the wall clock when the call began)."""
    t0, launched_unix = started
    app, overrides = prepared.app, prepared.overrides
    extra_env = _launch_environment(prepared, ray_address)
    out_dir = Path(overrides["output-dir"])
    log_path = new_log_path(out_dir, "run")
    run_log: RunLog | None = None
    link: LocalSuperLink | None = None
    run_id: int | None = None
    workdir: Path | None = None
    with signals_raise():
        try:
            workdir = Path(tempfile.mkdtemp(prefix="gems-fl-"))
            overrides_file = workdir / "run-config.toml"
            overrides_file.write_text(tomli_w.dumps(overrides))
            run_log = RunLog(log_path, progress or None, verbose=verbose)
            link = LocalSuperLink(workdir, extra_env=extra_env)
            link.__enter__()  # stopped in `finally` (and on a signal), never half-way
            run_id = _start_run(link, app, overrides_file, prepared.num_nodes, cpus_per_node,
                                run_log)
            if progress:
                progress.set("checking the run's final status")
            status = run_status(link, run_id)
            return conclude(run_id, status, out_dir, run_log, launched_unix)
        except Signalled as sig:
            hold_signals()
            if run_id is None and run_log is not None:
                run_id = run_log.run_id
            stopped = link.stop() if link is not None else None
            _remove_partial_results(out_dir, run_id)
            raise _interrupted(sig.signum, time.monotonic() - t0, stopped, out_dir, run_id,
                               log_path if run_log is not None else None) from None
        finally:  # the one clean-up, whatever ended the run (stop() is idempotent)
            hold_signals()
            if link is not None:
                link.stop()
            if run_log is not None:
                run_log.close()
            _keep_superlink_log(link, log_path)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


def _launch_environment(prepared: PreparedRun, ray_address: str | None) -> dict[str, str]:
    """The variables the SuperLink and what it starts get (the checkout's commit, Ray's
    address), after warning about sites the run may leave out and checking the address."""
    if prepared.sites:
        # the sites' files read as their nodes will read them: torch and Flower's message
        # types, loaded into this process only for a run on site files
        from gems_fl.running.site_check import check_sites

        for line in check_sites(prepared.settings):
            print(f"gems-fl: warning: {line}", file=sys.stderr)
    extra_env = _git_env(prepared.app)
    if ray_address:
        check_ray_address(ray_address)
        extra_env["RAY_ADDRESS"] = ray_address
    return extra_env


def _start_run(link: LocalSuperLink, app: Path, overrides_file: Path, num_nodes: int,
               cpus_per_node: int, run_log: RunLog) -> int:
    """``flwr run`` the app on ``link``, streaming its log; the run's id, or RunFailed with
    the errors seen where Flower did not start one."""
    out = link.flwr_streamed("run", str(app), CONNECTION, "--stream",
                             "--run-config", str(overrides_file),
                             "--federation-config",
                             f"num-supernodes={num_nodes} "
                             f"client-resources-num-cpus={cpus_per_node}",
                             log=run_log)
    match = re.search(r"Successfully started run (\d+)", out)
    if not match:
        errors = [e.line() for e in summarise_errors(run_log.lines)]
        raise RunFailed("`flwr run` did not start a run", errors or
                        [f"  {line}" for line in out.strip().splitlines()[-5:]],
                        run_log.path)
    return int(match.group(1))


def _interrupted(signum: int, seconds: float, stopped: dict | None, out_dir: Path,
                 run_id: int | None, log_path: Path | None) -> RunInterrupted:
    """What a signal that ended the run says: what was stopped, what was written, where the
    log is (``stopped``: None where no SuperLink had started)."""
    name = signal.Signals(signum).name
    what = (f"stopped the SuperLink and {len(stopped)} process(es) of the run "
            f"({describe(stopped)})" if stopped is not None else "nothing had started")
    where = f"; log: {log_path}" if log_path is not None else ""
    written = out_dir / f"run-{run_id}" / RESULTS_FILE
    results = (f"; run {run_id} had already written {written}" if run_id is not None
               and written.is_file() else "; no results written")
    return RunInterrupted(signum, f"interrupted by {name} after {seconds:.1f} s: "
                          f"{what}, removed its temp folder{results}{where}")


def check_ray_address(address: str) -> None:
    """``HOST:PORT`` of a Ray head that accepts a connection, else ValueError saying so."""
    import socket

    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"--ray-address {address!r}: give the Ray head's HOST:PORT, e.g. "
                         "10.0.0.5:6379 (what `ray start --head` prints)")
    try:
        with socket.create_connection((host, int(port)), timeout=5.0):
            pass
    except OSError as exc:
        raise ValueError(f"--ray-address {address}: no Ray head answers there ({exc}); start "
                         "one with `ray start --head --port PORT`, or leave --ray-address out "
                         "to run a private Ray instance") from None


def _keep_superlink_log(link: LocalSuperLink | None, log_path: Path) -> None:
    """Next to a kept run log (failed or interrupted run), the SuperLink's own log."""
    if link is None or not link.log_path.exists() or not log_path.exists():
        return
    target = log_path.with_suffix(".superlink.log")
    if not target.exists():
        shutil.copy(link.log_path, target)


def _remove_partial_results(out_dir: Path, run_id: int | None) -> None:
    """Remove what an interrupted results write left (a hidden ``.run-<id>.partial-*``)."""
    if run_id is None:
        return
    for partial in out_dir.glob(f".run-{run_id}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)
