"""Differential privacy on small sites' own files: declared feature ranges against no scaling.

    python3 benchmarks/dp_small_sites.py --seeds 0 1 2 3 4

The sites of ``benchmarks/standardize.py`` (held-out wine, 3 sites, and breast-cancer, 4
sites, 178 and 569 rows in all: a few dozen to a few hundred rows a site, Dirichlet(0.5)
label skew, CSV files with a header). Each DP run takes the app's defaults on
``dataset='node-files'`` with ``dp-epsilon`` EPS (``dp-delta`` 1e-5, ``dp-clip`` 5) and
seeded noise so the table repeats, and scales its features either

- ``ranges``: ``feature-ranges`` from the minimum and maximum that each data set's own
  documentation publishes (scikit-learn's ``DESCR``, "Summary Statistics"), as an operator
  would declare them; known without the sites' rows, they spend no privacy; or
- ``off``: no scaling (what a DP run on own files did before ``feature-ranges``).

With ranges, each row's features lie in [-1, 1], so the default ``dp-clip`` 5 (chosen on
Fashion-MNIST's 784 standardised features) clips nothing on 13-30 features and sizes the
noise for rows far longer than these; the ranges runs also try ``dp-clip`` 1 and 2. The
clip to recommend is read from h_G's accuracy on the sites' validation rows, pooled
(``gems_val``), never from the test rows.

The plain run (no DP, the default federated scaling) is the reference. Reported: h_G's
accuracy on the sites' own test rows, pooled, and on how many sites h_G was good enough.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--seeds", "0"]]

from benchmarks.standardize import DATA, load, run, write_sites

EPSILONS = (1.0, 4.0, 16.0)
CELLS = (("ranges", 1.0), ("ranges", 2.0), ("ranges", 5.0), ("off", 5.0))  # (scaling, dp-clip)


def documented_ranges(name: str, folder: Path) -> Path:
    """A ``feature,min,max`` file from the data set's documented summary statistics."""
    from sklearn.datasets import load_breast_cancer, load_wine

    descr = (load_wine() if name == "wine" else load_breast_cancer()).DESCR
    table = descr[descr.index("Summary Statistics"):]
    rows = re.findall(r"^[^:\n=]+:\s+(-?[\d.]+)\s+(-?[\d.]+)", table, re.M)
    _, _, columns = load(name)
    rows = rows[:len(columns)]
    assert len(rows) == len(columns), (name, len(rows))
    path = folder / f"{name}-ranges.csv"
    path.write_text("feature,min,max\n" + "".join(
        f"{column},{low},{high}\n" for column, (low, high) in zip(columns, rows)))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default=default_out("dp_small_sites"))
    args = parser.parse_args()
    records = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, sites in DATA.items():
            ranges = documented_ranges(name, Path(tmp))
            for seed in args.seeds:
                configs = write_sites(name, sites, seed, Path(tmp))
                rows = sum(1 for c in configs for _ in open(c["data-path"])) - len(configs)
                cells = [("none", "auto", None, {})] + [
                    (eps, scaling, clip, {"dp-epsilon": eps, "dp-seeded-noise": True, "dp-clip": clip,
                                          **({"feature-ranges": str(ranges)} if scaling == "ranges" else {})})
                    for eps in EPSILONS for scaling, clip in CELLS]
                for eps, scaling, clip, extra in cells:
                    out = Path(tmp) / f"{name}-{seed}-{eps}-{scaling}-{clip}"
                    outcome = run(configs, scaling, seed, out, extra)
                    records.append({"data": name, "sites": sites, "train_rows": rows, "seed": seed,
                                    "epsilon": eps, "scaling": scaling, "dp_clip": clip, **outcome})
                    print(f"{name} seed {seed} eps {eps} {scaling:<6} clip {clip} h_G val "
                          f"{outcome['gems_val']:.3f} test {outcome['gems']:.3f} good enough on "
                          f"{outcome['good_enough']}/{outcome['sites']} "
                          f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    print("\n| data | epsilon | scaling | dp-clip | h_G val | h_G test (mean ± sd) | good enough (sites) |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for name in DATA:
        for eps in ("none", *EPSILONS):
            for scaling, clip in ((("auto", None),) if eps == "none" else CELLS):
                rows = [r for r in records if r["data"] == name and r["epsilon"] == eps
                        and r["scaling"] == scaling and r["dp_clip"] == clip]
                acc = [r["gems"] for r in rows]
                label = "federated (no DP)" if eps == "none" else scaling
                print(f"| {name} | {eps if eps == 'none' else f'{eps:g}'} | {label} | "
                      f"{'-' if clip is None else f'{clip:g}'} | "
                      f"{statistics.mean(r['gems_val'] for r in rows):.3f} | "
                      f"{statistics.mean(acc):.3f} ± {statistics.pstdev(acc):.3f} | "
                      f"{sum(r['good_enough'] for r in rows)}/{sum(r['sites'] for r in rows)} |")
    write_envelope("dp_small_sites", args.out, records, seeds=args.seeds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
