"""The wall-time split of a launched run: what the ServerApp cannot time, added to
``results.json``, and the one line ``gems-fl run`` ends with."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
