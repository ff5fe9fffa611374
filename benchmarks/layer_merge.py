"""Benchmark: server-side merge of one hidden layer (gems_fl.geometry.layer_merge.merge_layer).

    python benchmarks/layer_merge.py                 # default cases, 3 repeats
    python benchmarks/layer_merge.py --repeats 5 --dykstra-upto 10

Prints a table and writes benchmarks/out/layer_merge.json.

Synthetic neurons, d = 785 (784 MNIST-size inputs + bias), 100 neurons per node:

- 100 prototype neurons shared by all nodes, entries N(0, 0.05^2) (the scale of a
  trained 784-input layer, ~1/sqrt(784));
- each node's neuron is, with probability 0.6, a random prototype plus N(0, 0.01^2)
  noise per entry, otherwise a fresh N(0, 0.05^2) neuron of its own;
- radii 0.01 * sqrt(d) * U(0.5, 1.2). Two noisy copies of one prototype lie about
  0.01 * sqrt(2 d) apart, so most such pairs overlap, while a group of g copies needs
  radii of about 0.01 * sqrt(d) * sqrt(1 - 1/g): groups of 2 to ~20 form and many
  neurons (the fresh ones, and copies with small radii) stay alone.

Cases: 5 nodes with m_eps = 75 (the paper's MNIST setting), then a growth series of 10,
20, 50 and 100 nodes with m_eps fixed at 150 (1.5 x the 100 neurons per node).
Targets: 5 x 100 <= 1 s, 100 x 100 <= 10 s (median wall time of merge_layer, k-means
included). Also times method="dykstra" (find_intersection for every candidate test)
on the small cases as the reference it replaces.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from gems_fl.geometry.layer_merge import merge_layer

OUT = Path(__file__).resolve().parent / "out"

D = 785
NEURONS = 100
PROTOTYPES = 100
SHARE = 0.6
PROTO_STD = 0.05
NOISE_STD = 0.01
RADIUS_RANGE = (0.5, 1.2)

TARGETS = {5: 1.0, 100: 10.0}


def make_layer(num_nodes: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """The synthetic per-node neuron balls described in the module docstring."""
    rng = np.random.default_rng(seed)
    protos = rng.normal(0.0, PROTO_STD, (PROTOTYPES, D))
    nodes = []
    for _ in range(num_nodes):
        shared = rng.random(NEURONS) < SHARE
        centers = rng.normal(0.0, PROTO_STD, (NEURONS, D))
        pick = rng.integers(0, PROTOTYPES, NEURONS)
        centers[shared] = protos[pick[shared]] + rng.normal(
            0.0, NOISE_STD, (int(shared.sum()), D)
        )
        radii = NOISE_STD * np.sqrt(D) * rng.uniform(*RADIUS_RANGE, NEURONS)
        nodes.append((centers, radii))
    return nodes


def run_case(
    num_nodes: int, m_eps: int, repeats: int, method: str, threads: int | None
) -> dict:
    nodes = make_layer(num_nodes)
    times, kmeans, greedy = [], [], []
    res = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = merge_layer(
            nodes, num_clusters=m_eps, seed=0, method=method, threads=threads
        )
        times.append(time.perf_counter() - t0)
        kmeans.append(res.seconds["kmeans"])
        greedy.append(res.seconds["greedy"])
    assert res is not None
    target = TARGETS.get(num_nodes) if method == "dual" else None
    median = statistics.median(times)
    return {
        "nodes": num_nodes,
        "neurons": num_nodes * NEURONS,
        "d": D,
        "m_eps": m_eps,
        "method": method,
        "kmeans_threads": threads,
        "seconds": times,
        "median_s": median,
        "median_kmeans_s": statistics.median(kmeans),
        "median_greedy_s": statistics.median(greedy),
        "target_s": target,
        "meets_target": None if target is None else bool(median <= target),
        "result": res.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="k-means threads passed to merge_layer (0: the libraries' default)",
    )
    parser.add_argument(
        "--dykstra-upto",
        type=int,
        default=5,
        help="also time method='dykstra' for cases with at most this many nodes",
    )
    args = parser.parse_args()

    cases = [(5, 75), (10, 150), (20, 150), (50, 150), (100, 150)]
    load_before = os.getloadavg()
    rows = []
    threads = args.threads or None
    for nodes, m_eps in cases:
        rows.append(run_case(nodes, m_eps, args.repeats, "dual", threads))
        if nodes <= args.dykstra_upto:
            rows.append(run_case(nodes, m_eps, args.repeats, "dykstra", threads))
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "data": {
            "d": D, "neurons_per_node": NEURONS, "prototypes": PROTOTYPES,
            "share": SHARE, "proto_std": PROTO_STD, "noise_std": NOISE_STD,
            "radius": f"{NOISE_STD} * sqrt(d) * U{RADIUS_RANGE}",
            "m_eps": "75 for 5 nodes; 150 (1.5 x neurons per node) for the growth "
            "series",
        },
        "repeats": args.repeats,
        "kmeans_threads": threads,
        "cases": rows,
    }

    load_after = report["machine"]["loadavg_after"]
    table = Table(
        title=f"merge_layer, d={D}, {NEURONS} neurons/node, median of {args.repeats} "
        f"(load avg {load_before[0]:.2f} -> {load_after[0]:.2f})"
    )
    for col in ("nodes x H", "m_eps", "method", "median s", "k-means s", "greedy s",
                "width H'", "merged groups", "neurons merged", "kept alone",
                "largest", "find_int. calls", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        r = row["result"]
        target = "" if row["target_s"] is None else (
            f"<= {row['target_s']:g} s " + ("ok" if row["meets_target"] else "MISSED")
        )
        table.add_row(
            f"{row['nodes']} x {NEURONS}", str(row["m_eps"]), row["method"],
            f"{row['median_s']:.2f}", f"{row['median_kmeans_s']:.2f}",
            f"{row['median_greedy_s']:.2f}", str(r["width"]),
            str(r["num_intersected_groups"]), str(r["neurons_merged"]),
            str(r["num_kept_alone"]), str(r["largest_group"]),
            str(r["intersection_calls"]), target,
        )
    console = Console(width=200)
    console.print(table)
    OUT.mkdir(exist_ok=True)
    path = OUT / "layer_merge.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written: {path}")


if __name__ == "__main__":
    main()
