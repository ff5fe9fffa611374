"""How long ``gems-fl run`` takes to report a mistake in its settings, from a fresh process.

    python3 benchmarks/error_latency.py --repeats 5

Each case runs the installed command (``python3 -m gems_fl.running.cli run ...``) from an
empty temporary folder, as a user types it, and times it to its exit (status 2 and one
``gems-fl: error:`` line, checked). The target (issue 46): at most 2 s idle, because the
settings and the label division are checked before torch, scikit-learn and Flower's
server side are imported. Prints a table (median and max per case) and writes JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--repeats", "1"]]

CASES = {
    "misspelt setting": ["--run-config", "epss=0.5"],
    "value out of range": ["--run-config", "eps=1.5"],
    "bad label division": ["--run-config", "label-division='dirichlet:x'"],
    "too few nodes": ["--nodes", "0"],
}


def time_case(args: list[str], folder: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", *args],
                          cwd=folder, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    lines = proc.stderr.strip().splitlines()
    if proc.returncode != 2 or not lines or not lines[-1].startswith("gems-fl: error:"):
        raise SystemExit(f"{args}: expected exit 2 and one error line, got {proc.returncode}: "
                         f"{proc.stderr[-500:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=default_out("error_latency"))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, case in CASES.items():
            times = [time_case(case, Path(folder)) for _ in range(args.repeats)]
            rows.append({"case": name, "args": case, "seconds": times,
                         "median_s": statistics.median(times), "max_s": max(times)})
            print(f"{name:<22} median {rows[-1]['median_s']:.2f} s  max {rows[-1]['max_s']:.2f} s",
                  flush=True)
    record = {"benchmark": "error_latency", "repeats": args.repeats, "cpus": os.cpu_count(),
              "target_s": 2.0, "cases": rows,
              "met": all(r["max_s"] <= 2.0 for r in rows)}
    write_envelope("error_latency", args.out, record)
    print(f"target 2 s met on every run: {record['met']}; wrote {args.out}")


if __name__ == "__main__":
    main()
