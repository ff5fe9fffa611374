"""Find and stop every process a run started, however it detached.

``gems-fl run`` starts the SuperLink in its own session; the SuperLink starts the
SuperExec, which starts ``flwr-simulation``, which starts Ray, whose GCS, raylet and
workers start sessions of their own and outlive their parents (re-parented to PID 1).
Process groups and parent links therefore miss some of them. What they all keep is
the environment they were started with: the launcher puts a unique marker variable
into the SuperLink's environment, and :func:`marked_processes` finds every process
whose ``/proc/<pid>/environ`` carries it.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import sysconfig
import time
import uuid
from collections.abc import Callable
from pathlib import Path

MARKER_VARIABLE = "GEMS_FL_RUN_MARKER"


def flower_tool(name: str) -> str:
    """The path of Flower's executable ``name`` (``flwr``, ``flower-superlink``,
    ``flower-supernode``) of the Python running ``gems-fl``: beside its interpreter or in
    its scripts folder (a virtual environment used without activating it), else on PATH;
    the bare name when none is found (the error then names it)."""
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name) or name


def with_flower_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with the folder of :func:`flower_tool`'s ``flwr`` first on PATH, so the
    processes Flower starts by name (the SuperExec, ``flwr-simulation``) are found too."""
    folder = str(Path(flower_tool("flwr")).parent)
    path = env.get("PATH", "")
    if folder in ("", ".") or folder in path.split(os.pathsep):
        return env
    return {**env, "PATH": os.pathsep.join(p for p in (folder, path) if p)}


def new_marker() -> str:
    """A value for :data:`MARKER_VARIABLE` that no other run uses."""
    return f"{os.getpid()}-{uuid.uuid4().hex}"


def marked_processes(marker: str, variable: str = MARKER_VARIABLE) -> list[int]:
    """PIDs (other than this process) whose environment has ``variable=marker``.

    Zombies and processes of other users (unreadable environ) are skipped.
    """
    needle = f"{variable}={marker}".encode()
    return _processes(lambda entry: needle in (entry / "environ").read_bytes().split(b"\0"))


def _processes(matches: Callable[[Path], bool]) -> list[int]:
    """PIDs (other than this process) whose ``/proc/<pid>`` entry ``matches``; entries
    that cannot be read (gone, zombies, other users) are skipped."""
    found = []
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if matches(entry):
                found.append(int(entry.name))
        except OSError:
            continue
    return sorted(found)


def processes_using(folders: list[Path]) -> list[int]:
    """PIDs (other than this process) with a file open, or their working directory, under
    one of ``folders``.

    Ray retitles its agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) with
    ``setproctitle``, which overwrites the memory ``/proc/<pid>/environ`` shows, so the
    marker is gone from them; they still hold their log files in the run's Ray folder.
    """
    prefixes = tuple(str(Path(f).resolve()) + os.sep for f in folders)
    if not prefixes:
        return []

    def uses(entry: Path) -> bool:
        links = [os.readlink(entry / "cwd"), *(os.readlink(fd) for fd in (entry / "fd").iterdir())]
        return any(link.startswith(prefixes) for link in links)

    return _processes(uses)


def process_name(pid: int) -> str:
    """A short name for a process: its program (the script for Python), or ``ray::...``."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    args = [a.decode(errors="replace") for a in args if a]
    if not args:
        return "?"
    if args[0].startswith("ray::") or any("/ray/" in a for a in args[:2]):
        return "ray"
    first = os.path.basename(args[0])
    if first.startswith("python") and len(args) > 1:
        script = next((a for a in args[1:] if not a.startswith("-")), args[1])
        first = os.path.basename(script)
    return first


def describe(names: dict[int, str]) -> str:
    """``flower-superlink, flwr-simulation and 9 Ray processes``-style summary."""
    ray = sum(1 for n in names.values() if n == "ray")
    others = sorted({n for n in names.values() if n != "ray"})
    parts = others + ([f"{ray} Ray process{'es' if ray != 1 else ''}"] if ray else [])
    if not parts:
        return "no process"
    return ", ".join(parts[:-1]) + (" and " if len(parts) > 1 else "") + parts[-1]


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_marked(marker: str, groups: list[int | None] = (), grace: float = 5.0,
                reap: Callable[[], object] = lambda: None,
                folders: list[Path] = ()) -> dict[int, str]:
    """SIGTERM the process ``groups`` and every marked process; SIGKILL what is left.

    ``reap`` is called while waiting, so the caller can ``poll()`` its own children
    (they stay zombies otherwise). Returns ``{pid: name}`` of the marked processes
    that were signalled. ``folders``: processes with files open there (the run's own
    temp folders) are the run's too (:func:`processes_using`).
    """
    seen: dict[int, str] = {}

    def run_processes() -> list[int]:
        return sorted(set(marked_processes(marker)) | set(processes_using(list(folders))))

    def note(pids: list[int]) -> None:
        for pid in pids:
            if pid not in seen:
                seen[pid] = process_name(pid)

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 3.0)):
        for group in groups:
            _signal_group(group, sig)
        pids = run_processes()
        note(pids)
        _signal_all(pids, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            reap()
            pids = run_processes()
            if not pids:
                return seen
            note(pids)
            _signal_all(pids, sig)  # ones that appeared since (a worker being started)
            time.sleep(0.1)
    reap()
    return seen
