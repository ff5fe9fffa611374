"""The JSON envelope a benchmark writes: what ran (benchmark, command, commit, machine)
beside its records, so a committed result says how to reproduce it."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_envelope(benchmark: str, out: str | Path, records: list[dict]) -> Path:
    """Write ``records`` to ``out`` with the benchmark's name, its command line, the
    checkout's commit and the machine; returns the path."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": benchmark, "commit": commit,
        "command": f"python3 benchmarks/{benchmark}.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {platform.node()}, python {platform.python_version()}",
        "records": records}, indent=1) + "\n")
    return path
