"""Accuracy against epsilon: GEMS with differentially private Gram statistics.

    python3 benchmarks/dp.py --seeds 0 1 2

For each division (the paper's K=5 and Dirichlet(0.1) at K=5, Fashion-MNIST), seed and
epsilon (0.5, 1, 4, 8 and none), one run through the real apps over the in-process Grid
with the run's defaults and ``dp-epsilon`` (``dp-delta`` 1e-5, ``dp-clip`` its default):
each node clips its rows, adds the calibrated Gaussian noise to its Gram and label-moment
sums and sends only those; the server solves the pooled and LDA candidates from the noised
sums and the selection round keeps the best on the nodes' validation data. ``none`` is the
plain run (``dp-epsilon=0``). The noise is seeded (``dp-seeded-noise=true``) so that the
table repeats; a run without it draws other noise every time. Prints GEMS test accuracy,
the point kept, the noise std and the accountant's epsilon, on how many nodes h_G is good
enough, and writes JSON (``--out``, default ``results/benchmarks/dp.json``).
``public-samples=0``: no tuning on public data.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper", "--epsilons", "8"]]

sys.path.insert(0, str(ROOT / "benchmarks"))

from inprocess_run import run_apps

from tests.helpers import app_defaults

DIVISIONS = [("paper", 5), ("dirichlet:0.1", 5)]
EPSILONS = [0.5, 1.0, 4.0, 8.0, 0.0]  # 0: no DP


def one_run(division: str, nodes: int, seed: int, epsilon: float, clip: float | None,
            dataset: str = "fashion-mnist") -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = {**app_defaults(), "dataset": dataset, "label-division": division,
               "seed": seed, "public-samples": 0, "output-dir": out, "dp-epsilon": epsilon,
               "dp-seeded-noise": True, **({"dp-clip": clip} if clip else {})}
        results, grid, wall = run_apps(cfg, nodes)
    selection = next((r for r in results["rounds"] if r.get("refine") == 0), {})
    dp = results["privacy"]["dp"] or {}
    return {"division": division, "nodes": nodes, "seed": seed, "epsilon": epsilon or None,
            "clip": dp.get("clip"), "accuracy": results["rows"]["GEMS"]["accuracy"],
            "point": selection.get("point", results["intersection"]["method"]),
            "pooled_ridge": selection.get("pooled_ridge"),
            "noise_std": dp.get("noise_std"), "epsilon_spent": dp.get("epsilon_spent"),
            "bytes_up": sum(e["up"] for e in grid.exchanges), "wall_s": wall,
            "good_enough": results["verification"]["good_enough"],
            "inside_own_space": results["verification"].get("inside_own_space")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--divisions", nargs="+", default=[d for d, _ in DIVISIONS])
    parser.add_argument("--epsilons", type=float, nargs="+", default=EPSILONS,
                        help="0: the plain run")
    parser.add_argument("--clip", type=float, default=None, help="dp-clip (default: the run's)")
    parser.add_argument("--out", default=default_out("dp"))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    divisions = [(d, k) for d, k in DIVISIONS if d in args.divisions]
    runs = []
    for division, nodes in divisions:
        for seed in args.seeds:
            for eps in args.epsilons:
                runs.append(one_run(division, nodes, seed, eps, args.clip, args.dataset))
                write_envelope("dp", args.out, {"clip": args.clip, "runs": runs, "summary": []},
                               seeds=args.seeds)  # every run kept, should the rest not finish
                r = runs[-1]
                print(f"{division} K={nodes} seed {seed} epsilon {eps or 'none'}: GEMS "
                      f"{r['accuracy']:.4f} ({r['point']}, ridge {r['pooled_ridge']}), good "
                      f"enough {r['good_enough']}, {r['wall_s']:.0f} s", flush=True)
    print("\n| division | epsilon | GEMS (mean) | min | max | noise std | good enough (nodes) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    summary = []
    for division, nodes in divisions:
        for eps in args.epsilons:
            rs = [r for r in runs if r["division"] == division and r["epsilon"] == (eps or None)]
            if not rs:
                continue
            accs = [r["accuracy"] for r in rs]
            row = {"division": division, "nodes": nodes, "epsilon": eps or None,
                   "accuracy": sum(accs) / len(accs), "min": min(accs), "max": max(accs),
                   "noise_std": rs[0]["noise_std"], "seeds": len(rs),
                   "good_enough": sum(r["good_enough"] for r in rs),
                   "nodes_total": nodes * len(rs)}
            summary.append(row)
            std = f"{row['noise_std']:.1f}" if row["noise_std"] else "-"
            print(f"| {division} K={nodes} | {eps or 'none'} | {row['accuracy']:.4f} | "
                  f"{row['min']:.4f} | {row['max']:.4f} | {std} | "
                  f"{row['good_enough']}/{row['nodes_total']} |")
    write_envelope("dp", args.out, {"clip": args.clip, "runs": runs, "summary": summary},
                   seeds=args.seeds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
