"""Flower's overhead: the same run through ``gems-fl run`` (SuperLink, Ray, N SuperNodes)
and in-process (the real ServerApp and ClientApp code over an in-process Grid, one
process, nodes one after another).

    python3 benchmarks/overhead.py                       # Fashion-MNIST, K = 5, convex
    python3 benchmarks/overhead.py --repeats 3 --run-config "model='mlp'"

Both sides run as fresh processes from the command line, so Python start-up and imports
count on both. Pairs run interleaved (Flower, in-process, Flower, ...); the table shows
each run's wall time and its split from ``results.json``'s ``timing_s`` (start-up is
what ``gems-fl run`` spends before the ServerApp starts: SuperLink, SuperExec, the app's
install and Ray), and the ratio of the medians. Writes ``benchmarks/out/overhead.json``
with the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("startup", "wait_for_nodes", "identify", "server_data", "rounds", "verify",
          "baselines", "shutdown")


def in_process_child(nodes: int, run_config: str, out_dir: str) -> None:
    """One run over the in-process Grid (what ``gems-fl reproduce`` and the tests do)."""
    sys.path.insert(0, str(ROOT))
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.running.run_config import app_config, parse_run_config
    from gems_fl.serverapp import run_server

    cfg = {**app_config(ROOT), **parse_run_config(run_config), "output-dir": out_dir}
    grid = InProcessGrid(client_app, nodes, cfg)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    run_server(grid, ctx)


def run_one(kind: str, nodes: int, run_config: str, out_dir: Path, cpus_per_node: int) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    if kind == "flower":
        cmd = [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), "--nodes",
               str(nodes), "--output-dir", str(out_dir), "--run-config", run_config,
               "--cpus-per-node", str(cpus_per_node)]
    else:
        cmd = [sys.executable, __file__, "--child", "--nodes", str(nodes), "--run-config",
               run_config, "--child-out", str(out_dir)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    path = max(out_dir.glob("run-*/results.json"), key=lambda p: p.stat().st_mtime)
    results = json.loads(path.read_text())
    timing = results["timing_s"]
    if kind == "in-process":  # before the ServerApp: Python start-up, imports
        timing["startup"] = results["started_unix"] - (time.time() - wall)
    return {"kind": kind, "wall_s": wall, "timing_s": timing,
            "gems_accuracy": results["rows"]["GEMS"].get("accuracy")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--run-config", default="dataset='fashion-mnist'")
    parser.add_argument("--cpus-per-node", type=int, default=1,
                        help="gems-fl run --cpus-per-node (2 is Flower's own default)")
    parser.add_argument("--kinds", default="flower,in-process")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "overhead.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        in_process_child(args.nodes, args.run_config, args.child_out)
        return
    machine = {"cores": os.cpu_count(), "loadavg_before": os.getloadavg()}
    work = Path(args.out).parent / "overhead-runs"
    runs = []
    for i in range(args.repeats):
        for kind in args.kinds.split(","):
            run = run_one(kind, args.nodes, args.run_config, work / f"{kind}-{i}",
                          args.cpus_per_node)
            print(f"{kind} #{i}: {run['wall_s']:.1f} s", flush=True)
            runs.append(run)
    machine["loadavg_after"] = os.getloadavg()
    print(f"machine: {machine}; {args.nodes} nodes, run config: {args.run_config}")
    print("| run | wall s | " + " | ".join(PHASES) + " | GEMS |")
    print("| --- | ---: | " + " | ".join("---:" for _ in PHASES) + " | ---: |")
    for r in runs:
        cells = [f"{r['timing_s'][p]:.1f}" if p in r["timing_s"] else "-" for p in PHASES]
        print(f"| {r['kind']} | {r['wall_s']:.1f} | " + " | ".join(cells)
              + f" | {r['gems_accuracy']:.4f} |")
    medians = {kind: statistics.median(r["wall_s"] for r in runs if r["kind"] == kind)
               for kind in args.kinds.split(",")}
    ratio = (medians["flower"] / medians["in-process"]
             if {"flower", "in-process"} <= set(medians) else None)
    print("median wall: " + ", ".join(f"{k} {v:.1f} s" for k, v in medians.items())
          + (f"; ratio {ratio:.2f}x" if ratio else "") + f" (--cpus-per-node {args.cpus_per_node})")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": machine, "nodes": args.nodes,
                                          "run_config": args.run_config,
                                          "cpus_per_node": args.cpus_per_node, "runs": runs,
                                          "median_wall_s": medians, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
