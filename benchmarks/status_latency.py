"""How long ``gems-fl status`` takes to answer, as an operator runs it.

    python3 benchmarks/status_latency.py --repeats 5

A TLS SuperLink with SuperNode authentication on loopback, three sites registered by
name, two of them connected (one never connects). ``gems-fl status --superlink gems-tls``
is timed as a new process, the way an operator types it: before any run, and after one
finished run (whose log it reads for the phases and names). Prints a table and writes
JSON.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--repeats", "1"]]


def time_status(env: dict[str, str], repeats: int) -> tuple[list[float], str]:
    from gems_fl.running.federation import CONNECTION

    walls, shown = [], ""
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "status",
                               "--superlink", CONNECTION], env={**env, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, check=True)
        walls.append(time.perf_counter() - t0)
        shown = done.stdout
    return walls, shown


def main() -> None:
    from gems_fl.data.nodes import write_partition_files
    from gems_fl.running.federation import TlsFederation, make_node_key

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=default_out("status_latency"))
    args = parser.parse_args()
    records = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = write_partition_files(tmp / "sites", 3)
        with TlsFederation(tmp / "fed", supernode_auth=True) as fed:
            for k in range(3):
                make_node_key(tmp / f"site-{k}.key")
                fed.register(tmp / f"site-{k}.key.pub", f"site-{k}")
            for k in range(2):
                fed.add_node({"data-path": str(paths[k]), "node-name": f"site-{k}"},
                             extra_args=("--auth-supernode-private-key", str(tmp / f"site-{k}.key")))
            for label in ("before any run", "after one finished run"):
                if label.startswith("after"):
                    fed.run(ROOT, {"output-dir": str(tmp / "out"), "required-nodes": "2",
                                   "baselines": "none", "evaluate-on-server": False}, timeout=600)
                walls, shown = time_status(fed.env, args.repeats)
                records[label] = {"wall_s": walls, "output": shown}
                print(f"{label}: median {statistics.median(walls):.2f} s, max {max(walls):.2f} s",
                      flush=True)
    print("\n| SuperLink | median | max |\n| --- | ---: | ---: |")
    for label, rec in records.items():
        print(f"| {label} | {statistics.median(rec['wall_s']):.2f} s | {max(rec['wall_s']):.2f} s |")
    print("\n" + records["after one finished run"]["output"])
    write_envelope("status_latency", args.out,
                   [{"superlink": label, **rec} for label, rec in records.items()])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
