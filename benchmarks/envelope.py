"""The JSON envelope a benchmark writes: what ran (benchmark, command, commit, machine)
beside its records, so a committed result says how to reproduce it."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def print_table(header: list[str], rows: list[list], right: int | None = None) -> None:
    """A markdown table: ``header`` and ``rows`` of cells (already formatted); the first
    ``right`` columns (default all but the last) right-aligned."""
    right = len(header) - 1 if right is None else right
    print("\n| " + " | ".join(header) + " |")
    print("| " + " | ".join("---:" if i < right else "---" for i in range(len(header))) + " |")
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


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
