"""The JSON envelope a benchmark writes: what ran (benchmark, command, commit, machine)
beside its records, so a committed result says how to reproduce it."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
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


def _commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False).stdout.strip()
    # results (this folder's own output among them) are not the code that ran
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":(exclude)results"], cwd=ROOT,
                           capture_output=True, text=True, check=False).stdout.strip()
    return commit + ("+changes" if dirty and commit else "")


#: the code a benchmark runs is the checkout's when it started (a commit made while it
#: runs does not change what it measured), so the commit is read once, at import
STARTED_AT = _commit()
_T0 = time.perf_counter()


def write_envelope(benchmark: str, out: str | Path, records: list[dict] | dict, *,
                   seeds: list[int] | None = None, settings: dict | None = None) -> Path:
    """Write ``records`` to ``out`` with the benchmark's name, its command line, the
    commit checked out when it started (``+changes``: with uncommitted edits), the machine,
    the seeds and run settings it used (where it has them) and the wall time so far;
    returns the path. A dict of records (a benchmark's own shape) is kept as one record."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "benchmark": benchmark, "commit": STARTED_AT,
        "command": f"python3 benchmarks/{benchmark}.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {platform.node()}, {cpu_model()}, python "
                   f"{platform.python_version()}, {os.cpu_count()} cpus",
        "seeds": seeds, "settings": settings,
        "wall_s": round(time.perf_counter() - _T0, 1),
        "records": records if isinstance(records, list) else [records]}, indent=1) + "\n")
    return path


def cpu_model() -> str:
    """The processor's model name (Linux), so that seconds from two machines are told apart."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or "cpu unknown"
    field = {}
    for line in lines:
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    return (f"{field.get('model name', 'cpu unknown')} (family {field.get('cpu family', '?')}, "
            f"model {field.get('model', '?')})")


def default_out(benchmark: str) -> str:
    """Where a benchmark's result goes unless ``--out`` says otherwise: the one folder."""
    return str(ROOT / "results" / "benchmarks" / f"{benchmark}.json")
