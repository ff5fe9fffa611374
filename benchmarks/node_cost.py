"""What one node's space costs at a large width: the build as a run does it.

    python3 benchmarks/node_cost.py --cases 50:4096 2000:2048 12000:4096

For each case ``ROWS:D``: ``ROWS`` Fashion-MNIST training rows (seed 0) and a quarter as
many validation rows, mapped to ``D`` random Fourier features (the run's map, bandwidth
6), a local model trained as a node trains it, then the node's Gram space built as
``model='random-features'`` builds it (``gram-rank`` auto: the float16 factor and the
residual diagonal; no class Gram matrices, as the run's plan sends none for this model).
Reported: the training time, the space's build time (Gram matrix, factor, whitening,
radius search, certified radius), and, for comparison, the eigendecomposition of the
node's ``(D + 1)``-square metric that the build ran before the factor form's whitening
(``gems_fl/geometry/whitening.py``) replaced it. Prints a table and writes JSON
(results/benchmarks/node_cost.json).
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

from envelope import print_table, write_envelope

#: the tiny run CI makes of this script (``python3 benchmarks/smoke.py``)
SMOKE = [["--cases", "50:256", "300:256"]]


def one_case(rows: int, dim: int) -> dict:
    import torch

    from gems_fl.data.datasets import load_dataset
    from gems_fl.data.random_features import RandomFeatures
    from gems_fl.geometry.gram import from_factor
    from gems_fl.geometry.kinds import build_layer_space
    from gems_fl.learning.models import model_to_vector
    from gems_fl.settings import Settings
    from gems_fl.settings.options import node_work

    splits = load_dataset("fashion-mnist", seed=0)
    rng = np.random.default_rng(0)
    train = rng.permutation(len(splits.train_y))[:rows]
    val = rng.permutation(len(splits.val_y))[:max(10, rows // 4)]
    features = RandomFeatures("fourier", splits.num_features, dim, 6.0, 0)
    x, xv = features.transform(splits.train_x[train]), features.transform(splits.val_x[val])
    y, yv = splits.train_y[train].astype(np.int64), splits.val_y[val].astype(np.int64)
    settings = Settings.from_run_config({"dataset": "fashion-mnist", "model": "random-features",
                                         "rf-dim": dim, "class-grams": "false"})
    work = node_work(settings)
    t0 = time.perf_counter()
    model = work.training.new_model(dim, 10)
    work.training.recipe.train(model, x, y, 0)
    trained = time.perf_counter()
    center = model_to_vector(model).reshape(10, dim + 1)
    layer = build_layer_space(center, (x, y), xv, yv, work.space, 0)
    built = time.perf_counter()
    before = None
    if layer.factor is not None:  # the step the whitening removed
        g = torch.as_tensor(from_factor(layer.factor, layer.residual), dtype=torch.float64)
        t = time.perf_counter()
        torch.linalg.eigh(g)
        before = round(time.perf_counter() - t, 2)
    return {"rows": rows, "dim": dim, "val_rows": len(val), "train_s": round(trained - t0, 2),
            "build_s": round(built - trained, 2), "eigh_removed_s": before,
            "factor_rank": None if layer.factor is None else int(layer.factor.shape[1]),
            "radius": float(layer.space.radius), "certified": float(layer.certified_radius)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=["50:4096", "2000:2048", "12000:4096"])
    parser.add_argument("--out", default=str(ROOT / "results" / "benchmarks" / "node_cost.json"))
    args = parser.parse_args()
    records = []
    for case in args.cases:
        rows, dim = (int(v) for v in case.split(":"))
        records.append(one_case(rows, dim))
        print(json.dumps(records[-1]), flush=True)
    print_table(["rows", "D", "train s", "space build s", "the eigh it no longer runs, s"],
                [[f"{r['rows']:,}", f"{r['dim']:,}", r["train_s"], r["build_s"],
                  r["eigh_removed_s"]] for r in records], right=5)
    write_envelope("node_cost", args.out, records)


if __name__ == "__main__":
    main()
