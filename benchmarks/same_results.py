"""Does a refactor change any result? Each model's run at the same seed, through the real
ServerApp and ClientApp over the in-process Grid, from the code of a given checkout: the
saved model's SHA-256 and the results' comparison rows, node table and verification.

    python3 benchmarks/same_results.py --code /path/to/old/checkout --out before.json
    python3 benchmarks/same_results.py --compare before.json

Fashion-MNIST, 5 sites, the default division (or `--label-division`) and every setting at
its default but the model (and `baselines='cheap'`). `--compare` exits 1 unless every
model's record matches the earlier file's (the seconds aside). Prints a table and writes JSON
(results/benchmarks/same_results.json).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, print_table, write_envelope
from inprocess_run import run_apps

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--models", "logistic", "kernel"]]
MODELS = ("logistic", "random-features", "kernel", "mlp")
#: what must be the same, besides the model file: JSON of these parts of results.json
COMPARED = ("rows", "nodes", "verification", "intersection")


def run_one(code: Path, model: str, dataset: str, nodes: int, division: str | None = None) -> dict:
    from gems_fl.running.run_config import app_config

    out = tempfile.mkdtemp(prefix="same-results-")
    cfg = {**app_config(code), "dataset": dataset, "model": model, "baselines": "cheap",
           "output-dir": out, **({"label-division": division} if division else {})}
    results, _, wall = run_apps(cfg, nodes)
    model_file = next(Path(out).rglob("gems_model.npz"))
    record = {"model": model, "model_sha256": hashlib.sha256(model_file.read_bytes()).hexdigest(),
              "test_accuracy": results["rows"]["GEMS"]["accuracy"], "wall_s": round(wall, 1)}
    for part in COMPARED:
        text = json.dumps(results.get(part), sort_keys=True, default=str)
        record[f"{part}_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    return record


def differences(records: list[dict], earlier: list[dict]) -> list[str]:
    before = {r["model"]: r for r in earlier}
    return [f"{r['model']}: {key} differs" for r in records if r["model"] in before
            for key in r if key.endswith("sha256") and r[key] != before[r["model"]].get(key)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", default=str(ROOT), help="the checkout whose code runs")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--label-division", default=None,
                        help="the run's label-division (default: the app's, 'paper', K in 2, 3, 5)")
    parser.add_argument("--compare", default=None, help="an earlier output of this script")
    parser.add_argument("--out", default=default_out("same_results"))
    args = parser.parse_args()
    code = Path(args.code).resolve()
    sys.path.insert(0, str(code))  # before gems_fl and client_app are first imported
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=code,
                            capture_output=True, text=True, check=False).stdout.strip()
    records = []
    for model in args.models:
        print(f"{model} on {args.dataset}, {args.nodes} sites, code at {commit} ...", flush=True)
        records.append({"code_commit": commit, **run_one(code, model, args.dataset, args.nodes,
                                                         args.label_division)})
    print_table(["model", "model file", "test acc", "s"],
                [[r["model"], r["model_sha256"][:16], f"{r['test_accuracy']:.4f}", r["wall_s"]]
                 for r in records])
    write_envelope("same_results", args.out, records)
    if args.compare:
        wrong = differences(records, json.loads(Path(args.compare).read_text())["records"])
        print("\n".join(wrong) if wrong else f"the same as {args.compare}: every model file "
              "and every compared part of the results")
        sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
