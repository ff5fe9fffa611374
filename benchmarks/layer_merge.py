"""Benchmark: server-side merge of one hidden layer (gems_fl.geometry.layer_merge.merge_layer).

    python benchmarks/layer_merge.py                 # the run's defaults, 3 repeats
    python benchmarks/layer_merge.py --repeats 5 --growth --dykstra-upto 10

Prints a table and writes results/benchmarks/layer_merge.json, with the machine and its load
(cores, load average before and after, torch threads).

Default case: the real first hidden layer of a default MLP run on Fashion-MNIST
(``Settings(dataset='fashion-mnist', model='mlp')``): K = 5 nodes of the 'paper'
division, each replying what ``hidden_layer_spaces`` computes (784-50-10 MLP trained with
the run's defaults, per-neuron radii with ``eps-neuron`` 0.1, ``neuron-delta`` 0.01,
p = 500). The neurons are computed once and kept in
benchmarks/out/layer_merge_neurons.npz (``--refresh`` recomputes them). The merge is
called exactly as the server calls it: ``merge_layer(neurons, num_clusters=clusters
(75), seed=seed)``, library-default k-means threads, inside ``compute_threads()`` (the
thread policy of gems_fl.learning.threads).

Floor: the k-means step alone, ``KMeans(n_clusters=min(75, n), random_state=seed,
n_init=1)`` on the same centers (the first step of the algorithm, which the merge
cannot skip); "ratio" is merge / floor, so 1.0 means the greedy pass is free.

``--growth`` adds synthetic layers of 10, 20, 50 and 100 nodes x 50 neurons (d = 785) with
the same defaults (75 clusters):

- 100 prototype neurons shared by all nodes, entries N(0, 0.05^2) (the scale of a
  trained 784-input layer, ~1/sqrt(784));
- each node's neuron is, with probability 0.6, a random prototype plus N(0, 0.01^2)
  noise per entry, otherwise a fresh N(0, 0.05^2) neuron of its own;
- radii 0.01 * sqrt(d) * U(0.5, 1.2).

Targets: 5 nodes <= 1 s, 100 nodes <= 10 s (median wall time of merge_layer, k-means
included). ``--dykstra-upto`` also times method="dykstra" (find_intersection for every
candidate test) on the small cases as the reference it replaces.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from sklearn.cluster import KMeans

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

from gems_fl.geometry.layer_merge import merge_layer
from gems_fl.learning.threads import compute_threads
from gems_fl.settings import Settings

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--repeats", "1"]]

OUT = Path(__file__).resolve().parent / "out"
DEFAULTS = Settings(dataset="fashion-mnist", model="mlp")
REAL_NODES = 5
NEURON_CACHE = OUT / "layer_merge_neurons.npz"

D = 785
NEURONS = DEFAULTS.hidden_widths[0]
PROTOTYPES = 100
SHARE = 0.6
PROTO_STD = 0.05
NOISE_STD = 0.01
RADIUS_RANGE = (0.5, 1.2)

TARGETS = {5: 1.0, 100: 10.0}


def real_layer(refresh: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first hidden layer's neuron balls of K = 5 default nodes (cached on disk)."""
    if NEURON_CACHE.exists() and not refresh:
        stored = np.load(NEURON_CACHE)
        return [(stored[f"centers{k}"], stored[f"radii{k}"]) for k in range(REAL_NODES)]
    from gems_fl.data import load_dataset, node_data, parse_division
    from gems_fl.data.nodes import node_seed
    from gems_fl.protocol.node_layerwise import hidden_layer_spaces, round_seed
    from gems_fl.settings.options import node_work

    splits = load_dataset(DEFAULTS.dataset, seed=DEFAULTS.seed)
    division = parse_division(DEFAULTS.label_division, REAL_NODES, splits.num_classes)
    nodes = []
    for k in range(REAL_NODES):
        x_tr, y_tr, x_val, y_val = node_data(splits, division, k, DEFAULTS.seed)
        seed = round_seed(node_seed(DEFAULTS.seed, k), 1)
        with compute_threads():
            spaces = hidden_layer_spaces(x_tr, y_tr, x_val, y_val, splits.num_classes,
                                         node_work(DEFAULTS), [], seed)
        nodes.append((np.c_[spaces.weight, spaces.bias], np.asarray(spaces.radius)))
    OUT.mkdir(exist_ok=True)
    np.savez(NEURON_CACHE, **{f"centers{k}": c for k, (c, _) in enumerate(nodes)},
             **{f"radii{k}": r for k, (_, r) in enumerate(nodes)})
    return nodes


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


def _kmeans_floor(nodes, m_eps: int) -> float:
    c = np.concatenate([np.asarray(centers, dtype=np.float64) for centers, _ in nodes])
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        KMeans(n_clusters=min(m_eps, len(c)), random_state=DEFAULTS.seed, n_init=1).fit(c)
    return time.perf_counter() - t0


def run_case(name: str, nodes, repeats: int, method: str) -> dict:
    m_eps = DEFAULTS.clusters
    times, kmeans, greedy, floors = [], [], [], []
    res = None
    with compute_threads() as threads:
        for _ in range(repeats):  # interleaved: a change of load hits merge and floor alike
            floors.append(_kmeans_floor(nodes, m_eps))
            t0 = time.perf_counter()
            if method == "dual":  # exactly the server's call
                res = merge_layer(nodes, num_clusters=m_eps, seed=DEFAULTS.seed)
            else:
                res = merge_layer(nodes, num_clusters=m_eps, seed=DEFAULTS.seed, method=method)
            times.append(time.perf_counter() - t0)
            kmeans.append(res.seconds["kmeans"])
            greedy.append(res.seconds["greedy"])
    assert res is not None
    target = TARGETS.get(len(nodes)) if method == "dual" else None
    median = statistics.median(times)
    floor = statistics.median(floors)
    return {
        "case": name,
        "nodes": len(nodes),
        "neurons": sum(len(r) for _, r in nodes),
        "d": int(np.shape(nodes[0][0])[1]),
        "m_eps": m_eps,
        "method": method,
        "policy_threads": threads,
        "seconds": times,
        "median_s": median,
        "median_kmeans_s": statistics.median(kmeans),
        "median_greedy_s": statistics.median(greedy),
        "floor_kmeans_s": floor,
        "ratio": median / floor,
        "target_s": target,
        "meets_target": None if target is None else bool(median <= target),
        "result": res.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--growth", action="store_true",
                        help="also synthetic layers of 10, 20, 50 and 100 nodes")
    parser.add_argument("--refresh", action="store_true",
                        help="recompute the real neurons instead of loading them")
    parser.add_argument(
        "--dykstra-upto",
        type=int,
        default=0,
        help="also time method='dykstra' for cases with at most this many nodes",
    )
    parser.add_argument("--out", default=default_out("layer_merge"))
    args = parser.parse_args()

    load_before = [round(v, 2) for v in os.getloadavg()]
    cases = [(f"real, Fashion-MNIST K={REAL_NODES}", real_layer(args.refresh))]
    if args.growth:
        cases += [(f"synthetic K={k}", make_layer(k)) for k in (10, 20, 50, 100)]
    rows = []
    for name, nodes in cases:
        rows.append(run_case(name, nodes, args.repeats, "dual"))
        if len(nodes) <= args.dykstra_upto:
            rows.append(run_case(name, nodes, args.repeats, "dykstra"))
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "torch_threads_at_start": torch.get_num_threads(),
            "loadavg_before": load_before,
            "loadavg_after": [round(v, 2) for v in os.getloadavg()],
        },
        "settings": {"clusters": DEFAULTS.clusters, "seed": DEFAULTS.seed,
                     "hidden": DEFAULTS.hidden, "eps_neuron": DEFAULTS.eps_neuron,
                     "neuron_delta": DEFAULTS.neuron_delta},
        "synthetic": {
            "d": D, "neurons_per_node": NEURONS, "prototypes": PROTOTYPES,
            "share": SHARE, "proto_std": PROTO_STD, "noise_std": NOISE_STD,
            "radius": f"{NOISE_STD} * sqrt(d) * U{RADIUS_RANGE}",
        },
        "repeats": args.repeats,
        "cases": rows,
    }

    m = report["machine"]
    console = Console(width=200)
    console.print(f"machine: {m['platform']}, {m['cpu_count']} cores, torch threads "
                  f"{m['torch_threads_at_start']} at start, {rows[0]['policy_threads']} under "
                  f"the policy; load average {m['loadavg_before']} before, "
                  f"{m['loadavg_after']} after")
    table = Table(
        title=f"merge_layer as the server calls it ({DEFAULTS.clusters} clusters), median of "
        f"{args.repeats}; floor = k-means alone"
    )
    for col in ("case", "nodes x H", "method", "median s", "floor s", "ratio", "k-means s",
                "greedy s", "width H'", "merged groups", "neurons merged", "kept alone",
                "largest", "find_int. calls", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        r = row["result"]
        target = "" if row["target_s"] is None else (
            f"<= {row['target_s']:g} s " + ("ok" if row["meets_target"] else "MISSED")
        )
        table.add_row(
            row["case"], f"{row['nodes']} x {row['neurons'] // row['nodes']}", row["method"],
            f"{row['median_s']:.3f}", f"{row['floor_kmeans_s']:.3f}", f"{row['ratio']:.2f}",
            f"{row['median_kmeans_s']:.3f}",
            f"{row['median_greedy_s']:.3f}", str(r["width"]),
            str(r["num_intersected_groups"]), str(r["neurons_merged"]),
            str(r["num_kept_alone"]), str(r["largest_group"]),
            str(r["intersection_calls"]), target,
        )
    console.print(table)
    path = write_envelope("layer_merge", args.out, report)
    console.print(f"written: {path}")


if __name__ == "__main__":
    main()
