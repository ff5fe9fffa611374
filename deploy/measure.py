"""Wall time and bytes per round of convex and NN GEMS on a local TLS federation.

    python3 deploy/measure.py                      # 3 nodes, digits, default settings
    python3 deploy/measure.py --nodes 3 --mlp-hidden 50 --out deploy/out/measure.json

Starts what deploy/README.md describes, on this machine's loopback: certificates
from deploy/make-certs.sh, a TLS ``flower-superlink``, one ``flower-supernode`` per
node with its own data file (the digits partitions of the paper's division, written
as .npz), then ``flwr run`` convex GEMS and NN (layer-wise) GEMS through the TLS
connection. It prints one row per round from each run's ``results.json``: the
identity query, then the GEMS rounds, with the bytes sent down (all nodes together),
the bytes received back, and the round's wall time on the server (from sending the
messages to the end of aggregation; Flower's ServerApp polls for replies every 3 s,
so round times are quantised by that poll). Every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gems_fl.data.nodes import write_partition_files
from gems_fl.running.federation import TlsFederation


def _sites(folder: Path, num_nodes: int, seed: int) -> list[dict]:
    return [{"data-path": str(path), "node-name": path.stem}
            for path in write_partition_files(folder, num_nodes, seed=seed)]


def _rows(kind: str, results: dict, run_wall: float) -> list[dict]:
    ident = results["identify"]
    rows = [{"run": kind, "round": "identify (query)", "bytes_down": ident["bytes_sent"],
             "bytes_up": ident["bytes_received"], "wall_s": ident["wall_s"]}]
    for r in results["rounds"]:
        layer = r.get("layer", "convex")
        label = {None: "output layer", "convex": "GEMS round"}.get(layer, f"hidden layer {layer}")
        rows.append({"run": kind, "round": f"{r['round']}: {label}", "bytes_down": r["bytes_sent"],
                     "bytes_up": r["bytes_received"], "wall_s": r["wall_s"]})
    rows.append({"run": kind, "round": "whole `flwr run`", "bytes_down": None, "bytes_up": None,
                 "wall_s": run_wall})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3, help="SuperNodes (paper division: 2, 3 or 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mlp-hidden", default="50", help="hidden widths of the NN run")
    parser.add_argument("--out", default=str(ROOT / "deploy" / "out" / "measure.json"))
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="gems-measure-"))
    base = {"seed": args.seed, "evaluate-on-server": False, "output-dir": str(workdir / "results")}
    runs = {
        "convex": dict(base),
        "NN": {**base, "model": "mlp", "hidden": args.mlp_hidden},
    }
    rows = []
    with TlsFederation(workdir / "fed") as fed:
        for config in _sites(workdir, args.nodes, args.seed):
            fed.add_node(config)
        for kind, cfg in runs.items():
            run = fed.run(ROOT, cfg, timeout=1800)
            if run.status != "finished:completed" or run.results is None:
                print(run.output[-4000:], file=sys.stderr)
                print(f"measure: {kind} run ended '{run.status}'", file=sys.stderr)
                return 1
            rows += _rows(kind, run.results, run.wall_s)

    print(f"| run | round | bytes down (all {args.nodes} nodes) | bytes up | wall s |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        down = "" if r["bytes_down"] is None else f"{r['bytes_down']:,}"
        up = "" if r["bytes_up"] is None else f"{r['bytes_up']:,}"
        print(f"| {r['run']} | {r['round']} | {down} | {up} | {r['wall_s']:.1f} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"nodes": args.nodes, "settings": runs, "rows": rows,
                               "machine": {"cpus": __import__("os").cpu_count(),
                                           "python": platform.python_version()},
                               "date": time.strftime("%Y-%m-%d")}, indent=2) + "\n")
    print(f"\nwritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
