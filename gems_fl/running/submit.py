"""``gems-fl submit``, ``pull`` and ``status``: the app on a deployed SuperLink.

``flwr run APP CONNECTION --stream`` exits 0 whatever became of the run, also when the
SuperLink went away mid-run (the stream just ends), leaves the run going when it is
interrupted, and leaves the results on the SuperLink's machine. :func:`submit` streams
the same log through the watching path ``gems-fl run`` uses (phases, kept log, error
summary, :func:`gems_fl.running.watch.conclude`), asks the SuperLink for the run's final
status (``flwr ls``), writes the results the ServerApp sent home in its log
(:mod:`gems_fl.evaluation.results_bundle`) under the operator's own ``--output-dir``, and
on SIGINT/SIGTERM/SIGHUP stops the run on the SuperLink (``flwr stop``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tomli_w

from gems_fl.evaluation.results_bundle import BundleError, BundleReader
from gems_fl.evaluation.run_files import RESULTS_FILE, git_commit
from gems_fl.running.outcome import RunFailed, RunInterrupted, RunOutcome
from gems_fl.running.packaged_app import resolve_app
from gems_fl.running.processes import flower_tool, with_flower_on_path
from gems_fl.running.run_config import app_config, parse_run_config, refuse_unknown
from gems_fl.running.runlog import Progress, RunLog, summarise_errors
from gems_fl.running.signals import Signalled, hold_signals, signals_raise
from gems_fl.running.watch import conclude, new_log_path
from gems_fl.settings import Settings

STARTED = re.compile(r"Successfully started run (\d+)")


class Connection:
    """A named ``[superlink.<name>]`` entry of Flower's config (``$FLWR_HOME/config.toml``)."""

    def __init__(self, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = {**with_flower_on_path(dict(os.environ)), **(env or {})}

    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([flower_tool("flwr"), *args, self.name], env=self.env, capture_output=True,
                              text=True, check=False, start_new_session=True, timeout=timeout)

    def stop(self, run_id: int) -> str:
        """``flwr stop RUN_ID NAME``: what Flower said, in one line."""
        res = self.flwr("stop", str(run_id), timeout=30.0)
        text = " ".join((res.stdout.strip() or res.stderr.strip()).split())
        return "stopped" if res.returncode == 0 else f"flwr stop exited {res.returncode}: {text[-200:]}"


def check_overrides(app: Path, run_config: str | None) -> dict[str, Any]:
    """Parse and validate the overrides against the app's defaults (nothing made absolute:
    paths are read on the SuperLink's machine)."""
    defaults = app_config(app)
    overrides = parse_run_config(run_config)
    refuse_unknown(overrides, defaults)
    Settings.from_run_config({**defaults, **overrides})
    return overrides


def final_status(conn: Connection, run_id: int, timeout: float = 30.0) -> tuple[str, str]:
    """``(status, problem)``: the run's status as the SuperLink lists it (``flwr ls``);
    ``problem`` says why it is unknown (e.g. the SuperLink does not answer)."""
    from gems_fl.running.control import ControlLink

    deadline = time.monotonic() + timeout
    status, problem = "unknown", ""
    while time.monotonic() < deadline:
        try:
            with ControlLink(conn.name, conn.env.get("FLWR_HOME")) as link:
                runs = link.runs(run_id)
            status, problem = ((runs[0].status, "") if runs else
                               (status, f"the SuperLink lists no run {run_id}"))
        except RunFailed as exc:
            problem = str(exc)
        if status.startswith("finished"):
            return status, ""
        time.sleep(2.0)
    return status, problem


def _stamp_commit(results_path: Path, app: Path, connection: str) -> None:
    """The submitting checkout's commit in ``results.json`` (the SuperLink runs the app
    bundle built from it and has no git) and where the results came from."""
    results = json.loads(results_path.read_text())
    meta = results.setdefault("run", {})
    git = git_commit(app / "pyproject.toml")
    if git and not meta.get("git_commit"):
        meta["git_commit"], meta["git_dirty"] = git["commit"], git["dirty"]
    meta["superlink"] = connection
    meta["server_output"] = results.get("output")
    folder = results_path.parent
    results["output"] = {"results": str(results_path),
                         **({"model": str(folder / "gems_model.npz")}
                            if (folder / "gems_model.npz").is_file() else {})}
    partial = results_path.with_name(f".{results_path.name}.{os.getpid()}")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(partial, results_path)


def bring_home(bundle: BundleReader, run_id: int, out_dir: Path, app: Path,
               connection: str) -> Path:
    """Write the run's results from its log into ``out_dir/run-<id>/``; the results path."""
    folder = out_dir / f"run-{run_id}"
    written = bundle.write(run_id, folder)
    _stamp_commit(written[RESULTS_FILE], app, connection)
    return written[RESULTS_FILE]


def submit(app_dir: str | Path | None, connection: str, run_config: str | None = None, *,
           output_dir: str | Path = "gems-results", detach: bool = False,
           env: dict[str, str] | None = None, progress: bool | Progress | None = None,
           verbose: bool = False) -> RunOutcome | int:
    """Submit the app to the SuperLink of ``connection``, watch it, bring its results home.
    ``detach``: start the run and return its id at once (follow it with ``flwr log``,
    stop it with ``flwr stop``, fetch its results with :func:`pull`).

    Raises ValueError for an invalid run setting (nothing was submitted); RunIncomplete
    where the run ended and its results came home but a required site was left out;
    RunFailed where the run did not start, did not end ``finished:completed``, its status
    cannot be read (the SuperLink went away) or its results did not come home;
    RunInterrupted where SIGINT, SIGTERM or SIGHUP arrived (the run was stopped on the
    SuperLink).
    """
    launched_unix = time.time()
    app, _ = resolve_app(app_dir)
    overrides = check_overrides(app, run_config)
    conn = Connection(connection, env)
    expect_registered(overrides, conn, progress)
    out_dir = Path(output_dir).expanduser().resolve()
    log_path = new_log_path(out_dir, "submit")
    if progress is True:
        progress = Progress(phase=f"submitting to '{connection}'")
    run_log: RunLog | None = None
    proc: subprocess.Popen[str] | None = None
    with tempfile.TemporaryDirectory(prefix="gems-fl-submit-") as tmp, signals_raise():
        config_path = Path(tmp) / "run-config.toml"
        config_path.write_text(tomli_w.dumps(overrides))
        command = [flower_tool("flwr"), "run", str(app), connection, "--run-config", str(config_path)]
        if detach:
            return _detached(command, conn, connection)
        try:
            run_log = RunLog(log_path, progress or None, verbose=verbose)
            proc = subprocess.Popen([*command, "--stream"], env=conn.env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    bufsize=1, errors="replace", start_new_session=True)
            for line in proc.stdout or ():
                run_log.add(line)
            proc.wait()
            return _conclude_stream(run_log, proc.returncode, conn, connection, progress,
                                    out_dir, app, launched_unix)
        except Signalled as sig:
            _stop_stream(proc, None)
            raise _interrupted(sig.signum, run_log, conn, connection) from None
        finally:
            _stop_stream(proc, run_log)


def _stop_stream(proc: subprocess.Popen[str] | None, run_log: RunLog | None) -> None:
    """Hold further signals, kill the ``flwr run --stream`` still running, close the log."""
    hold_signals()
    if proc is not None and proc.poll() is None:
        proc.kill()
    if run_log is not None:
        run_log.close()


def _detached(command: list[str], conn: Connection, connection: str) -> int:
    """``flwr run`` without ``--stream``: the run's id once it has started."""
    res = subprocess.run(command, env=conn.env, capture_output=True, text=True,
                         check=False, start_new_session=True)
    return _started(res.stdout + res.stderr, connection, res.returncode)


def _interrupted(signum: int, run_log: RunLog | None, conn: Connection,
                 connection: str) -> RunInterrupted:
    """Stop the run on the SuperLink (where one had started) and say so."""
    run_id = run_log.run_id if run_log is not None else None
    name = signal.Signals(signum).name
    said = (f"stopped run {run_id} on '{connection}' (flwr stop: {conn.stop(run_id)})"
            if run_id is not None else "no run had started")
    return RunInterrupted(signum, f"interrupted by {name}: {said}"
                          + (f"; log: {run_log.path}" if run_log is not None else ""))


def _conclude_stream(run_log: RunLog, returncode: int, conn: Connection, connection: str,
                     progress: Progress | None, out_dir: Path, app: Path,
                     launched_unix: float) -> RunOutcome:
    """Once ``flwr run --stream`` has ended: the run's final status from the SuperLink, its
    results brought home from the log, the outcome; RunFailed where any of it is missing."""
    run_id = run_log.run_id
    if run_id is None:
        run_log.close()
        raise RunFailed(f"`flwr run` did not start a run on '{connection}' (exit "
                        f"{returncode})",
                        [f"  {line.rstrip()}" for line in run_log.lines[-8:]], run_log.path)
    if progress:
        progress.set("checking the run's final status")
    status, problem = final_status(conn, run_id)
    if problem:
        run_log.close()
        raise RunFailed(
            f"run {run_id}: the log stream ended but the SuperLink of '{connection}' "
            f"does not report the run's status (last seen: {status}); it may have "
            f"stopped or become unreachable: {problem}",
            [e.line() for e in summarise_errors(run_log.lines)], run_log.path)
    if status.startswith("finished") and run_id in run_log.bundle.runs():
        try:
            bring_home(run_log.bundle, run_id, out_dir, app, connection)
        except BundleError as exc:
            run_log.close()
            raise RunFailed(f"run {run_id} ended '{status}' but its results did not "
                            f"come home: {exc}; try `gems-fl pull {run_id} --superlink "
                            f"{connection}`", log_path=run_log.path) from None
    return conclude(run_id, status, out_dir, run_log, launched_unix)


def expect_registered(overrides: dict[str, Any], conn: Connection,
                      progress: bool | Progress | None) -> None:
    """Without ``required-nodes`` in the overrides, the sites registered by name on the
    SuperLink (SuperNode authentication) are the run's expected sites: ``overrides`` gets
    their names, so a registered site that never connects stops the run before training.
    Without authentication no site is registered by name and nothing changes."""
    if "required-nodes" in overrides:
        return
    from gems_fl.running.control import ControlLink, registered_names

    with ControlLink(conn.name, conn.env.get("FLWR_HOME")) as link:
        names = registered_names(link.nodes())
    if names:
        overrides["required-nodes"] = ",".join(names)
        if progress:
            print(f"gems-fl: expecting the {len(names)} site(s) registered on '{conn.name}' "
                  f"(SuperNode authentication): {', '.join(names)} (required-nodes names "
                  "others)", file=sys.stderr, flush=True)


def _started(output: str, connection: str, code: int) -> int:
    """The run id of a detached ``flwr run``; RunFailed if it did not start."""
    match = STARTED.search(output)
    if not match:
        raise RunFailed(f"`flwr run` did not start a run on '{connection}' (exit {code})",
                        [f"  {line}" for line in output.strip().splitlines()[-8:]])
    return int(match.group(1))


def pull(run_id: int, connection: str, output_dir: str | Path = "gems-results",
         app_dir: str | Path = ".", env: dict[str, str] | None = None) -> Path:
    """Fetch a finished run's results from its log on the SuperLink (``flwr log --show``)
    into ``output_dir/run-<id>/``; the results path."""
    conn = Connection(connection, env)
    status, problem = final_status(conn, run_id, timeout=5.0)
    if not status.startswith("finished"):
        raise RunFailed(f"run {run_id} on '{connection}' is '{status}'"
                        + (f" ({problem})" if problem else "") + ": its results come home "
                        "when it has finished")
    res = conn.flwr("log", str(run_id), "--show", timeout=300.0)
    bundle = BundleReader()
    for line in res.stdout.splitlines():
        bundle.feed(line)
    try:
        return bring_home(bundle, run_id, Path(output_dir).expanduser().resolve(),
                          Path(app_dir).expanduser().resolve(), connection)
    except BundleError as exc:
        raise RunFailed(f"run {run_id} ({status}): {exc}") from None
