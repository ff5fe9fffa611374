"""Can the public sample tell GEMS tuned from a fresh model trained to convergence?

    cd results/reproduction/study1-k5-tune-fresh && python3 run.py   # writes out/
    python3 benchmarks/tuned_vs_fresh.py results/reproduction/study1-k5-tune-fresh/out

For every logistic trial of a reproduction output folder (its ``trials/`` and the
``gems_model.npz`` of each run), the server's public sample is drawn again as the run drew
it and two models are compared, on the public sample and on the test set:

- **tuned**: ``h_G`` tuned with the run's recipe (``tune-stop=holdout``, ``tune-layers``);
- **fresh**: Raw's start trained until convergence (Raw converged's recipe).

``single 20 %`` is the comparison ``tune-fresh`` makes: held-out (accuracy, loss) on the
20 % the tuning held out, the tuned model's score being its best over the epochs and
shrink factors it tried. ``nested 5-fold`` repeats each whole recipe on 4/5 of the
sample and scores it on the rest, five times, so each model is scored once on all 1000
rows (counts of correct rows). ``test`` is each model trained on the whole sample, as the
run's rows are (GEMS tuned with ``tune-fresh=false``, Raw converged). Writes JSON
(``--out``, default ``benchmarks/out/tuned_vs_fresh.json``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from gems_fl.data import FeatureOptions, load_dataset
from gems_fl.evaluation.baselines import raw_start
from gems_fl.evaluation.server_data import draw_public_sample
from gems_fl.learning.models import build_model
from gems_fl.learning.train import (
    accuracy,
    as_tensors,
    converged_holdout_score,
    heldout_score,
)
from gems_fl.settings import Settings

FOLDS = 5


def compare(trial: dict, model_file: Path) -> dict:
    settings = Settings.from_run_config(trial["run_config"])
    seed = settings.seed
    splits = load_dataset(settings.dataset, seed=seed, data_dir=settings.data_dir or None,
                          features=FeatureOptions.from_settings(settings))
    px, py = draw_public_sample(splits.public_x, splits.public_y, settings.public_samples, seed)
    weights = np.load(model_file)
    gems = build_model("logistic", px.shape[1], splits.num_classes, [], 0.0)
    gems.load_state_dict({k: torch.as_tensor(weights[k]) for k in ("weight", "bias")})
    tune, local = settings.tune_recipe, settings.local_recipe
    fresh = lambda: raw_start(settings, px.shape[1], splits.num_classes)

    def tuned_on(x: np.ndarray, y: np.ndarray):
        model = copy.deepcopy(gems)
        report = tune.tune_trained(model, x, y, seed, settings.tune_layers)
        return model, report

    def fresh_on(x: np.ndarray, y: np.ndarray):
        model = fresh()
        local.train(model, x, y, seed)
        return model

    tuned, report = tuned_on(px, py)
    single_fresh = converged_holdout_score(
        fresh(), px, py, holdout_fraction=tune.holdout_fraction, lr=local.lr,
        batch_size=local.batch_size, max_epochs=local.max_epochs, patience=local.patience,
        seed=seed)
    nested = {"tuned": 0, "fresh": 0}
    folds = np.array_split(np.random.default_rng(seed + 17).permutation(len(py)), FOLDS)
    for fold in folds:
        keep = np.setdiff1d(np.arange(len(py)), fold)
        held = as_tensors(px[fold], py[fold])
        nested["tuned"] += round(heldout_score(tuned_on(px[keep], py[keep])[0], *held)[0] * len(fold))
        nested["fresh"] += round(heldout_score(fresh_on(px[keep], py[keep]), *held)[0] * len(fold))
    return {"labels": trial["labels"], "seed": seed,
            "single_20pct": {"tuned": report.holdout_score, "fresh": single_fresh},
            "nested_5fold_correct": nested, "public_rows": len(py),
            "test": {"tuned": accuracy(tuned, splits.test_x, splits.test_y),
                     "fresh": accuracy(fresh_on(px, py), splits.test_x, splits.test_y)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a reproduction output folder (trials/, runs/)")
    parser.add_argument("--space", default="ellipsoid",
                        help="compare the trials of this space only (ball and ellipsoid give "
                             "the same h_G in the paper's cells)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "tuned_vs_fresh.json")
    args = parser.parse_args()
    rows = []
    print("| seed | single 20 %: tuned | fresh | nested 5-fold correct: tuned | fresh | "
          "test: tuned | fresh |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in sorted((args.folder / "trials").glob("*.json")):
        trial = json.loads(path.read_text())
        if trial.get("kind") != "gems" or trial["labels"].get("model") != "logistic" \
                or trial["labels"].get("space") != args.space:
            continue
        model_file = next((args.folder / "runs" / path.stem).glob("run-*/gems_model.npz"), None)
        if model_file is None:
            print(f"{path.stem}: no gems_model.npz under runs/{path.stem}; skipped", file=sys.stderr)
            continue
        row = compare(trial, model_file)
        rows.append(row)
        s, n, t = row["single_20pct"], row["nested_5fold_correct"], row["test"]
        print(f"| {row['seed']} | {s['tuned'][0]:.3f} (loss {-s['tuned'][1]:.3f}) | "
              f"{s['fresh'][0]:.3f} (loss {-s['fresh'][1]:.3f}) | {n['tuned']} | {n['fresh']} | "
              f"{t['tuned']:.4f} | {t['fresh']:.4f} |", flush=True)
    rows.sort(key=lambda r: r["seed"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"folder": str(args.folder), "runs": rows}, indent=2) + "\n")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
