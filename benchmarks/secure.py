"""Secure aggregation against the plain run: accuracy, bytes and time.

    python3 benchmarks/secure.py --seeds 0 1 2 3 4

For each division (the paper's K=5 and Dirichlet(0.1) at K=5, Fashion-MNIST, or the
dataset ``--dataset`` names) and seed,
the same run goes through the real apps twice over the in-process Grid, with the run's
defaults: plain (every node sends its Gram reply) and ``secure-aggregation=true`` (the
statistics travel through SecAgg+, the server holds only their sums). Prints GEMS test
accuracy, the bytes every message carried up and down (SecAgg+'s four stages included)
and the wall time of the GEMS rounds, and writes JSON (``--out``, default
``results/benchmarks/secure.json``). ``public-samples=0``: the tuning rows are not what is
compared.
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
SMOKE = [["--dataset", "digits", "--divisions", "paper"]]

sys.path.insert(0, str(ROOT / "benchmarks"))

from inprocess_run import run_apps

from tests.helpers import app_defaults

DIVISIONS = [("paper", 5), ("dirichlet:0.1", 5)]


def one_run(division: str, nodes: int, seed: int, secure: bool,
            dataset: str = "fashion-mnist") -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = {**app_defaults(), "dataset": dataset, "label-division": division,
               "seed": seed, "public-samples": 0, "output-dir": out,
               "secure-aggregation": secure}
        results, grid, wall = run_apps(cfg, nodes)
    return {"division": division, "nodes": nodes, "seed": seed, "secure": secure,
            "accuracy": results["rows"]["GEMS"]["accuracy"],
            "point": results["intersection"]["method"],
            "bytes_up": sum(e["up"] for e in grid.exchanges),
            "bytes_down": sum(e["down"] for e in grid.exchanges),
            "rounds_s": results["timing_s"]["rounds"], "wall_s": wall,
            "secure_aggregation_s": (results["rounds"][0].get("secure_aggregation") or {})
            .get("wall_s"),
            "good_enough": results["verification"]["good_enough"],
            "inside_own_space": results["verification"].get("inside_own_space")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--divisions", nargs="+", default=[d for d, _ in DIVISIONS])
    parser.add_argument("--out", default=default_out("secure"))
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="digits: a layer small enough for class Gram matrices (the "
                        "gaussian point), which SecAgg+ then carries too")
    args = parser.parse_args()
    divisions = [(d, k) for d, k in DIVISIONS if d in args.divisions]
    runs = []
    for division, nodes in divisions:
        for seed in args.seeds:
            for secure in (False, True):
                runs.append(one_run(division, nodes, seed, secure, args.dataset))
                write_envelope("secure", args.out, {"runs": runs, "summary": []},
                               seeds=args.seeds)  # every run kept, should the rest not finish
                r = runs[-1]
                print(f"{division} K={nodes} seed {seed} {'secure' if secure else 'plain '}: "
                      f"GEMS {r['accuracy']:.4f} ({r['point']}), up {r['bytes_up'] / 1e6:.2f} "
                      f"MB, down {r['bytes_down'] / 1e6:.2f} MB, rounds {r['rounds_s']:.1f} s",
                      flush=True)
    print("\n| division | mode | GEMS (mean) | worst gap to plain | MB up | MB down | GEMS rounds s |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    summary = []
    for division, nodes in divisions:
        for secure in (False, True):
            rs = [r for r in runs if r["division"] == division and r["secure"] == secure]
            plain = {r["seed"]: r["accuracy"] for r in runs
                     if r["division"] == division and not r["secure"]}
            gap = max(abs(r["accuracy"] - plain[r["seed"]]) for r in rs)
            row = {"division": division, "nodes": nodes, "secure": secure,
                   "accuracy": sum(r["accuracy"] for r in rs) / len(rs), "worst_gap": gap,
                   "mb_up": sum(r["bytes_up"] for r in rs) / len(rs) / 1e6,
                   "mb_down": sum(r["bytes_down"] for r in rs) / len(rs) / 1e6,
                   "rounds_s": sum(r["rounds_s"] for r in rs) / len(rs)}
            summary.append(row)
            print(f"| {division} K={nodes} | {'secure' if secure else 'plain'} | "
                  f"{row['accuracy']:.4f} | {gap:.4f} | {row['mb_up']:.2f} | "
                  f"{row['mb_down']:.2f} | {row['rounds_s']:.1f} |")
    write_envelope("secure", args.out, {"runs": runs, "summary": summary}, seeds=args.seeds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
