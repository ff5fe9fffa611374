"""Which ``dp-clip``: the pooled validation accuracy of the DP point for each row clip.

    python3 benchmarks/dp_clip.py --seeds 0 1 --epsilons 1 8

Offline, on Fashion-MNIST's paper K=5 division: every node forms its release as a run
does (:func:`gems_fl.geometry.dp.noised_statistics`: rows clipped, sums, calibrated
Gaussian noise from a seeded generator), the releases are summed, and the candidates a DP
run's selection round scores are solved from the sums: the pooled ridge point for each of
``DP_POOLED_RIDGES`` and the LDA point for each of ``LDA_SHRINKAGES``. The candidate with
the best pooled validation accuracy (the nodes' validation splits) is kept, as the run
keeps it; its test accuracy is printed beside, and chose nothing. The clip with the best
mean validation accuracy is the one to default to. Writes JSON (``--out``, default
``results/benchmarks/dp_clip.json``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--seeds", "0", "--epsilons", "8", "--clips", "5"]]

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.geometry.choices import DP_POOLED_RIDGES, LDA_SHRINKAGES
from gems_fl.geometry.dp import DPSpec, noised_statistics
from gems_fl.geometry.gram import unpack_triangle
from gems_fl.geometry.pooled import pooled_lda, pooled_point


def _accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    return float(((x @ w[:, :-1].T + w[:, -1]).argmax(axis=1) == y).mean())


def trial(seed: int, epsilon: float, clip: float, nodes: list, splits) -> dict:
    rng = np.random.default_rng([seed, 104_729])
    spec = DPSpec(epsilon, 1e-5, clip)
    size = splits.num_features + 1
    gram, moments, rows = 0.0, 0.0, 0
    for x, y, _, _ in nodes:
        release = noised_statistics(x, y, splits.num_classes, spec, rng)
        gram = gram + unpack_triangle(release["gram"], size)
        moments, rows = moments + release["moments"], rows + len(y)
    gram, moments = gram / rows, moments / rows
    x_val = np.vstack([n[2] for n in nodes])
    y_val = np.concatenate([n[3] for n in nodes])
    candidates = [("pooled", r, pooled_point([gram], [moments], [1.0], r)) for r in DP_POOLED_RIDGES]
    candidates += [("lda", s, pooled_lda([gram], [moments], [1.0], s)) for s in LDA_SHRINKAGES]
    scored = [(_accuracy(w, x_val, y_val), kind, reg, w) for kind, reg, w in candidates]
    val, kind, reg, w = max(scored, key=lambda t: t[0])
    return {"seed": seed, "epsilon": epsilon, "clip": clip, "val": val, "point": kind,
            "regularisation": reg, "test": _accuracy(w, splits.test_x, splits.test_y)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 8.0])
    parser.add_argument("--clips", type=float, nargs="+", default=[1, 2, 3, 5, 10, 15])
    parser.add_argument("--out", default=default_out("dp_clip"))
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        splits = load_dataset("fashion-mnist", seed=seed)
        division = parse_division("paper", 5, splits.num_classes)
        nodes = [node_data(splits, division, k, seed) for k in range(5)]
        for eps in args.epsilons:
            for clip in args.clips:
                runs.append(trial(seed, eps, clip, nodes, splits))
                r = runs[-1]
                print(f"seed {seed} epsilon {eps:g} clip {clip:g}: val {r['val']:.4f} test "
                      f"{r['test']:.4f} ({r['point']} {r['regularisation']:g})", flush=True)
    print("\n| epsilon | clip | validation (mean) | test (mean) |")
    print("| ---: | ---: | ---: | ---: |")
    summary = []
    for eps in args.epsilons:
        for clip in args.clips:
            rs = [r for r in runs if r["epsilon"] == eps and r["clip"] == clip]
            row = {"epsilon": eps, "clip": clip, "val": float(np.mean([r["val"] for r in rs])),
                   "test": float(np.mean([r["test"] for r in rs]))}
            summary.append(row)
            print(f"| {eps:g} | {clip:g} | {row['val']:.4f} | {row['test']:.4f} |")
    write_envelope("dp_clip", args.out, {"runs": runs, "summary": summary}, seeds=args.seeds)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
