"""The gaussian point in the selection round: its candidates' pooled validation accuracy,
the point kept, h_G's test accuracy and the seconds its fits take, one in-process run per
division and seed (the real ServerApp and ClientApp over the in-process Grid).

    python3 benchmarks/gaussian_point.py --divisions paper:5 dirichlet:0.1:5 dirichlet:0.5:5 \
        dirichlet:0.05:20 --seeds 0

Fashion-MNIST and the run's defaults otherwise (``--set key=value`` for more). The
seconds are those spent in ``gaussian_points`` (every call of the run: the gaussian and,
where it is scored, the mixture point), on the cores the selection round gives them.
Prints a table and writes JSON (results/benchmarks/gaussian_point.json); run it from a
checkout of another commit to compare.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper:3"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--divisions", nargs="+", default=["paper:5"], help="label-division:K")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="more run settings over the app's defaults (model=kernel ...)")
    parser.add_argument("--out", default=default_out("gaussian_point"))
    args = parser.parse_args()
    from inprocess_run import run_apps
    from profile_run import _typed

    import gems_fl.geometry.virtual as virtual
    from tests.helpers import app_defaults

    spent = []
    real = virtual.gaussian_points

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent.append(time.perf_counter() - t0)

    virtual.gaussian_points = timed  # the points module imports it at each call
    overrides = _typed(dict(item.split("=", 1) for item in args.set), app_defaults())
    records = []
    for seed in args.seeds:
        for spec in args.divisions:
            division, k = spec.rsplit(":", 1)
            spent.clear()
            with tempfile.TemporaryDirectory() as tmp:
                cfg = {**app_defaults(), **overrides, "dataset": args.dataset,
                       "label-division": division, "seed": seed, "output-dir": tmp}
                results, _, wall = run_apps(cfg, int(k))
            table = next((r["candidates"] for r in reversed(results["rounds"])
                          if r.get("candidates")), [])  # the selection round's
            kept = results.get("intersection", {})
            record = {
                "division": spec, "seed": seed, "settings": overrides,
                "test_accuracy": results["rows"]["GEMS"]["accuracy"],
                "good_enough": results["verification"]["good_enough"], "sites": int(k),
                "kept": {"point": kept.get("method"), "gaussian_l2": kept.get("gaussian_l2")},
                "gaussian_val_accuracy": {str(c["gaussian_l2"]): c["val_accuracy"]
                                          for c in table if c["point"] == "gaussian"},
                "best_other_val_accuracy": max((c["val_accuracy"] for c in table
                                                if c["point"] != "gaussian"), default=None),
                "gaussian_seconds": round(sum(spent), 2), "gaussian_calls": len(spent),
                "wall_s": round(wall, 1)}
            records.append(record)
            print(json.dumps(record), flush=True)
    rows = [[r["division"], r["seed"], f"{r['test_accuracy']:.4f}",
             f"{r['good_enough']} of {r['sites']}",
             f"{r['kept']['point']}" + (f" {r['kept']['gaussian_l2']:g}"
                                        if r["kept"]["gaussian_l2"] is not None else ""),
             " / ".join(f"{v:.4f}" for v in r["gaussian_val_accuracy"].values()) or "-",
             "-" if r["best_other_val_accuracy"] is None else f"{r['best_other_val_accuracy']:.4f}",
             f"{r['gaussian_seconds']:.1f}", f"{r['wall_s']:.1f}"] for r in records]
    print_table(["division", "seed", "h_G test", "good enough", "kept",
                 "gaussian val (L2 1e-6 ... 1e-3)", "best other val", "gaussian s", "wall s"],
                rows, right=None)
    write_envelope("gaussian_point", args.out, records, seeds=args.seeds)


if __name__ == "__main__":
    main()
