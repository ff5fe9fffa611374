"""How many landmarks the kernel model keeps on tables of a few hundred to 10,000 rows,
and what its validation accuracy does with the count asked (``kernel-landmarks``).

    python3 benchmarks/landmarks.py

Tables: scikit-learn's breast cancer and digits, and two seeded ``make_classification``
tables (30 columns, 5 classes, 2 clusters per class: a boundary a linear model misses)
of 2,000 and 10,000 rows; each cut into 4 Dirichlet(0.5) sites, 20 % held out. The
logistic model, then the kernel model asking 100, 300, 1,000 and 4,000 landmarks, through
the real protocol in-process (``GEMSClassifier``, the code of ``gems-fl run --site``).
Records the landmarks kept (each a k-means centre of one class of one site, the mean of
at least 5 of its rows), the best candidate's validation accuracy on the sites' rows (what
a choice would be made on) and the test accuracy beside it. Prints a table and writes JSON
(results/benchmarks/landmarks.json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

SMOKE = [["--tables", "breast_cancer", "--asked", "100"]]
TABLES = ("breast_cancer", "digits", "synthetic-2000", "synthetic-10000")


def table(name: str):
    from sklearn.datasets import load_breast_cancer, load_digits, make_classification

    if name == "breast_cancer":
        return load_breast_cancer(return_X_y=True)
    if name == "digits":
        return load_digits(return_X_y=True)
    rows = int(name.split("-")[1])
    return make_classification(n_samples=rows, n_features=30, n_informative=12, n_redundant=6,
                               n_classes=5, n_clusters_per_class=2, class_sep=1.0,
                               random_state=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=TABLES)
    parser.add_argument("--asked", type=int, nargs="+", default=[100, 300, 1000, 4000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=default_out("landmarks"))
    args = parser.parse_args()
    from gems_fl.estimator import GEMSClassifier

    warnings.simplefilter("ignore")  # a site the model does not suit warns; recorded below
    rng = np.random.default_rng(args.seed)
    records = []
    for name in args.tables:
        x, y = table(name)
        shares = rng.dirichlet([0.5] * 4, size=len(np.unique(y)))
        site = np.array([rng.choice(4, p=shares[c]) for c in y])
        test = rng.random(len(y)) < 0.2
        for model, asked in [("logistic", None)] + [("kernel", m) for m in args.asked]:
            t0 = time.monotonic()
            clf = GEMSClassifier(model=model, seed=args.seed,
                                 settings={"kernel-landmarks": asked} if asked else {})
            clf.fit(x[~test], y[~test], sites=site[~test])
            candidates = (clf.results_["intersection"].get("selection") or {}).get("candidates", [])
            record = {"table": name, "rows": int((~test).sum()), "model": model,
                      "asked": asked,
                      "kept": clf.results_["dataset"].get("feature_map", {}).get("landmarks"),
                      "val_accuracy": round(max(c["val_accuracy"] for c in candidates), 4)
                      if candidates else None,
                      "test_accuracy": round(float(clf.score(x[test], y[test])), 4),
                      "good_enough": clf.results_["good_enough"]["line"],
                      "wall_s": round(time.monotonic() - t0, 1)}
            records.append(record)
            print(json.dumps(record), flush=True)
    print_table(["table", "rows", "model", "asked", "kept", "val acc", "test acc"],
                [[r["table"], r["rows"], r["model"], r["asked"] or "-", r["kept"] or "-",
                  r["val_accuracy"], r["test_accuracy"]] for r in records], right=0)
    write_envelope("landmarks", args.out, records, seeds=[args.seed])


if __name__ == "__main__":
    main()
