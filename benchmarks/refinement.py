"""Refinement rounds through the real apps: test accuracy and bytes after every round.

    python3 benchmarks/refinement.py --rounds 10 --seeds 0 \
        --divisions paper dirichlet:0.1

Each run is a whole GEMS run (``server_app``'s ``run_server`` over the in-process Grid
whose nodes run the project's ClientApp) on Fashion-MNIST, 5 nodes, with the run's
defaults and ``refine-rounds=R``: the one-shot ``h_G``, the selection round (pooled ridge
and logit scale), then R refinement steps of each ``--methods`` and each ``--refine-l2``.
``--model mlp`` refines the MLP's output layer on its merged hidden layers instead;
``--class-grams true`` starts the convex model from the gaussian point where it is kept. Prints
each run's refinement table and writes the JSON (``--out``, default
``results/benchmarks/refinement.json``; runs already there with the same ``--rounds`` are kept
and not rerun, so several invocations add up in one file).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--rounds", "2", "--divisions", "paper", "--methods", "secant"]]

from gems_fl.geometry.choices import REFINE_METHODS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--divisions", nargs="+", default=["paper", "dirichlet:0.1"])
    parser.add_argument("--methods", nargs="+", default=["secant", "monotone"],
                        choices=REFINE_METHODS, help="refine-method values")
    parser.add_argument("--model", default="logistic", choices=["logistic", "mlp"])
    parser.add_argument("--refine-l2", nargs="+", default=["auto"],
                        help="refine-l2 values (default: the run's, auto)")
    parser.add_argument("--out", type=Path, default=Path(default_out("refinement")))
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--class-grams", default="auto",
                        help="class-grams (true: the convex model's nodes send class Gram "
                             "matrices, so the selection round scores the gaussian point)")
    parser.add_argument("--show", type=Path, help="print the tables of a saved JSON and stop")
    args = parser.parse_args()
    if args.show:
        shown = json.loads(args.show.read_text())
        print_tables((shown["records"][0] if "records" in shown else shown)["runs"])
        return

    from flwr.app import Context, RecordDict

    from gems_fl.clientapp import build_client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.running.run_config import app_config
    from gems_fl.serverapp import run_server

    # runs already in --out are kept (same rounds) and not rerun, so invocations add up
    saved = json.loads(args.out.read_text()) if args.out.exists() else {}
    saved = saved["records"][0] if "records" in saved else saved
    runs = saved.get("runs", []) if saved.get("rounds") == args.rounds else []
    trials = [(d, s, m, l2) for d in args.divisions for s in args.seeds for m in args.methods
              for l2 in args.refine_l2]
    for division, seed, method, l2 in trials:
        key = (division, seed, args.nodes, method, args.model, l2, args.class_grams)
        if args.dataset == "fashion-mnist" and any(_key(r) == key for r in runs):
            continue
        with tempfile.TemporaryDirectory() as out:
            cfg = {**app_config(ROOT), "dataset": args.dataset, "label-division": division,
                   "seed": seed, "refine-rounds": args.rounds, "refine-method": method,
                   "public-samples": 0, "output-dir": out, "model": args.model,
                   "refine-l2": l2, "class-grams": args.class_grams, "baselines": "all"}
            grid = InProcessGrid(build_client_app(), args.nodes, cfg)
            ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                          run_config=cfg)
            results = run_server(grid, ctx)
        runs.append({"division": division, "seed": seed, "nodes": args.nodes, "method": method,
                     "model": args.model, "refine_l2": l2, "class_grams": args.class_grams,
                     "refinement": results["refinement"],
                     "h_g": results["intersection"]["method"],
                     "pooled_ridge": results["intersection"].get("pooled_ridge"),
                     "verification": {k: results["verification"].get(k)
                                      for k in ("answered", "good_enough")},
                     "global": results["rows"]["Global"]["accuracy"]})
        write_envelope("refinement", args.out, {"rounds": args.rounds, "runs": runs},
                       seeds=args.seeds)
    print_tables([r for r in runs if _key(r)[:2] in {(d, s) for d, s, *_ in trials}])
    print(f"JSON: {args.out}")


def _key(run: dict) -> tuple:
    """A run's trial: division, seed, nodes, method, model, refine-l2, class-grams."""
    return (run["division"], run["seed"], run["nodes"], run.get("method", "monotone"),
            run.get("model", "logistic"), run.get("refine_l2", "auto"),
            run.get("class_grams", "auto"))


def _what(r: dict) -> str:
    from gems_fl.evaluation.results import selection_text

    if r["kind"] == "selection":
        return selection_text(r)
    if r["kind"] == "spaces":
        return "one-shot h_G"
    if r["kind"] == "layer":
        return f"hidden layer {r.get('layer')}"
    return f"step {r['step']}" + (" (objective rose: point dropped)" if r.get("kept") is False
                                  else "")


def print_tables(runs: list[dict]) -> None:
    """One markdown table per run (also: ``--show JSON`` prints a saved run's tables)."""
    print()
    for run in runs:
        print(f"{run['division']}, seed {run['seed']}, {run['nodes']} nodes, "
              f"{run.get('model', 'logistic')}, {run.get('method', 'monotone')} steps, "
              f"refine-l2 {run.get('refine_l2', 'auto')}: h_G {run['h_g']}, "
              f"Global {run['global']:.3f}, final model good enough on "
              f"{run['verification']['good_enough']} of {run['verification']['answered']} nodes")
        print("| round | what | test accuracy | bytes so far |")
        print("| --- | --- | --- | --- |")
        for r in run["refinement"]:
            acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
            print(f"| {r['round']} | {_what(r)} | {acc} | "
                  f"{r['cumulative_bytes']:,} |")
        print()


if __name__ == "__main__":
    main()
