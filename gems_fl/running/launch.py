"""Run the app with ``flwr run`` against a private, short-lived local SuperLink.

``flwr run .`` on its own starts a detached SuperLink that outlives the run, reuses
whatever SuperLink already listens on its fixed port (possibly one started with other
settings), installs the app's dependencies into a fresh environment unless told not
to, and exits 0 even when the run failed. :func:`run_app` avoids all four: it starts
its own SuperLink on a free port with runtime dependency installation disabled, runs
the app through the real ``flwr`` CLI, asks the SuperLink for the run's final status,
checks that the results file exists, and always stops the SuperLink it started.

Before anything starts, :func:`gems_fl.running.preflight.preflight` checks what can be
known up front (data files, label division, node count, output folder). While the run
goes, its log is kept in a file and shown without the SuperLink's access log, with the
phases on a progress line. On SIGINT, SIGTERM or SIGHUP everything the run started is
stopped: the SuperLink's process group, and every process whose environment carries the
run's marker (SuperExec, ``flwr-simulation``, Ray and its workers, which start sessions
of their own), see :mod:`gems_fl.running.processes`; temp folders go with them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

import httpx
import tomli_w

from gems_fl.evaluation.results import RESULTS_FILE, git_commit
from gems_fl.running.preflight import preflight
from gems_fl.running.processes import MARKER_VARIABLE, describe, new_marker, stop_marked
from gems_fl.running.runlog import Progress, RunLog, summarise_errors
from gems_fl.settings import Settings

SUPERLINK_START_TIMEOUT_S = 60.0
CONNECTION = "gems-local"
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GIT_COMMIT_VARIABLE = "GEMS_FL_GIT_COMMIT"
GIT_DIRTY_VARIABLE = "GEMS_FL_GIT_DIRTY"
LOG_FOLDER = "logs"


class RunFailed(RuntimeError):
    """The Flower run did not finish as completed, or left no results."""

    def __init__(self, message: str, errors: list[str] | None = None,
                 log_path: Path | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []
        self.log_path = log_path


class RunInterrupted(RuntimeError):
    """SIGINT, SIGTERM or SIGHUP stopped the run; everything it started was stopped."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class _Signalled(BaseException):
    """Raised in the main thread by the signal handler (not an ``Exception``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def signals_raise() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`_Signalled` in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _hold_signals() -> None:
    """Ignore further signals while cleaning up (a second Ctrl-C must not cut it short)."""
    if threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


@dataclass
class RunOutcome:
    """A finished run: its id, final status and results."""

    run_id: int
    status: str
    results_path: Path
    results: dict[str, Any]
    log_path: Path | None = None


def app_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults from its ``pyproject.toml``."""
    path = app_dir / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no pyproject.toml in {app_dir}: pass the app folder")
    with path.open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


PAIR = re.compile(r"""(\S+?)=('[^']*'|"[^"]*"|\S+)""")


def parse_run_config(text: str | None) -> dict[str, Any]:
    """``key=value`` pairs (TOML values) or a ``.toml`` file, as ``flwr run`` reads them.

    Raises ``ValueError`` with one line naming the key and showing the quoted form for
    a value that is not valid TOML (``dataset=fashion-mnist``).
    """
    if not text or not text.strip():
        return {}
    text = text.strip()
    if text.endswith(".toml") and "=" not in text:
        path = Path(text).expanduser()
        try:
            with path.open("rb") as f:
                return dict(tomllib.load(f))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"--run-config {text}: cannot read it as TOML ({exc})") from None
    result: dict[str, Any] = {}
    rest = PAIR.sub(" ", text).strip()
    if rest:
        raise ValueError(f"--run-config: {rest.split()[0]!r} is not key=value; write e.g. "
                         "--run-config \"eps=0.5 dataset='fashion-mnist'\"")
    for key, value in PAIR.findall(text):
        try:
            parsed = tomllib.loads(f"{key} = {value}")
        except tomllib.TOMLDecodeError:
            bare = value.strip("'\"")
            raise ValueError(
                f"--run-config: {key}={value} is not a number, true/false or a quoted string; "
                f"quote text values: --run-config \"{key}='{bare}'\"") from None
        result.update(parsed)
    return result


def resolve_overrides(app_dir: Path, run_config: str | None, output_dir: str | None) -> dict[str, Any]:
    """Parse ``key=value`` overrides, validate them, make ``output-dir`` absolute.

    Validation here stops a bad value before any process starts, with the same
    message (naming the key) the ServerApp would give.
    """
    defaults = app_config(app_dir)
    overrides = parse_run_config(run_config)
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown run setting(s) {', '.join(unknown)}; known: {', '.join(sorted(defaults))}"
        )
    if output_dir is not None:
        overrides["output-dir"] = output_dir
    out = overrides.get("output-dir", defaults["output-dir"])
    overrides["output-dir"] = str(Path(out).expanduser().absolute())
    Settings.from_run_config({**defaults, **overrides})
    return overrides


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSuperLink:
    """A simulation SuperLink on a free loopback port, in its own session.

    Every process started through it (the SuperLink, ``flwr`` commands, and what they
    start in turn) carries ``marker`` in its environment; :meth:`stop` ends them all.
    Ray keeps its session files under ``workdir`` (``RAY_TMPDIR``), not ``/tmp/ray``.
    """

    def __init__(self, workdir: Path, marker: str | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.home = workdir / "flwr-home"
        self.home.mkdir(parents=True)
        self.log_path = workdir / "superlink.log"
        self.marker = marker or new_marker()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        ray_tmp = workdir / "ray"
        if len(str(ray_tmp)) > 40:  # Ray's socket paths must stay under 107 bytes
            ray_tmp = Path(tempfile.mkdtemp(prefix="gems-fl-ray-", dir="/tmp"))
        ray_tmp.mkdir(exist_ok=True)
        self.ray_tmp = ray_tmp
        self.env = {**os.environ, "FLWR_HOME": str(self.home),
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                    "RAY_TMPDIR": str(ray_tmp), MARKER_VARIABLE: self.marker,
                    **(extra_env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.children: list[subprocess.Popen[Any]] = []
        self.stopped: dict[int, str] = {}

    def __enter__(self) -> "LocalSuperLink":
        cmd = ["flower-superlink", "--insecure", "--simulation", "--isolation", "subprocess",
               "--host", "127.0.0.1", "--port", str(self.port),
               "--disable-runtime-dependency-installation"]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + SUPERLINK_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RunFailed(f"flower-superlink exited with code {self.process.returncode}; "
                                f"its log: {self.log_path}", log_path=self.log_path)
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=0.5).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RunFailed(f"flower-superlink did not become ready in {SUPERLINK_START_TIMEOUT_S:.0f}s")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _reap(self) -> None:
        for proc in (self.process, *self.children):
            if proc is not None:
                proc.poll()

    def stop(self) -> dict[int, str]:
        """Stop the SuperLink and everything started under it; ``{pid: name}`` stopped.

        SIGTERM to the SuperLink's session and to every process carrying the marker,
        SIGKILL to what is left after a few seconds. Safe to call twice.
        """
        groups = [p.pid for p in (self.process, *self.children) if p is not None]
        self.stopped.update(stop_marked(self.marker, groups, reap=self._reap))
        for proc in (self.process, *self.children):
            if proc is not None:
                try:
                    proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
        if self.ray_tmp.parent != self.workdir:
            shutil.rmtree(self.ray_tmp, ignore_errors=True)
        return self.stopped

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the SuperLink's log."""
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def flwr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a ``flwr`` CLI command against this SuperLink and capture its output."""
        return subprocess.run(["flwr", *args], env=self.env, capture_output=True, text=True,
                              check=False, start_new_session=True)

    def flwr_streamed(self, *args: str, log: RunLog | None = None) -> str:
        """Run a ``flwr`` CLI command, passing each output line to ``log`` (else stdout)."""
        proc = subprocess.Popen(["flwr", *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1,
                                errors="replace", start_new_session=True)
        self.children.append(proc)
        captured = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if log is not None:
                log.add(line)
            else:
                sys.stdout.write(line)
                sys.stdout.flush()
            captured.append(line)
        proc.wait()
        return "".join(captured)


def _stamp(moment: datetime) -> str:
    return moment.strftime("%Y%m%dT%H%M%SZ")


def _git_env(app: Path) -> dict[str, str]:
    """The checkout's commit for ``results.json`` (the app runs from a copy, not the checkout)."""
    git = git_commit(app / "pyproject.toml")
    if not git:
        return {}
    return {GIT_COMMIT_VARIABLE: git["commit"], GIT_DIRTY_VARIABLE: "1" if git["dirty"] else "0"}


def run_app(
    app_dir: str | Path = ".",
    *,
    num_nodes: int = 5,
    run_config: str | None = None,
    output_dir: str | None = None,
    progress: bool | Progress | None = None,
    cpus_per_node: int = 1,
) -> RunOutcome:
    """``flwr run`` the app as a simulation with ``num_nodes`` SuperNodes; check it.

    ``cpus_per_node`` is the CPUs Flower's simulation engine reserves for each ClientApp
    (Flower's default is 2, which runs one node at a time on a 2-core machine); with
    the default 1 every core runs a node, each on one thread (``learning.threads``).

    ``progress``: ``True`` shows the phases (a live line on a terminal, plain lines
    otherwise) above the streamed log; ``None``/``False`` only streams the log.

    Raises
    ------
    ValueError
        A run setting is invalid or a preflight check failed (before anything starts).
    RunFailed
        The run failed, or finished without writing its results; ``errors`` holds the
        distinct error lines, ``log_path`` the full log.
    RunInterrupted
        SIGINT, SIGTERM or SIGHUP arrived; everything the run started has been stopped.
    """
    t0 = time.monotonic()
    launched_unix = time.time()
    app = Path(app_dir).expanduser().resolve()
    overrides = resolve_overrides(app, run_config, output_dir)
    settings = Settings.from_run_config({**app_config(app), **overrides})
    if int(cpus_per_node) < 1:
        raise ValueError(f"--cpus-per-node={cpus_per_node} must be >= 1")
    preflight(settings, num_nodes)
    started_at = datetime.now(timezone.utc)
    out_dir = Path(overrides["output-dir"])
    log_path = out_dir / LOG_FOLDER / f"gems-fl-{_stamp(started_at)}-{os.getpid()}.log"
    if progress is True:
        progress = Progress()
    run_log: RunLog | None = None
    link: LocalSuperLink | None = None
    run_id: int | None = None
    workdir: Path | None = None
    with signals_raise():
        try:
            workdir = Path(tempfile.mkdtemp(prefix="gems-fl-"))
            overrides_file = workdir / "run-config.toml"
            overrides_file.write_text(tomli_w.dumps(overrides))
            run_log = RunLog(log_path, progress or None)
            link = LocalSuperLink(workdir, extra_env=_git_env(app))
            link.__enter__()  # stopped in `finally` (and on a signal), never half-way
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
                                log_path)
            run_id = int(match.group(1))
            if progress:
                progress.set("checking the run's final status")
            status = run_status(link, run_id)
            if status != "finished:completed":
                errors = [e.line() for e in summarise_errors(run_log.lines)]
                raise RunFailed(f"run {run_id} ended with status '{status}'", errors, log_path)
            folder = out_dir / f"run-{run_id}"
            path = folder / RESULTS_FILE
            if not path.is_file():
                raise RunFailed(f"run {run_id} completed but wrote no results at {path}",
                                log_path=log_path)
            run_log.close()
            kept_log = folder / "run.log"
            shutil.move(str(log_path), kept_log)
            _remove_if_empty(log_path.parent)
            results = add_launch_timing(path, launched_unix, time.time())
            return RunOutcome(run_id, status, path, results, kept_log)
        except _Signalled as sig:
            _hold_signals()
            if run_id is None and run_log is not None:
                run_id = run_log.run_id
            stopped = link.stop() if link is not None else {}
            _remove_partial_results(out_dir, run_id)
            _keep_superlink_log(link, log_path)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            name = signal.Signals(sig.signum).name
            what = (f"stopped the SuperLink and {len(stopped)} process(es) of the run "
                    f"({describe(stopped)})" if link is not None else "nothing had started")
            where = f"; log: {log_path}" if run_log is not None else ""
            written = out_dir / f"run-{run_id}" / RESULTS_FILE
            results = (f"; run {run_id} had already written {written}" if run_id is not None
                       and written.is_file() else "; no results written")
            raise RunInterrupted(
                sig.signum, f"interrupted by {name} after {time.monotonic() - t0:.1f} s: "
                f"{what}, removed its temp folder{results}{where}") from None
        finally:
            _hold_signals()
            if link is not None:
                link.stop()
            if run_log is not None:
                run_log.close()
            _keep_superlink_log(link, log_path)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)


def add_launch_timing(path: Path, launched_unix: float, ended_unix: float) -> dict[str, Any]:
    """Add what the ServerApp cannot time to ``results.json``'s ``timing_s``, in place.

    ``startup``: from ``gems-fl run``'s start to the ServerApp's (SuperLink, SuperExec,
    the app's install, Flower's simulation engine and Ray); ``shutdown``: from the
    ServerApp's end to the final status check; ``wall``: the whole command.
    """
    results = json.loads(path.read_text())
    timing = results.setdefault("timing_s", {})
    started = results.get("started_unix")
    if isinstance(started, (int, float)) and isinstance(timing.get("total"), (int, float)):
        timing["startup"] = max(0.0, started - launched_unix)
        timing["shutdown"] = max(0.0, ended_unix - started - timing["total"])
    timing["wall"] = ended_unix - launched_unix
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(results, indent=2) + "\n")
    os.replace(partial, path)
    return results


def timing_line(timing: dict[str, float]) -> str:
    """``start-up 14.1 s, identify 1.2 s, ...; 48.0 s in all`` from ``timing_s``."""
    labels = [("startup", "start-up"), ("wait_for_nodes", "waiting for nodes"),
              ("identify", "identify round"), ("server_data", "server data"),
              ("rounds", "GEMS rounds"), ("verify", "evaluate round"),
              ("baselines", "baselines"), ("shutdown", "shut-down")]
    parts = [f"{label} {timing[key]:.1f} s" for key, label in labels
             if isinstance(timing.get(key), (int, float))]
    total = timing.get("wall", timing.get("total"))
    return ", ".join(parts) + (f"; {total:.1f} s in all" if total is not None else "")


def _keep_superlink_log(link: LocalSuperLink | None, log_path: Path) -> None:
    """Next to a kept run log (failed or interrupted run), the SuperLink's own log."""
    if link is None or not link.log_path.exists() or not log_path.exists():
        return
    target = log_path.with_suffix(".superlink.log")
    if not target.exists():
        shutil.copy(link.log_path, target)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _remove_partial_results(out_dir: Path, run_id: int | None) -> None:
    """Remove what an interrupted results write left (a hidden ``.run-<id>.partial-*``)."""
    if run_id is None:
        return
    for partial in out_dir.glob(f".run-{run_id}.partial-*"):
        shutil.rmtree(partial, ignore_errors=True)


def run_status(link: LocalSuperLink, run_id: int, timeout: float = 30.0) -> str:
    """Final status of ``run_id`` (the log stream can end a moment before the status)."""
    deadline = time.monotonic() + timeout
    status = "unknown"
    while time.monotonic() < deadline:
        res = link.flwr("ls", "--run-id", str(run_id), "--format", "json")
        try:
            runs = json.loads(res.stdout)["runs"]
            status = runs[0]["status"]
        except (json.JSONDecodeError, KeyError, IndexError):
            status = f"unknown ({res.stdout.strip() or res.stderr.strip()})"
        if status.startswith("finished"):
            return status
        time.sleep(1.0)
    return status
