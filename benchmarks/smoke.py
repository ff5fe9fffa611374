"""Every benchmark that declares a ``SMOKE`` list, run at that tiny size: so that none
rots while the code it times changes. CI runs it (``.ci/run``).

    python3 benchmarks/smoke.py [--jobs N] [NAME ...]

Each entry of a script's ``SMOKE`` is one argument list; the script runs with it and with
``--out`` pointing into a temporary folder (never over a committed result), and passes
when it exits 0 and writes its JSON envelope. ``--jobs`` runs (default: one per core) go
at once, each held to one compute thread (``GEMS_FL_THREADS=1``, ``OMP_NUM_THREADS=1``)
so that they share the cores instead of fighting over them; the slowest known runs start
first (``SLOW_FIRST``). Prints one line per run as it ends and a table, and exits 1 if
any failed.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import print_table

TIMEOUT_S = 300
#: the runs measured slowest (they start a federation or load Fashion-MNIST): started
#: first, so that no core waits on one of them at the end
SLOW_FIRST = ("status_latency", "scale", "dp_rows", "secure", "kernel")


def smoke_runs(script: Path) -> list[list[str]]:
    """The script's ``SMOKE`` argument lists, read from its source (nothing is imported)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SMOKE" for t in node.targets):
            return [list(map(str, args)) for args in ast.literal_eval(node.value)]
    return []


def run_one(script: Path, args: list[str], index: int) -> tuple[bool, float, str]:
    """Run ``script`` with ``args`` at its smoke size: (passed, seconds, output if it failed)."""
    env = {**os.environ, "GEMS_FL_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{script.stem}-{index}.json"
        t0 = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(script), *args, "--out", str(out)],
                                  cwd=ROOT, capture_output=True, text=True, env=env,
                                  timeout=TIMEOUT_S)
            ok = done.returncode == 0 and bool(json.loads(out.read_text()).get("records"))
            tail = "" if ok else (done.stdout + done.stderr)[-2000:]
        except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
            ok, tail = False, str(exc)
        return ok, time.perf_counter() - t0, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="runs at once (default: one per core)")
    args = parser.parse_args()
    wanted = set(args.names)
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py"))
               if smoke_runs(p) and (not wanted or p.stem in wanted)]
    if wanted - {p.stem for p in scripts}:
        sys.exit(f"no SMOKE runs in: {', '.join(sorted(wanted - {p.stem for p in scripts}))}")
    runs = [(script, run_args, i) for script in scripts
            for i, run_args in enumerate(smoke_runs(script))]
    runs.sort(key=lambda r: SLOW_FIRST.index(r[0].stem) if r[0].stem in SLOW_FIRST
              else len(SLOW_FIRST))
    t0 = time.perf_counter()

    def report(run: tuple[Path, list[str], int]) -> tuple[bool, float]:
        ok, wall, tail = run_one(*run)
        print(f"{'ok  ' if ok else 'FAIL'} {run[0].name} {' '.join(run[1])} ({wall:.0f} s)"
              + (f"\n{tail}" if tail else ""), flush=True)
        return ok, wall

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        outcomes = list(pool.map(report, runs))
    rows = [[script.name, " ".join(run_args), "ok" if ok else "FAILED", f"{wall:.0f}"]
            for (script, run_args, _), (ok, wall) in zip(runs, outcomes)]
    print_table(["benchmark", "smoke arguments", "result", "wall s"], rows, right=0)
    failed = sum(not ok for ok, _ in outcomes)
    print(f"{len(runs) - failed} of {len(runs)} runs passed in {time.perf_counter() - t0:.0f} s "
          f"({args.jobs} at once)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
