"""The MLP's one-shot output layer with class Gram matrices (the ``gaussian`` point).

    python3 benchmarks/gaussian_point_mlp.py --seeds 0 1 2 3 4 --cases paper:5 paper:3 \
        0,1,2,3,4/5,6,7,8,9:2 dirichlet:0.1:5

Each run is the real ServerApp and ClientApp code over an in-process Grid with the run's
defaults (``gram-point=auto``, ``class-grams=auto``: the output layer's nodes send one
Gram matrix per class they hold, and the selection round scores the gaussian point beside
the pooled, LDA and closed-form points) except ``model='mlp'``, Fashion-MNIST and
``public-samples=0`` (untuned). ``--class-grams false`` runs the previous default (no
class Gram matrices) for comparison. ``--model logistic`` runs the convex model on
pixels, where ``class-grams=auto`` sends each class's covariance in ``gram-rank``'s factor
form and ``--class-grams true`` (with ``gram-rank=auto``, the same) used to send the whole
matrices (section "2c" of the README). A case is
``DIVISION:NODES``. Prints per run the
test accuracy, the point the selection round kept, the output round's bytes up per node
and on how many nodes ``h_G`` passed the nodes' own check; writes JSON after every run
(``--out``, default ``results/benchmarks/gaussian_point_mlp.json``; runs already there are
skipped, so an interrupted benchmark resumes).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--cases", "paper:3"]]
sys.path.insert(0, str(ROOT / "benchmarks"))  # the run through the apps

from gram_rank_mlp import mlp_run


def run_once(division: str, nodes: int, seed: int, class_grams: str, model: str,
             dataset: str = "fashion-mnist") -> dict:
    results, wall, output = mlp_run({"label-division": division, "seed": seed,
                                     "class-grams": class_grams, "model": model,
                                     "baselines": "all", "dataset": dataset}, nodes)
    ver = results["verification"]
    widths = results.get("hidden_widths") or [None]
    return {"model": model, "division": division, "nodes": nodes, "seed": seed,
            "class_grams": class_grams, "width": widths[-1],
            "gaussian_l2": results["intersection"].get("gaussian_l2"),
            "output_up_per_node": output["bytes_received"] / len(output["nodes"]),
            "gems": results["rows"]["GEMS"]["accuracy"],
            "point": results["intersection"]["method"],
            "global": results["rows"]["Global"]["accuracy"],
            "good_enough": ver["good_enough"], "answered": ver["answered"], "wall_s": wall}


def _case(row: dict) -> tuple:
    """A run's case: model, division, nodes, class-grams (rows written before ``--model``
    are the MLP's)."""
    return row.get("model", "mlp"), row["division"], row["nodes"], row["class_grams"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cases", nargs="+", default=["paper:5"])
    parser.add_argument("--class-grams", default="auto")
    parser.add_argument("--model", choices=("mlp", "logistic"), default="mlp",
                        help="logistic: the convex model on pixels (class Gram matrices "
                             "in factor form there)")
    parser.add_argument("--out", type=Path, default=Path(default_out("gaussian_point_mlp")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    rows = stored["records"] if "records" in stored else stored.get("runs", [])
    for seed in args.seeds:
        for case in args.cases:
            division, nodes = case.rsplit(":", 1)
            case_key = (args.model, division, int(nodes), args.class_grams)
            if any(_case(r) == case_key and r["seed"] == seed for r in rows):
                continue
            row = run_once(division, int(nodes), seed, args.class_grams, args.model,
                           args.dataset)
            rows.append(row)
            write_envelope("gaussian_point_mlp", args.out, rows, seeds=args.seeds)
            print(f"{args.model} {division} K={nodes} seed {seed} class-grams {args.class_grams}: GEMS "
                  f"{row['gems']:.4f} ({row['point']}, L2 {row['gaussian_l2']}), width {row['width']}, output round up "
                  f"{row['output_up_per_node']:,.0f} B/node, good enough "
                  f"{row['good_enough']}/{row['answered']} ({row['wall_s']:.0f} s)", flush=True)
    print("\n| model | division | K | class-grams | seeds | output round up per node | GEMS untuned | "
          "points kept | good enough | Global |")
    print("| --- | --- | --- | --- | --- | ---: | --- | --- | --- | --- |")
    for model, division, nodes, grams in sorted({_case(r) for r in rows}):
        mine = [r for r in rows if _case(r) == (model, division, nodes, grams)]
        acc = [r["gems"] for r in mine]
        kept = {p: sum(r["point"] == p for r in mine) for p in sorted({r["point"] for r in mine})}
        print(f"| {model} | {division} | {nodes} | {grams} | {len(mine)} | "
              f"{np.mean([r['output_up_per_node'] for r in mine]):,.0f} | "
              f"{np.mean(acc):.4f} ({np.std(acc):.4f}) | "
              f"{', '.join(f'{p} {n}' for p, n in kept.items())} | "
              f"{sum(r['good_enough'] for r in mine)}/{sum(r['answered'] for r in mine)} | "
              f"{np.mean([r['global'] for r in mine]):.4f} |")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
