"""How long a user's own table takes, from one CSV to a scored model: the first hour.

    python3 benchmarks/own_table.py --rows 2000 60000

For each size, a seeded table like a user's (30 numeric columns, a category column of
3 values, an ID column, 5 text classes; scikit-learn's ``make_classification``) is
written as one CSV and rehearsed exactly as docs/own-data.md says, with the defaults:
``gems-fl run --table FILE --nodes 5`` (a held-out test.csv, the rest cut into 5
Dirichlet(0.5) sites, one real Flower simulation on them), then the saved model scored
on test.csv as ``gems-fl predict`` scores it. Records the command's wall time, the run's
own time split and the model's test accuracy, beside scikit-learn's logistic regression
on every site's rows pooled (the reference no federation reaches: the rows never meet). Prints a table and writes JSON
(results/benchmarks/own_table.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope

SMOKE = [["--rows", "400"]]


def write_table(path: Path, rows: int, seed: int) -> Path:
    """A user's table: numeric columns, a category column, an ID column, text labels."""
    import pandas as pd
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=rows, n_features=30, n_informative=12,
                               n_redundant=6, n_classes=5, n_clusters_per_class=2,
                               class_sep=1.0, random_state=seed)
    frame = pd.DataFrame(x * np.geomspace(0.1, 1000, 30), columns=[f"m{i}" for i in range(30)])
    frame.insert(0, "record_id", [f"R{i:06d}" for i in range(rows)])
    frame.insert(5, "plan", np.array(["basic", "plus", "premium"])[np.digitize(
        x[:, 0] + np.random.default_rng(seed).normal(0, 1, rows), [-0.5, 0.5])])
    frame["outcome"] = np.array(["a", "b", "c", "d", "e"])[y]
    frame.to_csv(path, index=False)
    return path


def rehearse(table: Path, out: Path, extra: list[str]) -> dict:
    """``gems-fl run --table`` then the saved model on test.csv; the record."""
    from gems_fl.api import load_model
    from gems_fl.data.scoring_rows import read_scoring_rows

    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", "--table",
                           str(table), "--nodes", "5", "--output-dir", str(out), *extra],
                          capture_output=True, text=True, cwd=out, check=False)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"gems-fl run --table exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    (path,) = out.glob("run-*/results.json")
    results = json.loads(path.read_text())
    model = load_model(path.parent)
    rows = read_scoring_rows(out / f"{table.stem}-sites" / "test.csv", model.feature_names,
                             model.num_features, categories=model.categories)
    accuracy = float(np.mean(model.predict(rows.x) == rows.labels))
    pooled = _pooled_logistic(out / f"{table.stem}-sites", rows)
    timing = results["timing_s"]
    spent = {f"{k}_s": round(float(timing[k]), 1) for k in
             ("wall", "startup", "identify", "rounds", "shutdown") if timing.get(k) is not None}
    return {"wall_s": round(wall, 1), **{("run_wall_s" if k == "wall_s" else k): v
                                         for k, v in spent.items()},
            "test_accuracy": round(accuracy, 4), "test_rows": int(len(rows.labels)),
            "pooled_logistic_test_accuracy": round(pooled, 4),
            "good_enough": results["good_enough"]["line"],
            "model": results["settings"]["model"]}


def _pooled_logistic(sites: Path, test) -> float:
    """The reference a user would ask for: scikit-learn's logistic regression on every
    site's rows pooled (what no federation may do), scaled, one-hot as the run encodes."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from gems_fl.data.site_files import complete_categories, read_site_file

    files = [read_site_file(p) for p in sorted(sites.glob("site-*.csv"))]
    complete_categories(files)
    x = np.concatenate([f.x["train"] for f in files])
    y = np.concatenate([f.y["train"] for f in files])
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(x, y)
    return float(clf.score(test.x, test.labels))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2000, 60000])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--run-config", default=None, help="passed to gems-fl run")
    parser.add_argument("--out", default=default_out("own_table"))
    args = parser.parse_args()
    extra = ["--run-config", args.run_config] if args.run_config else []
    records = []
    for rows in args.rows:
        with tempfile.TemporaryDirectory(prefix="gems-own-table-") as tmp:
            table = write_table(Path(tmp) / f"table-{rows}.csv", rows, args.seed)
            out = Path(tmp) / "out"
            out.mkdir()
            record = {"rows": rows, "columns": 33, **rehearse(table, out, extra)}
        records.append(record)
        print(json.dumps(record), flush=True)
    print_table(["rows", "wall s (gems-fl run --table)", "start-up s", "identify s", "rounds s",
                 "h_G test acc", "pooled logistic test acc", "good enough"],
                [[r["rows"], r["wall_s"], r["startup_s"], r["identify_s"], r["rounds_s"],
                  r["test_accuracy"], r["pooled_logistic_test_accuracy"], r["good_enough"]]
                 for r in records])
    write_envelope("own_table", args.out, records, seeds=[args.seed])


if __name__ == "__main__":
    main()
