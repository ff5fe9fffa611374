"""Benchmark: logit-space (Gram) good-enough spaces at Fashion-MNIST shapes.

    PYTHONPATH=. python benchmarks/gram.py                 # writes ./gram-benchmark.json
    PYTHONPATH=. python benchmarks/gram.py --out x.json --repeats 5 --threads 1

(a) Node side: the node's Gram matrix (10000 training rows) plus its radius search
    (1000 validation rows, p = 500, default delta and r_max), against its floor -- the
    bare float64 matmuls of the same shapes: ``Xa_tr^T Xa_tr`` (785 x 10000 x 785) and
    ``Xa_val @ D^T`` flat (1000 x 785 x 5000). Target: ratio <= 2.
(b) Server side: ``gram_center`` over 100 nodes at d + 1 = 785, C = 10. Target < 2 s.
(c) For information: ``minimax_gram_point`` over ``--minimax-nodes`` nodes.

Synthetic data, no network: Gaussian inputs with a low-dimensional latent structure
and 24 always-zero features (like Fashion-MNIST's blank border pixels, so the Gram
matrix is singular), labels from a noisy linear teacher, and a "trained-ish" layer
from ridge least squares on one-hot targets. Medians over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

from gems_fl.geometry.certify import certified_gram_radius
from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.gram_merge import gram_center, minimax_gram_point
from gems_fl.geometry.gram_search import DEFAULT_DELTA, DEFAULT_R_MAX, search_gram_radius
from gems_fl.geometry.linalg import augment

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--repeats", "1", "--nodes", "5", "--minimax-nodes", "3"]]

D, C, N_TRAIN, N_VAL, P = 784, 10, 10_000, 1000, 500


def _median_time(fn, repeats: int) -> float:
    return statistics.median(_times(fn, repeats))


def _times(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _interleaved(fns: dict, repeats: int) -> dict[str, list[float]]:
    """Each repetition runs every function once, back to back, so that a change in
    machine load hits the floor and the measured code alike."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name] += _times(fn, 1)
    return out


def synthetic_node(seed: int = 0):
    rng = np.random.default_rng(seed)
    latent, blank = 40, 24
    mix = rng.normal(size=(latent, D)) / np.sqrt(latent)
    teacher = rng.normal(size=(C, latent))

    def draw(num):
        z = rng.normal(size=(num, latent))
        x = z @ mix + 0.3 * rng.normal(size=(num, D))
        x[:, :blank] = 0.0
        y = (z @ teacher.T + 1.5 * rng.normal(size=(num, C))).argmax(1)
        return x, y

    x_tr, y_tr = draw(N_TRAIN)
    x_val, y_val = draw(N_VAL)
    xa = np.c_[x_tr, np.ones(N_TRAIN)]
    targets = np.eye(C)[y_tr] * 6.0 - 3.0
    center = np.linalg.solve(xa.T @ xa + 1.0 * np.eye(D + 1), xa.T @ targets).T
    return center, x_tr, x_val, y_val


def node_benchmark(repeats: int, eps_drop: float) -> dict:
    center, x_tr, x_val, y_val = synthetic_node()
    center_acc = float(((np.c_[x_val, np.ones(N_VAL)] @ center.T).argmax(1) == y_val).mean())
    eps = round(center_acc - eps_drop, 3)
    kw = {"eps": eps, "num_directions": P, "r_max": DEFAULT_R_MAX, "delta": DEFAULT_DELTA,
          "seed": 1}

    xa_tr, xa_val = augment(x_tr), augment(x_val)
    d_flat_t = torch.randn(P * C, D + 1, dtype=torch.float64).T.contiguous()
    g = gram_matrix(x_tr)
    result = search_gram_radius(center, g, x_val, y_val, **kw)

    def node_work():
        search_gram_radius(center, gram_matrix(x_tr), x_val, y_val, **kw)

    times = _interleaved({
        "floor: Xa_tr^T Xa_tr": lambda: xa_tr.T @ xa_tr,
        "floor: Xa_val @ D^T (flat)": lambda: xa_val @ d_flat_t,
        "gram_matrix": lambda: gram_matrix(x_tr),
        "search_gram_radius": lambda: search_gram_radius(center, g, x_val, y_val, **kw),
        "gram_matrix + search": node_work,
    }, repeats)
    rows = {name: statistics.median(t) for name, t in times.items()}
    floors = [a + b for a, b in zip(times["floor: Xa_tr^T Xa_tr"],
                                    times["floor: Xa_val @ D^T (flat)"])]
    floor = statistics.median(floors)
    per_repeat = [w / f for w, f in zip(times["gram_matrix + search"], floors)]
    cert = certified_gram_radius(center, g, x_val, y_val, eps, within_range=True)
    return {
        "shape": {"N_train": N_TRAIN, "N_val": N_VAL, "d+1": D + 1, "C": C, "p": P,
                  "delta": DEFAULT_DELTA, "r_max": DEFAULT_R_MAX},
        "center_accuracy": center_acc, "eps": eps, "radius": result.radius,
        "saturated": result.saturated, "bisection_steps": result.steps,
        "rank": result.rank, "certified_radius_within_range": cert,
        "seconds": rows, "floor_seconds": floor,
        "ratio": rows["gram_matrix + search"] / floor,
        "ratio_per_repeat": per_repeat,
    }


def synthetic_server(nodes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    base = gram_matrix(rng.normal(size=(2000, D)))
    grams, centers = [], []
    for _ in range(nodes):
        s = rng.uniform(0.5, 1.5, D + 1)
        s[-1] = 1.0
        grams.append(base * s[:, None] * s[None, :])
        centers.append(rng.normal(size=(C, D + 1)))
    counts = rng.integers(500, 5000, nodes).astype(float)
    return centers, grams, counts


def server_benchmark(repeats: int, nodes: int, minimax_nodes: int) -> dict:
    centers, grams, counts = synthetic_server(nodes)
    t_center = _median_time(lambda: gram_center(centers, grams, counts), repeats)
    k = minimax_nodes
    radii = np.full(k, 1.0)
    t0 = time.perf_counter()
    _, worst, info = minimax_gram_point(centers[:k], grams[:k], radii, return_info=True)
    t_minimax = time.perf_counter() - t0
    return {
        "nodes": nodes, "gram_center_seconds": t_center,
        "minimax": {"nodes": k, "seconds": t_minimax, "iterations": info["iterations"],
                    "converged": info["converged"], "max_scaled_distance": worst,
                    "lower_bound": info["lower_bound"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eps-drop", type=float, default=0.05,
                        help="eps = center accuracy minus this")
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--minimax-nodes", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(default_out("gram")))
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default). On a shared, loaded "
                             "machine 1 thread gives far steadier timings")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    load_before = os.getloadavg()
    report = {
        "machine": {"nproc": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "node": node_benchmark(args.repeats, args.eps_drop),
        "server": server_benchmark(args.repeats, args.nodes, args.minimax_nodes),
    }
    report["load"] = {"before": load_before, "after": os.getloadavg()}

    node, server = report["node"], report["server"]
    print(f"machine: nproc={os.cpu_count()} torch threads={torch.get_num_threads()} "
          f"load(1,5,15) before={load_before} after={report['load']['after']}")
    print(f"(a) node: N_train={N_TRAIN} N_val={N_VAL} d+1={D + 1} C={C} p={P} "
          f"delta={DEFAULT_DELTA} r_max={DEFAULT_R_MAX}")
    print(f"    center acc {node['center_accuracy']:.3f}, eps {node['eps']}, radius "
          f"{node['radius']:.4f} (saturated={node['saturated']}, steps="
          f"{node['bisection_steps']}, rank={node['rank']}), certified (in range) "
          f"{node['certified_radius_within_range']:.4f}")
    width = max(len(k) for k in node["seconds"]) + 2
    print(f"    {'what':<{width}}{'median s':>10}{'x floor':>10}")
    for name, sec in node["seconds"].items():
        print(f"    {name:<{width}}{sec:>10.4f}{sec / node['floor_seconds']:>10.2f}")
    print(f"    {'floor (sum of the two)':<{width}}{node['floor_seconds']:>10.4f}{1:>10.2f}")
    print(f"    ratio (gram + search) / floor = {node['ratio']:.2f}  (target <= 2); per "
          f"repetition: {', '.join(f'{r:.2f}' for r in node['ratio_per_repeat'])}")
    print(f"(b) server: gram_center over {server['nodes']} nodes: "
          f"{server['gram_center_seconds']:.3f} s (target < 2 s)")
    mm = server["minimax"]
    print(f"(c) minimax over {mm['nodes']} nodes: {mm['seconds']:.2f} s, "
          f"{mm['iterations']} iterations, converged={mm['converged']}, "
          f"max scaled distance {mm['max_scaled_distance']:.6g} "
          f"(lower bound {mm['lower_bound']:.6g})")
    write_envelope("gram", args.out, report)
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
