"""Benchmark: radius search vs one bare matmul of the same shape, and end-to-end runs.

    python benchmarks/radius_search.py            # radius search on Fashion-MNIST
    python benchmarks/radius_search.py --e2e      # plus wall time of two `gems-fl run`s

Prints a table and writes benchmarks/out/radius_search.json. The search uses a logistic model
trained on 10000 training images and the first N = 1000 validation images;
d = 785 x 10, p = 500, delta = 0.01, R_max = 4000. The "bare matmul" is the product
Xa @ U^T of the same shape and dtype (float64) that the search performs once.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from gems_fl.data import load_dataset
from gems_fl.geometry.fisher import diagonal_fisher, fisher_axes
from gems_fl.learning.models import build_model, model_to_vector
from gems_fl.geometry.radius import augment, sample_directions, search_radius
from gems_fl.learning.train import train_until_converged

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parents[1]


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def radius_benchmark(repeats: int, eps: float) -> dict:
    splits = load_dataset("fashion-mnist", seed=0)
    x_tr, y_tr = splits.train_x[:10_000], splits.train_y[:10_000]
    x_val, y_val = splits.val_x[:1000], splits.val_y[:1000]
    torch.manual_seed(0)
    model = build_model("logistic", splits.num_features, splits.num_classes)
    train_until_converged(model, x_tr, y_tr, lr=1e-3, batch_size=32, max_epochs=30,
                          patience=3, seed=0)
    center = model_to_vector(model).reshape(splits.num_classes, splits.num_features + 1)
    p = 500
    kw = dict(eps=eps, num_directions=p, r_max=4000.0, delta=0.01, seed=1)
    axes = fisher_axes(diagonal_fisher(center, x_val), 0.1)

    xa = augment(x_val)
    u_t = sample_directions(p, center.shape, seed=1).reshape(-1, center.shape[1]).T.contiguous()
    result = search_radius(center, x_val, y_val, **kw)
    rows = {
        "bare matmul Xa @ U^T": _median_time(lambda: xa @ u_t, repeats),
        "radius search (ball)": _median_time(lambda: search_radius(center, x_val, y_val, **kw), repeats),
        "radius search (ellipsoid)": _median_time(
            lambda: search_radius(center, x_val, y_val, axes=axes, **kw), repeats),
    }
    return {
        "shape": {"N": len(y_val), "d": int(center.size), "p": p, "matmul": [len(y_val), center.shape[1], p * center.shape[0]]},
        "eps": eps, "radius": result.radius, "bisection_steps": result.steps,
        "seconds": rows,
        "ratio_ball": rows["radius search (ball)"] / rows["bare matmul Xa @ U^T"],
        "ratio_ellipsoid": rows["radius search (ellipsoid)"] / rows["bare matmul Xa @ U^T"],
        "torch_threads": torch.get_num_threads(),
    }


def e2e_benchmark() -> dict:
    from gems_fl.running.launch import run_app

    out = {}
    for name, cfg in {
        "default (digits, 5 nodes)": None,
        "fashion-mnist K=5": "dataset='fashion-mnist'",
    }.items():
        t0 = time.perf_counter()
        run_app(ROOT, num_nodes=5, run_config=cfg, output_dir=str(OUT / "e2e"))
        out[name] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eps", type=float, default=0.4)
    parser.add_argument("--e2e", action="store_true", help="also time two full `gems-fl run`s")
    args = parser.parse_args()
    report = {"machine": {"cpu_count": torch.get_num_threads(), "platform": platform.platform()},
              "radius": radius_benchmark(args.repeats, args.eps)}
    if args.e2e:
        report["end_to_end_s"] = e2e_benchmark()
    console = Console()
    table = Table(title=f"Radius search, Fashion-MNIST: N={report['radius']['shape']['N']}, "
                        f"d={report['radius']['shape']['d']}, p={report['radius']['shape']['p']}")
    table.add_column("what")
    table.add_column("median seconds", justify="right")
    table.add_column("x bare matmul", justify="right")
    base = report["radius"]["seconds"]["bare matmul Xa @ U^T"]
    for name, sec in report["radius"]["seconds"].items():
        table.add_row(name, f"{sec:.4f}", f"{sec / base:.2f}")
    for name, sec in report.get("end_to_end_s", {}).items():
        table.add_row(f"gems-fl run: {name}", f"{sec:.1f}", "")
    console.print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / "radius_search.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written: {OUT / 'radius_search.json'}")


if __name__ == "__main__":
    main()
