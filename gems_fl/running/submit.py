"""``gems-fl submit``: run the app on a deployed SuperLink and fail loudly.

``flwr run APP CONNECTION --stream`` exits 0 whatever became of the run, also when the
SuperLink went away mid-run (the stream just ends). :func:`submit` streams the same log,
then asks the SuperLink for the run's final status (``flwr ls``) and raises
:class:`gems_fl.running.outcome.RunFailed` unless it is ``finished:completed``, with the
cause: the run's errors, or that the SuperLink no longer answers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from gems_fl.running.outcome import RunFailed
from gems_fl.running.run_config import app_config, parse_run_config
from gems_fl.running.runlog import summarise_errors
from gems_fl.settings import Settings


@dataclass
class RemoteRun:
    """A finished run on a remote SuperLink."""

    run_id: int
    status: str
    output: str


class Connection:
    """A named ``[superlink.<name>]`` entry of Flower's config (``$FLWR_HOME/config.toml``)."""

    def __init__(self, name: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.env = {**os.environ, **(env or {})}

    def flwr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["flwr", *args, self.name], env=self.env, capture_output=True,
                              text=True, check=False, start_new_session=True)


def check_overrides(app: Path, run_config: str | None) -> dict[str, Any]:
    """Parse and validate the overrides against the app's defaults (nothing made absolute:
    paths are read on the SuperLink's machine)."""
    defaults = app_config(app)
    overrides = parse_run_config(run_config)
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        raise ValueError(f"unknown run setting(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(defaults))}")
    Settings.from_run_config({**defaults, **overrides})
    return overrides


def final_status(conn: Connection, run_id: int, timeout: float = 30.0) -> tuple[str, str]:
    """``(status, problem)``: the run's status from ``flwr ls``; ``problem`` says why it is
    unknown (e.g. the SuperLink does not answer)."""
    deadline = time.monotonic() + timeout
    status, problem = "unknown", ""
    while time.monotonic() < deadline:
        res = conn.flwr("ls", "--run-id", str(run_id), "--format", "json")
        try:
            runs = json.loads(res.stdout)["runs"]
            status, problem = runs[0]["status"], ""
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            text = " ".join((res.stdout.strip() or res.stderr.strip()).split())
            problem = text[-400:] or f"flwr ls exited {res.returncode}"
        if status.startswith("finished"):
            return status, ""
        time.sleep(2.0)
    return status, problem


def submit(app_dir: str | Path, connection: str, run_config: str | None = None, *,
           env: dict[str, str] | None = None, timeout: float | None = None,
           echo: bool = True) -> RemoteRun:
    """Submit the app to the SuperLink of ``connection``, stream its log, check the end.

    Raises
    ------
    ValueError
        A run setting is invalid (nothing was submitted).
    RunFailed
        The run did not start, did not end ``finished:completed``, or its status cannot
        be read (the SuperLink went away); the message and ``errors`` say which.
    """
    app = Path(app_dir).expanduser().resolve()
    overrides = check_overrides(app, run_config)
    conn = Connection(connection, env)
    with tempfile.TemporaryDirectory(prefix="gems-fl-submit-") as tmp:
        config_path = Path(tmp) / "run-config.toml"
        config_path.write_text(tomli_w.dumps(overrides))
        proc = subprocess.Popen(["flwr", "run", str(app), connection, "--stream",
                                 "--run-config", str(config_path)], env=conn.env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, errors="replace", start_new_session=True)
        lines: list[str] = []
        assert proc.stdout is not None
        t0 = time.monotonic()
        for line in proc.stdout:
            lines.append(line)
            if echo:
                sys.stdout.write(line)
                sys.stdout.flush()
            if timeout is not None and time.monotonic() - t0 > timeout:
                proc.kill()
                break
        proc.wait()
    output = "".join(lines)
    match = re.search(r"Successfully started run (\d+)", output)
    if not match:
        raise RunFailed(f"`flwr run` did not start a run on '{connection}' (exit {proc.returncode})",
                        [f"  {line}" for line in output.strip().splitlines()[-8:]])
    run_id = int(match.group(1))
    status, problem = final_status(conn, run_id)
    if status == "finished:completed":
        return RemoteRun(run_id, status, output)
    errors = [e.line() for e in summarise_errors(lines)]
    if problem:
        raise RunFailed(f"run {run_id}: the log stream ended but the SuperLink of '{connection}' "
                        f"does not report the run's status (last seen: {status}); it may have "
                        f"stopped or become unreachable: {problem}", errors)
    raise RunFailed(f"run {run_id} ended with status '{status}'", errors)
