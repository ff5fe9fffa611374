"""A site's convex model: Adam's epochs (the paper's recipe, `local-solve=adam`) against
the exact solve (`local-solve=exact`, the product's), per site, through the node's own
code (`build_local_space`: the fit, then the space).

    python3 benchmarks/exact_solve.py --divisions dirichlet:0.1:5 paper:5 --seeds 0

Fashion-MNIST, the run's defaults otherwise. For each site: the fit's seconds (one
thread, as a node runs), the objective the exact solve minimises (mean cross-entropy plus
its L2 term) at each fit, the exact solve's iterations and final gradient entry, and the
local model's accuracy on the site's validation rows. The L2 values of `--l2` are scored
the same way (the one with the best mean site validation accuracy is the default).
Prints a table and writes JSON (results/benchmarks/exact_solve.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper:5", "--l2", "1e-3"]]


def objective(center: np.ndarray, x: np.ndarray, y: np.ndarray, l2: float) -> float:
    logits = np.asarray(x, dtype=np.float64) @ center[:, :-1].T + center[:, -1]
    logits -= logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y].mean() + 0.5 * l2 * (center ** 2).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--divisions", nargs="+", default=["dirichlet:0.1:5"],
                        help="label-division:K")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--l2", type=float, nargs="+", default=[1e-4, 1e-3, 1e-2])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--out", default=default_out("exact_solve"))
    args = parser.parse_args()
    import gems_fl.learning.exact as exact
    from gems_fl.data.datasets import load_dataset
    from gems_fl.data.partition import node_data, parse_division
    from gems_fl.learning.threads import compute_threads
    from gems_fl.protocol.node import build_local_space
    from gems_fl.settings import Settings
    from gems_fl.settings.options import node_work

    records = []
    for seed in args.seeds:
        splits = load_dataset(args.dataset, seed=seed)
        for spec in args.divisions:
            division, k = spec.rsplit(":", 1)
            parts = parse_division(division, int(k), splits.num_classes)
            for site in range(int(k)):
                x_tr, y_tr, x_val, y_val = node_data(splits, parts, site, seed)
                fits = [("adam", None)] + [("exact", l2) for l2 in args.l2]
                for solve, l2 in fits:
                    work = node_work(Settings(dataset=args.dataset, seed=seed, local_solve=solve))
                    if l2 is not None:
                        exact.DEFAULT_L2 = l2
                    t0 = time.perf_counter()
                    with compute_threads():
                        local = build_local_space(x_tr, y_tr, x_val, y_val, splits.num_classes,
                                                  replace(work), seed=seed)
                    seconds = time.perf_counter() - t0
                    center = local.space.center.reshape(splits.num_classes, -1)
                    report = local.training
                    record = {"seed": seed, "division": spec, "site": site,
                              "train_rows": len(y_tr), "solve": solve, "l2": l2,
                              "seconds_fit_and_space": round(seconds, 2),
                              "objective_at_l2_1e-3": objective(center, x_tr, y_tr, 1e-3),
                              "val_accuracy": local.val_accuracy,
                              "iterations": getattr(report, "iterations", None),
                              "epochs": getattr(report, "epochs", None),
                              "gradient_norm": getattr(report, "gradient_norm", None)}
                    records.append(record)
                    print(json.dumps(record), flush=True)
    rows = []
    for spec in args.divisions:
        for solve, l2 in [("adam", None)] + [("exact", v) for v in args.l2]:
            mine = [r for r in records if r["division"] == spec and r["solve"] == solve
                    and r["l2"] == l2]
            rows.append([spec, solve if l2 is None else f"exact, L2 {l2:g}",
                         f"{np.mean([r['val_accuracy'] for r in mine]):.4f}",
                         f"{sum(r['seconds_fit_and_space'] for r in mine):.1f}",
                         "-" if l2 is None else f"{np.mean([r['iterations'] for r in mine]):.0f}",
                         f"{np.mean([r['objective_at_l2_1e-3'] for r in mine]):.4f}"])
    print_table(["division", "fit", "mean site val acc", "s, all sites (fit + space)",
                 "mean iterations", "mean objective (L2 1e-3)"], rows)
    write_envelope("exact_solve", args.out, records, seeds=args.seeds)


if __name__ == "__main__":
    main()
