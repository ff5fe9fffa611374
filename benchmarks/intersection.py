"""Benchmark: find_intersection on logistic-regression-sized spaces (gems_fl.geometry.intersect).

    python benchmarks/intersection.py                 # 5 repeats per case
    python benchmarks/intersection.py --repeats 9

Prints a table and writes benchmarks/out/intersection.json.

Cases, d = 7850 (MNIST logistic regression: 10 x (784 + 1)), K nodes:

- "tight node": K = 5 ellipsoids (relative axes U(0.05, 1)) around a common point x;
  node 0's center is x + N(0, 0.01^2), the others x + N(0, 0.3^2), each radius 1.05 x
  the axis-scaled distance from its center to x. x is a common point, but the mean of
  the centers is not in node 0's space, so Dykstra has to move it. Target: <= 1 s
  (what tests/test_intersect.py used to assert).
- the same with balls (axes 1), and with K = 20;
- "near-tangent": two balls 2 apart with radii 0.5 + 1e-4 and 1.5: an intersection
  1e-4 thin, thinner than the first attempt's shrink (the retry path);
- "disjoint": K = 5 balls of radius 1 around centers 10 apart, no common point: the
  emptiness certificate, then the "min-penalty" fallback.
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

from gems_fl.geometry.intersect import find_intersection
from gems_fl.geometry.spaces import Space

OUT = Path(__file__).resolve().parent / "out"

D = 7850
TARGETS = {"tight node, K=5, ellipsoids": 1.0}


def tight_node(num_nodes: int, ellipsoids: bool, seed: int = 0) -> list[Space]:
    """Spaces sharing the point x, one of them too tight for the mean of the centers."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=D)
    spaces = []
    for k in range(num_nodes):
        center = x + rng.normal(size=D) * (0.01 if k == 0 else 0.3)
        axes = rng.uniform(0.05, 1.0, size=D) if ellipsoids else np.ones(D)
        radius = np.linalg.norm((center - x) / axes) * 1.05
        spaces.append(Space(center, radius, axes if ellipsoids else None))
    mean = np.mean([s.center for s in spaces], axis=0)
    assert not all(s.contains(mean) for s in spaces), "the mean must not be a common point"
    return spaces


def near_tangent(gap: float = 1e-4, seed: int = 0) -> list[Space]:
    """Two balls whose intersection is ``gap`` thin along the line of their centers."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=D)
    u = rng.normal(size=D)
    u /= np.linalg.norm(u)
    return [Space(base, 0.5 + gap), Space(base + 2.0 * u, 1.5)]


def disjoint(num_nodes: int, seed: int = 0) -> list[Space]:
    """Unit balls whose centers are 10 apart along distinct axes: no common point."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=D)
    return [Space(base + 10.0 / np.sqrt(2) * np.eye(1, D, k).ravel(), 1.0)
            for k in range(num_nodes)]


CASES = {
    "tight node, K=5, ellipsoids": lambda: tight_node(5, ellipsoids=True),
    "tight node, K=5, balls": lambda: tight_node(5, ellipsoids=False),
    "tight node, K=20, ellipsoids": lambda: tight_node(20, ellipsoids=True),
    "near-tangent, K=2, balls": near_tangent,
    "disjoint, K=5, balls": lambda: disjoint(5),
}


def run_case(name: str, repeats: int) -> dict:
    spaces = CASES[name]()
    times, res = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = find_intersection(spaces)
        times.append(time.perf_counter() - t0)
    assert res is not None
    median = statistics.median(times)
    target = TARGETS.get(name)
    return {
        "case": name,
        "K": len(spaces),
        "d": D,
        "seconds": times,
        "median_s": median,
        "target_s": target,
        "meets_target": None if target is None else bool(median <= target),
        "result": res.to_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    load_before = os.getloadavg()
    rows = [run_case(name, args.repeats) for name in CASES]
    report = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
        },
        "repeats": args.repeats,
        "cases": rows,
    }

    load_after = report["machine"]["loadavg_after"]
    table = Table(
        title=f"find_intersection, d={D}, median of {args.repeats} "
        f"(load avg {load_before[0]:.2f} -> {load_after[0]:.2f})"
    )
    for col in ("case", "median s", "found", "method", "iterations", "objective", "target"):
        table.add_column(col, justify="right")
    for row in rows:
        r = row["result"]
        target = "" if row["target_s"] is None else (
            f"<= {row['target_s']:g} s " + ("ok" if row["meets_target"] else "MISSED")
        )
        table.add_row(row["case"], f"{row['median_s']:.3f}", str(r["found"]), r["method"],
                      str(r["iterations"]), f"{r['objective']:.3g}", target)
    console = Console(width=200)
    console.print(table)
    OUT.mkdir(exist_ok=True)
    path = OUT / "intersection.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written: {path}")


if __name__ == "__main__":
    main()
