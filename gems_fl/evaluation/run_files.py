"""Where a run's results go and which code made them, in plain Python: what the ``gems-fl``
command reads and writes around a run without the heavy libraries the run itself loads
(torch, Flower's server side), so that its own process stays small while the run's
processes hold the memory."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

__all__ = ["RESULTS_FILE", "git_commit"]

RESULTS_FILE = "results.json"


def git_commit(path: Path | None = None) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the checkout holding ``path`` (this package), else None."""
    here = Path(path or __file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=5, check=False)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(here), "status", "--porcelain",
                                 "--untracked-files=no"], capture_output=True, text=True,
                                timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}
