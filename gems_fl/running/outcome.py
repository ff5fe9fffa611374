"""What a launched run ends with: its outcome, or the error that says why it has none."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunFailed(RuntimeError):
    """The Flower run did not finish as completed, or left no results."""

    def __init__(self, message: str, errors: list[str] | None = None,
                 log_path: Path | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []
        self.log_path = log_path


class RunIncomplete(RunFailed):
    """The run went to the end and wrote its results, but a site that ``required-nodes``
    requires was left out or died (``gems-fl`` exits 3)."""

    exit_code = 3
    status = "incomplete"

    def __init__(self, message: str, results_path: Path, errors: list[str] | None = None,
                 log_path: Path | None = None) -> None:
        super().__init__(message, errors, log_path)
        self.results_path = results_path


class RunNotGoodEnough(RunIncomplete):
    """The run went to the end and wrote its results, but ``h_G`` was good enough on fewer
    sites than ``min-good-enough`` asks (``gems-fl`` exits 4)."""

    exit_code = 4
    status = "not-good-enough"


class RunInterrupted(RuntimeError):
    """SIGINT, SIGTERM or SIGHUP stopped the run; everything it started was stopped."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


@dataclass
class RunOutcome:
    """A finished run: its id, final status and results."""

    run_id: int
    status: str
    results_path: Path
    results: dict[str, Any]
    log_path: Path | None = None


def incomplete_run(path: Path) -> tuple[type[RunIncomplete], str] | None:
    """For a run that wrote its results and then failed on purpose: the error to raise and
    the line that says why (``incomplete``: a required site was left out, the sites line;
    ``not-good-enough``: too few sites found ``h_G`` good enough, the figures). Else None
    (no such results at ``path``)."""
    import json

    try:
        results = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if results.get("status") == "incomplete":
        sites = results.get("attendance", {})
        line = str(sites.get("line", "a required site was left out"))
        return RunIncomplete, line + (f"; {sites['roll']}" if sites.get("roll") else "")
    if results.get("status") == "not-good-enough":
        return RunNotGoodEnough, str(results.get("good_enough", {}).get(
            "line", "h_G was good enough on too few sites"))
    return None
