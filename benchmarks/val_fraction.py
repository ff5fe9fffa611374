"""Which share of a site's rows its node should set aside as validation rows when the
site's file holds none (setting ``val-fraction``).

    python3 benchmarks/val_fraction.py --fractions 0.1 0.2 0.3 --seeds 0 1

Fashion-MNIST, the Dirichlet(0.1) division over 5 sites (the division users run most):
each site holds the training rows of its partition and no validation rows, so its node
splits ``val-fraction`` of them off (per class, seeded) to build its space and check
h_G. The run is the real protocol (``GEMSClassifier.fit(X, y, sites=...)``, the code
of ``gems-fl run --site``) at the app's defaults. The choice is made on the 5,000
validation images no site holds; the test accuracy is printed beside it, not used.
Prints a table and writes JSON (results/benchmarks/val_fraction.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--fractions", "0.2"]]


def sites_of(seed: int, division: str, dataset: str = "fashion-mnist"):
    """The pooled training rows with each row's site, and the held-out val/test splits."""
    from gems_fl.data.datasets import load_dataset
    from gems_fl.data.partition import node_data, parse_division

    splits = load_dataset(dataset, seed=seed)
    parts = parse_division(division, 5, splits.num_classes)
    xs, ys, site = [], [], []
    for k in range(5):
        x_tr, y_tr, x_val, y_val = node_data(splits, parts, k, seed)
        rows = np.concatenate([x_tr, x_val]), np.concatenate([y_tr, y_val])  # all its rows
        xs.append(rows[0])
        ys.append(rows[1])
        site += [f"site-{k}"] * len(rows[1])
    return (np.concatenate(xs), np.concatenate(ys), np.array(site),
            (splits.val_x, splits.val_y), (splits.test_x, splits.test_y))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--division", default="dirichlet:0.1")
    parser.add_argument("--out", default=default_out("val_fraction"))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    from gems_fl.estimator import GEMSClassifier

    records = []
    for seed in args.seeds:
        x, y, site, (x_val, y_val), (x_test, y_test) = sites_of(seed, args.division, args.dataset)
        for fraction in args.fractions:
            t0 = time.monotonic()
            clf = GEMSClassifier(seed=seed, settings={"val-fraction": fraction})
            clf.fit(x, y, sites=site)
            good = clf.results_["good_enough"]
            record = {"seed": seed, "val_fraction": fraction,
                      "held_out_val_accuracy": float(clf.score(x_val, y_val)),
                      "test_accuracy": float(clf.score(x_test, y_test)),
                      "good_enough": f"{good['sites']} of {good['checked']}",
                      "wall_s": round(time.monotonic() - t0, 1)}
            records.append(record)
            print(json.dumps(record), flush=True)
    mine = {f: [r for r in records if r["val_fraction"] == f] for f in args.fractions}
    print_table(["val-fraction", f"held-out val acc (mean over seeds {args.seeds})", "test acc",
                 "good enough"],
                [[f"{f:g}", f"{np.mean([r['held_out_val_accuracy'] for r in rs]):.4f}",
                  f"{np.mean([r['test_accuracy'] for r in rs]):.4f}",
                  ", ".join(r["good_enough"] for r in rs)] for f, rs in mine.items()])
    write_envelope("val_fraction", args.out, records, seeds=args.seeds)


if __name__ == "__main__":
    main()
