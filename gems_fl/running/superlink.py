"""A private simulation SuperLink on a free loopback port, and the ``flwr`` CLI against it.

Every process started through :class:`LocalSuperLink` carries a marker in its
environment (:mod:`gems_fl.running.processes`), so that :meth:`LocalSuperLink.stop`
ends them all, Ray and its workers included.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gems_fl.running.outcome import RunFailed
from gems_fl.running.processes import (
    MARKER_VARIABLE,
    flower_tool,
    new_marker,
    stop_marked,
    with_flower_on_path,
)
from gems_fl.running.runlog import RunLog

SUPERLINK_START_TIMEOUT_S = 60.0
CONNECTION = "gems-local"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Ray's driver warns on every start that a future Ray will stop hiding GPUs from actors
# that ask for none; its own switch for that (RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=0) would
# change which devices the simulated nodes see, so only the warning is silenced.
RAY_TIP = "ignore::FutureWarning:ray._private.worker"


def quiet_ray_tip(existing: str) -> str:
    """``PYTHONWARNINGS`` for the run's processes: the user's filters and Ray's tip off."""
    return ",".join(part for part in (existing, RAY_TIP) if part)


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
        self.env = {**with_flower_on_path(dict(os.environ)), "FLWR_HOME": str(self.home),
                    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                    "RAY_TMPDIR": str(ray_tmp), MARKER_VARIABLE: self.marker,
                    "PYTHONWARNINGS": quiet_ray_tip(os.environ.get("PYTHONWARNINGS", "")),
                    **(extra_env or {})}
        self.process: subprocess.Popen[bytes] | None = None
        self.children: list[subprocess.Popen[Any]] = []
        self.stopped: dict[int, str] = {}

    def __enter__(self) -> LocalSuperLink:
        cmd = [flower_tool("flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
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
        self.stopped.update(stop_marked(self.marker, groups, reap=self._reap,
                                        folders=[self.ray_tmp, self.workdir]))
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
        return subprocess.run([flower_tool("flwr"), *args], env=self.env, capture_output=True, text=True,
                              check=False, start_new_session=True)

    def flwr_streamed(self, *args: str, log: RunLog | None = None) -> str:
        """Run a ``flwr`` CLI command, passing each output line to ``log`` (else stdout)."""
        proc = subprocess.Popen([flower_tool("flwr"), *args], env=self.env, stdout=subprocess.PIPE,
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
