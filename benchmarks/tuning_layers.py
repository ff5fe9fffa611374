"""GEMS tuned against Raw converged for the MLP, with ``tune-layers`` chosen on held-out rows.

    python3 benchmarks/tuning_layers.py --seeds 0 1 --cases gram:paper:2 ellipsoid:paper:5

Each run is the real ServerApp and ClientApp code over an in-process Grid with the run's
defaults except ``model='mlp'``, Fashion-MNIST, ``public-samples=1000`` and the case's
``space`` and division (``SPACE:DIVISION:NODES``; ``paper:2`` is the appendix's K=2, both
nodes holding classes 0-4). ``--tune-layers`` (default ``auto``, the run's default) says
which layers GEMS tuned updates; ``--tune-fresh`` (default ``true``, the run's default)
whether the held-out rows may keep a fresh model trained to convergence instead. Prints
per run GEMS, GEMS tuned (the layers the held-out rows kept, and whether they kept the
fresh model), Raw and Raw converged; writes JSON after every run (``--out``,
default ``results/benchmarks/tuning_layers.json``; runs already there are skipped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--cases", "gram:paper:2"]]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the run through the apps

from gram_rank_mlp import mlp_run


def run_once(space: str, division: str, nodes: int, seed: int, layers: str,
             fresh: bool, dataset: str = "fashion-mnist") -> dict:
    results, wall, _ = mlp_run({"label-division": division, "seed": seed, "space": space,
                                "public-samples": 1000 if dataset == "fashion-mnist" else 200,
                                "tune-layers": layers, "tune-fresh": fresh, "baselines": "all",
                                "dataset": dataset}, nodes)
    rows = results["rows"]
    return {"space": space, "division": division, "nodes": nodes, "seed": seed,
            "tune_layers": layers, "tune_fresh": fresh, "gems": rows["GEMS"]["accuracy"],
            "fresh": bool(rows["GEMS tuned"].get("fresh")),
            "gems_tuned": rows["GEMS tuned"]["accuracy"],
            "tuned_layers": rows["GEMS tuned"].get("tuned_layers"),
            "raw": rows["Raw"]["accuracy"], "raw_converged": rows["Raw converged"]["accuracy"],
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cases", nargs="+", default=["gram:paper:2"])
    parser.add_argument("--tune-layers", default="auto", choices=("auto", "last", "all"))
    parser.add_argument("--tune-fresh", default="true", choices=("true", "false"))
    parser.add_argument("--out", type=Path, default=Path(default_out("tuning_layers")))
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="digits: a public sample of 200 (its pool is smaller)")
    args = parser.parse_args()
    fresh = args.tune_fresh == "true"
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    rows = stored["records"] if "records" in stored else stored.get("runs", [])
    print(f"{'space':>9} {'division':>9} {'K':>3} {'seed':>4} {'GEMS':>7} {'tuned':>7} "
          f"{'layers':>6} {'fresh':>5} {'Raw':>7} {'Raw conv':>8}")
    for seed in args.seeds:
        for case in args.cases:
            space, division, nodes = case.split(":", 1)[0], *case.split(":", 1)[1].rsplit(":", 1)
            key = (space, division, int(nodes), seed, args.tune_layers, fresh)
            if any((r["space"], r["division"], r["nodes"], r["seed"], r["tune_layers"],
                    r.get("tune_fresh", False)) == key for r in rows):
                continue
            row = run_once(space, division, int(nodes), seed, args.tune_layers, fresh,
                           args.dataset)
            rows.append(row)
            write_envelope("tuning_layers", args.out, rows, seeds=args.seeds)
            print(f"{space:>9} {division:>9} {nodes:>3} {seed:>4} {row['gems']:>7.4f} "
                  f"{row['gems_tuned']:>7.4f} {row['tuned_layers']:>6} {str(row['fresh']):>5} "
                  f"{row['raw']:>7.4f} "
                  f"{row['raw_converged']:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
