"""``gems-fl status``: the SuperNodes a SuperLink knows, by name, and its runs with their
phase, in about 2 s (one Control API connection, no ``flwr`` process; none of the run's
heavy modules are imported)."""

from __future__ import annotations

import os
import re

from gems_fl.evaluation.results_bundle import is_bundle_line
from gems_fl.running.control import UNREGISTERED, ControlLink
from gems_fl.running.runlog import Progress

__all__ = ["status"]

IDENTIFIED = re.compile(r"Identify: node '([^']*)' \(id (\d+)\)")  # the identity round's log line


def status(connection: str) -> list[str]:
    """Lines for ``gems-fl status``: the SuperNodes (by the name they were registered under
    with SuperNode authentication, else the ``node-name`` they reported in the latest runs'
    identity rounds) and the runs with their phase. One Control API connection
    (:class:`~gems_fl.running.control.ControlLink`), no ``flwr`` process."""
    with ControlLink(connection) as link:
        nodes = [n for n in link.nodes() if n.status != UNREGISTERED]
        runs = link.runs()
        # Without authentication a stopped SuperNode stays listed offline, nameless, and
        # never comes back under its id (a restarted one gets a new id): not shown.
        stale = [n for n in nodes if not n.name and n.status == "offline"]
        nodes = [n for n in nodes if n not in stale]
        reported: dict[int, str] = {}
        phases: dict[int, str] = {}
        unnamed = any(not n.name for n in nodes)
        for index, run in enumerate(runs):
            latest = index >= len(runs) - 5
            if run.status.startswith("finished") and not (unnamed and latest):
                continue
            text = link.log(run.run_id)
            for name, node_id in IDENTIFIED.findall(text):
                reported[int(node_id)] = name
            with open(os.devnull, "w") as quiet:  # the phases only, nothing shown
                progress = Progress(stream=quiet, live=False, phase="submitted")
                for line in text.splitlines():
                    if not is_bundle_line(line):
                        progress.feed(line)
            phases[run.run_id] = progress.phase
    lines = [f"SuperLink '{connection}': {len(nodes)} SuperNode(s)"]
    for node in nodes:
        name = node.name or reported.get(node.node_id, "(name not reported yet)")
        lines.append(f"  node {node.node_id}: {name}, {node.status}")
    if stale:
        lines.append(f"  ({len(stale)} stopped SuperNode(s) not shown: without SuperNode "
                     "authentication a restarted SuperNode gets a new id)")
    lines.append(f"{len(runs)} run(s)")
    for run in runs:
        phase = phases.get(run.run_id)
        lines.append(f"  run {run.run_id}: {run.status}"
                     + (f", {phase}" if phase and not run.status.startswith("finished") else ""))
    return lines
