"""How many rows a site needs under differential privacy for an h_G that is good enough.

    python3 benchmarks/dp_rows.py --rows 250 1000 4000 12000 --epsilons 1 4 --seeds 0

Fashion-MNIST (784 pixel features in [0, 1], 10 classes), 4 sites as in the deployment
guide, each holding ``rows`` training rows drawn with a Dirichlet(0.5) class mix (seeded)
and no validation rows (each node sets 20 % aside, ``val-fraction``). Each run is the
real protocol (``GEMSClassifier.fit(X, y, sites=...)``, the code of ``gems-fl run
--site``) with the app's defaults, ``eps`` 0.4 (the default), and ``dp-epsilon`` EPS
(``dp-delta`` 1e-5, ``dp-clip`` 5, no scaling: the pixels' range is known), seeded noise
so the table repeats; the plain run (no DP) is the reference. Reported: h_G's accuracy on
the 5,000 test images (the project's split) and on how many of the 4 sites h_G was good enough
(its accuracy on the site's validation rows >= eps). Prints a table and writes JSON
(results/benchmarks/dp_rows.json).
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

from envelope import print_table, write_envelope

#: the tiny run CI makes of this script (``python3 benchmarks/smoke.py``)
SMOKE = [["--rows", "250", "--epsilons", "8"]]

SITES = 4


def draw_sites(x: np.ndarray, y: np.ndarray, rows: int, seed: int):
    """``SITES`` disjoint sites of ``rows`` rows each, each with a Dirichlet(0.5) class mix."""
    rng = np.random.default_rng(seed)
    pools = {c: list(rng.permutation(np.flatnonzero(y == c))) for c in range(10)}
    picked, site = [], []
    for k in range(SITES):
        mix = rng.dirichlet(np.full(10, 0.5))
        counts = rng.multinomial(rows, mix)
        for c, n in enumerate(counts):
            n = min(int(n), len(pools[c]))
            picked += pools[c][:n]
            del pools[c][:n]
            site += [f"site-{k}"] * n
    picked = np.asarray(picked)
    return x[picked], y[picked], np.asarray(site)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[250, 1000, 4000, 12000])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "dp_rows.json"))
    args = parser.parse_args()
    from gems_fl.data.datasets import load_dataset
    from gems_fl.estimator import GEMSClassifier, GoodEnoughWarning

    records = []
    for seed in args.seeds:
        splits = load_dataset("fashion-mnist", seed=seed)
        pool_x = np.concatenate([splits.train_x, splits.val_x])
        pool_y = np.concatenate([splits.train_y, splits.val_y])
        for rows in args.rows:
            x, y, site = draw_sites(pool_x, pool_y, rows, seed)
            for epsilon in [0.0, *args.epsilons]:
                settings = {"dp-epsilon": epsilon, "dp-seeded-noise": True} if epsilon else {}
                t0 = time.monotonic()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", GoodEnoughWarning)
                    clf = GEMSClassifier(seed=seed, settings=settings).fit(x, y, sites=site)
                good = clf.results_["good_enough"]
                record = {"seed": seed, "rows_per_site": rows, "epsilon": epsilon or "none",
                          "test_accuracy": float(clf.score(splits.test_x, splits.test_y)),
                          "good_enough": good["sites"], "sites": good["checked"],
                          "wall_s": round(time.monotonic() - t0, 1)}
                records.append(record)
                print(json.dumps(record), flush=True)
    print_table(["rows per site", "epsilon", "h_G test accuracy", "good enough (of 4 sites)"],
                [[f"{r['rows_per_site']:,}", r["epsilon"], f"{r['test_accuracy']:.4f}",
                  r["good_enough"]] for r in records])
    write_envelope("dp_rows", args.out, records)


if __name__ == "__main__":
    main()
