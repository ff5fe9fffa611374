"""Run the app with ``flwr run`` against a private, short-lived local SuperLink.

``flwr run .`` on its own starts a detached SuperLink that outlives the run, reuses
whatever SuperLink already listens on its fixed port (possibly one started with other
settings), installs the app's dependencies into a fresh environment unless told not
to, and exits 0 even when the run failed. :func:`run_app` avoids all four: it starts
its own SuperLink on a free port with runtime dependency installation disabled, runs
the app through the real ``flwr`` CLI, asks the SuperLink for the run's final status,
checks that the results file exists, and always stops the SuperLink it started.
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
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import tomli_w
from flwr.common.config import parse_config_args

from gems_fl.evaluation.results import RESULTS_FILE
from gems_fl.settings import Settings

SUPERLINK_START_TIMEOUT_S = 60.0
CONNECTION = "gems-local"


class RunFailed(RuntimeError):
    """The Flower run did not finish as completed, or left no results."""


@dataclass
class RunOutcome:
    """A finished run: its id, final status and results."""

    run_id: int
    status: str
    results_path: Path
    results: dict[str, Any]


def app_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults from its ``pyproject.toml``."""
    path = app_dir / "pyproject.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no pyproject.toml in {app_dir}: pass the app folder")
    with path.open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


def resolve_overrides(app_dir: Path, run_config: str | None, output_dir: str | None) -> dict[str, Any]:
    """Parse ``key=value`` overrides, validate them, make ``output-dir`` absolute.

    Validation here stops a bad value before any process starts, with the same
    message (naming the key) the ServerApp would give.
    """
    defaults = app_config(app_dir)
    overrides = parse_config_args([run_config]) if run_config else {}
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown run setting(s) {', '.join(unknown)}; known: {', '.join(sorted(defaults))}"
        )
    if output_dir is not None:
        overrides["output-dir"] = output_dir
    out = overrides.get("output-dir", defaults["output-dir"])
    overrides["output-dir"] = str(Path(out).expanduser().resolve())
    Settings.from_run_config({**defaults, **overrides})
    return overrides


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSuperLink:
    """A simulation SuperLink on a free loopback port, in its own process group."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.home = workdir / "flwr-home"
        self.home.mkdir(parents=True)
        self.log_path = workdir / "superlink.log"
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        self.env = {**os.environ, "FLWR_HOME": str(self.home),
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
        self.process: subprocess.Popen[bytes] | None = None

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
                                f"log:\n{self.log_tail()}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=0.5).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RunFailed(f"flower-superlink did not become ready in {SUPERLINK_START_TIMEOUT_S:.0f}s")

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the SuperLink and everything it spawned (its whole process group)."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the SuperLink's log."""
        if not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def flwr(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a ``flwr`` CLI command against this SuperLink and capture its output."""
        return subprocess.run(["flwr", *args], env=self.env, capture_output=True, text=True,
                              check=False)

    def flwr_streamed(self, *args: str) -> str:
        """Run a ``flwr`` CLI command, echoing its output live; return that output."""
        proc = subprocess.Popen(["flwr", *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, bufsize=1)
        captured = []
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            captured.append(line)
        proc.wait()
        return "".join(captured)


def run_app(
    app_dir: str | Path = ".",
    *,
    num_nodes: int = 5,
    run_config: str | None = None,
    output_dir: str | None = None,
) -> RunOutcome:
    """``flwr run`` the app as a simulation with ``num_nodes`` SuperNodes; check it.

    Raises
    ------
    ValueError
        A run setting is invalid (before anything starts).
    RunFailed
        The run failed, or finished without writing its results.
    """
    if num_nodes < 1:
        raise ValueError(f"--nodes={num_nodes} must be >= 1")
    app = Path(app_dir).expanduser().resolve()
    overrides = resolve_overrides(app, run_config, output_dir)
    workdir = Path(tempfile.mkdtemp(prefix="gems-fl-"))
    try:
        overrides_file = workdir / "run-config.toml"
        overrides_file.write_text(tomli_w.dumps(overrides))
        with LocalSuperLink(workdir) as link:
            out = link.flwr_streamed("run", str(app), CONNECTION, "--stream",
                                     "--run-config", str(overrides_file),
                                     "--federation-config", f"num-supernodes={num_nodes}")
            match = re.search(r"Successfully started run (\d+)", out)
            if not match:
                raise RunFailed(f"`flwr run` did not start a run:\n{out[-3000:]}")
            run_id = int(match.group(1))
            status = run_status(link, run_id)
            if status != "finished:completed":
                raise RunFailed(f"run {run_id} ended with status '{status}'; SuperLink log "
                                f"tail:\n{link.log_tail()}")
        path = Path(overrides["output-dir"]) / f"run-{run_id}" / RESULTS_FILE
        if not path.is_file():
            raise RunFailed(f"run {run_id} completed but wrote no results at {path}")
        return RunOutcome(run_id, status, path, json.loads(path.read_text()))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
