"""Which ``standardize`` a run on sites' own files should default to.

    python3 benchmarks/standardize.py --seeds 0 1 2 3 4

Held-out own-data sites: scikit-learn's bundled wine (178 rows, 13 features on scales
from 0.1 to 1,000, 3 classes) and breast-cancer (569 rows, 30 features, 2 classes) data,
which no test or default of the project was tuned on. Per seed the rows are split over
the sites with a Dirichlet(0.5) label skew and each site's rows into train / val / test
(60 / 20 / 20 %), written as CSV files with a header, as sites would hold them. Each
setting runs the real ServerApp and ClientApps in-process with the app's defaults
(``dataset='node-files'``, ``evaluate-on-server=false``, ``min-good-enough=0``) and
reports h_G's accuracy on the sites' own test rows, pooled, and on how many sites h_G
was good enough. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--seeds", "0"]]

DATA = {"wine": 3, "breast-cancer": 4}  # data set -> number of sites
CHOICES = ("off", "node", "federated")


def load(name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    from sklearn.datasets import load_breast_cancer, load_wine

    bunch = load_wine() if name == "wine" else load_breast_cancer()
    names = [str(n).replace(" ", "_") for n in bunch.feature_names]
    return bunch.data, np.asarray(bunch.target_names)[bunch.target], names


def write_sites(name: str, sites: int, seed: int, folder: Path) -> list[dict]:
    """The rows over ``sites`` CSV sites with a Dirichlet(0.5) label skew."""
    x, y, columns = load(name)
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=int)
    while True:  # redrawn until every site holds 20 rows (train, val and test non-empty)
        for label in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == label))
            shares = rng.dirichlet([0.5] * sites)
            cuts = (np.cumsum(shares)[:-1] * len(rows)).astype(int)
            for site, part in enumerate(np.split(rows, cuts)):
                owner[part] = site
        if np.bincount(owner, minlength=sites).min() >= 20:
            break
    configs = []
    for site in range(sites):
        rows = rng.permutation(np.flatnonzero(owner == site))
        a, b = int(0.6 * len(rows)), int(0.8 * len(rows))
        stem = folder / f"{name}-{seed}-site{site}"
        for suffix, part in (("", rows[:a]), ("_val", rows[a:b]), ("_test", rows[b:])):
            with open(f"{stem}{suffix}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow([*columns, "label"])
                writer.writerows([*(repr(float(v)) for v in x[i]), y[i]] for i in part)
        configs.append({"data-path": f"{stem}.csv", "node-name": f"site{site}"})
    return configs


def run(configs: list[dict], standardize: str, seed: int, out: Path,
        extra: dict | None = None) -> dict:
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.serverapp import run_server

    with (ROOT / "pyproject.toml").open("rb") as f:
        defaults = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    cfg = {**defaults, "dataset": "node-files", "evaluate-on-server": False, "seed": seed,
           "standardize": standardize, "min-good-enough": "0", "min-rows": 1,
           "output-dir": str(out), **(extra or {})}
    grid = InProcessGrid(client_app, len(configs), cfg, node_configs=configs)
    results = run_server(grid, Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                                       run_config=cfg))
    pooled = results["verification"]["pooled"]
    local = [v for k, v in pooled.items() if k.startswith("local.")]  # none under DP
    return {"gems": pooled["gems"], "gems_val": results["verification"]["pooled_val"]["gems"],
            "local_mean": float(np.mean(local)) if local else None,
            "good_enough": results["good_enough"]["sites"], "sites": results["good_enough"]["checked"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=default_out("standardize"))
    args = parser.parse_args()
    records = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, sites in DATA.items():
            for seed in args.seeds:
                configs = write_sites(name, sites, seed, Path(tmp))
                for choice in CHOICES:
                    outcome = run(configs, choice, seed, Path(tmp) / f"{name}-{seed}-{choice}")
                    records.append({"data": name, "sites": sites, "seed": seed,
                                    "standardize": choice, **outcome})
                    print(f"{name} seed {seed} {choice:<9} h_G {outcome['gems']:.3f} good enough "
                          f"on {outcome['good_enough']}/{outcome['sites']} "
                          f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    print("\n| data | standardize | h_G accuracy (mean ± sd) | mean Local | good enough (sites) |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name in DATA:
        for choice in CHOICES:
            rows = [r for r in records if r["data"] == name and r["standardize"] == choice]
            acc = [r["gems"] for r in rows]
            print(f"| {name} | {choice} | {statistics.mean(acc):.3f} ± {statistics.pstdev(acc):.3f} "
                  f"| {statistics.mean(r['local_mean'] for r in rows):.3f} "
                  f"| {sum(r['good_enough'] for r in rows)}/{sum(r['sites'] for r in rows)} |")
    write_envelope("standardize", args.out, records, seeds=args.seeds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
