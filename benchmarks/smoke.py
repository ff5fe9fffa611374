"""Every benchmark that declares a ``SMOKE`` list, run at that tiny size: so that none
rots while the code it times changes. CI runs it (``.ci/run``).

    python3 benchmarks/smoke.py [NAME ...]

Each entry of a script's ``SMOKE`` is one argument list; the script runs with it and with
``--out`` pointing into a temporary folder (never over a committed result), and passes
when it exits 0 and writes its JSON envelope. Prints one line per run and a table, and
exits 1 if any failed.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import print_table

TIMEOUT_S = 300


def smoke_runs(script: Path) -> list[list[str]]:
    """The script's ``SMOKE`` argument lists, read from its source (nothing is imported)."""
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SMOKE" for t in node.targets):
            return [list(map(str, args)) for args in ast.literal_eval(node.value)]
    return []


def main() -> None:
    wanted = set(sys.argv[1:])
    scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py"))
               if smoke_runs(p) and (not wanted or p.stem in wanted)]
    if wanted - {p.stem for p in scripts}:
        sys.exit(f"no SMOKE runs in: {', '.join(sorted(wanted - {p.stem for p in scripts}))}")
    rows, failed = [], 0
    for script in scripts:
        for i, args in enumerate(smoke_runs(script)):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / f"{script.stem}-{i}.json"
                t0 = time.perf_counter()
                try:
                    done = subprocess.run([sys.executable, str(script), *args, "--out", str(out)],
                                          cwd=ROOT, capture_output=True, text=True,
                                          timeout=TIMEOUT_S)
                    ok = done.returncode == 0 and bool(json.loads(out.read_text()).get("records"))
                    tail = "" if ok else (done.stdout + done.stderr)[-2000:]
                except (subprocess.TimeoutExpired, OSError, ValueError) as exc:
                    ok, tail = False, str(exc)
                wall = time.perf_counter() - t0
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {script.name} {' '.join(args)} ({wall:.0f} s)",
                  flush=True)
            if tail:
                print(tail, flush=True)
            rows.append([script.name, " ".join(args), "ok" if ok else "FAILED", f"{wall:.0f}"])
    print_table(["benchmark", "smoke arguments", "result", "wall s"], rows, right=0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
