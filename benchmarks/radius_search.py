"""Benchmark: radius search vs one bare matmul of the same shape, warm and inside a node.

    python benchmarks/radius_search.py                  # warm calls + the real node sequence
    python benchmarks/radius_search.py --real-repeats 15
    python benchmarks/radius_search.py --e2e            # plus wall time of two `gems-fl run`s

Prints tables and writes results/benchmarks/radius_search.json, with the machine and its load
(cores, load average before and after, torch threads).

Warm: a logistic model trained on 10000 Fashion-MNIST training images, searched on the
first N = 1000 validation images; d = 785 x 10, p = 500, delta = 0.01, R_max = 4000.

Real sequence, what ``gems_fl.protocol.node.build_local_space`` does: node 0 of the run's
defaults (``Settings()``: label division 'paper' with K = 5, so classes 0 and 1, about
10000 training and 1000 validation images) on Fashion-MNIST; a fresh logistic model
trained with the run's defaults (Adam lr 1e-3, batch 32, patience 3, at most 100 epochs),
then the Fisher axes and the ellipsoid search with the run's defaults (eps 0.4, p = 500,
delta 0.01), timed on its first call right after training, then the bare matmul on the
same threads. Three thread policies, in interleaved rounds:

- ``legacy``: training on 1 thread, then the search on all cores (torch's default), as
  the node ran before ``compute_threads`` wrapped both;
- ``policy-1``: training and search inside one ``compute_threads(1)`` (the default policy);
- ``per-call-1``: no block around the pair; training runs under train.py's own
  ``compute_threads()`` and the search under its own ``compute_threads(1)``, with torch's
  default count (all cores) restored in between;
- ``policy-all``: training and search inside one ``compute_threads(cores)``
  (``GEMS_FL_THREADS=all``).

The "bare matmul" is the product Xa @ U^T of the same shape and dtype (float64) that the
search performs once; it is the floor, and "ratio" is search / floor per run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

from gems_fl.data import load_dataset
from gems_fl.data.partition import node_data, parse_division
from gems_fl.geometry.fisher import diagonal_fisher, fisher_axes
from gems_fl.geometry.linalg import augment
from gems_fl.geometry.radius import sample_directions, search_radius
from gems_fl.learning.models import build_model, model_to_vector
from gems_fl.learning.threads import CORES, ENV_VAR, compute_threads
from gems_fl.learning.train import train_until_converged
from gems_fl.settings import Settings
from gems_fl.settings.options import space_options

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--repeats", "1", "--real-repeats", "1", "--policies", "policy-1"]]

OUT = Path(__file__).resolve().parent / "out"
ROOT = Path(__file__).resolve().parents[1]


def machine() -> dict:
    """The machine and its load right now."""
    return {
        "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_1_5_15": [round(v, 2) for v in os.getloadavg()],
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "torch_default_threads": CORES,
    }


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


POLICIES = ("legacy", "policy-1", "per-call-1", "policy-all")


def _node_sequence(policy: str, data: tuple, num_classes: int, settings: Settings, seed: int) -> dict:
    """Train, then search, then the bare matmul, under one thread policy; seconds of each."""
    x_tr, y_tr, x_val, y_val = data
    num_features = x_tr.shape[1]
    train_threads = CORES if policy == "policy-all" else 1
    search_threads = 1 if policy in ("policy-1", "per-call-1") else CORES
    # train.py's own compute_threads() reads the policy: make it the case's training count.
    os.environ[ENV_VAR] = str(train_threads)
    outer = CORES if policy == "per-call-1" else train_threads
    with compute_threads(outer):
        torch.manual_seed(seed)
        model = build_model("logistic", num_features, num_classes)
        t0 = time.perf_counter()
        report = train_until_converged(
            model, x_tr, y_tr, lr=settings.local_lr, batch_size=settings.batch_size,
            max_epochs=settings.local_max_epochs, patience=settings.local_patience, seed=seed)
        train_s = time.perf_counter() - t0
        with compute_threads(search_threads):  # no-op unless legacy/all switch counts
            t0 = time.perf_counter()
            center = model_to_vector(model).reshape(num_classes, num_features + 1)
            axes = fisher_axes(diagonal_fisher(center, x_val), settings.ellipsoid_c)
            result = search_radius(
                center, x_val, y_val, eps=settings.eps, num_directions=settings.num_directions,
                r_max=space_options(settings).bound, delta=settings.delta, seed=seed,
                axes=axes)
            search_s = time.perf_counter() - t0
            xa = augment(x_val)
            u_t = sample_directions(settings.num_directions, center.shape, seed=seed)
            u_t = u_t.reshape(-1, center.shape[1]).T.contiguous()
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                xa @ u_t
                times.append(time.perf_counter() - t0)
    os.environ.pop(ENV_VAR, None)
    return {"train_s": train_s, "epochs": report.epochs, "search_s": search_s,
            "matmul_first_s": times[0], "matmul_s": statistics.median(times),
            "ratio": search_s / statistics.median(times), "radius": result.radius,
            "steps": result.steps}


def real_benchmark(repeats: int, policies: tuple[str, ...] = POLICIES) -> dict:
    """The node's real sequence (see the module docstring), ``repeats`` rounds."""
    settings = Settings(dataset="fashion-mnist")
    splits = load_dataset("fashion-mnist", seed=settings.seed)
    division = parse_division(settings.label_division, 5, splits.num_classes)
    data = node_data(splits, division, 0, settings.seed)
    runs: dict[str, list[dict]] = {p: [] for p in policies}
    for rep in range(repeats):
        for policy in policies:
            runs[policy].append(_node_sequence(policy, data, splits.num_classes, settings, seed=rep))
    summary = {}
    for policy, rows in runs.items():
        search = [r["search_s"] for r in rows]
        ratio = [r["ratio"] for r in rows]
        summary[policy] = {
            "search_median_s": statistics.median(search), "search_max_s": max(search),
            "matmul_median_s": statistics.median(r["matmul_s"] for r in rows),
            "ratio_median": statistics.median(ratio), "ratio_max": max(ratio),
            "train_median_s": statistics.median(r["train_s"] for r in rows),
            "epochs_median": statistics.median(r["epochs"] for r in rows),
        }
    return {"node": {"num_train": len(data[1]), "num_val": len(data[3]),
                     "division": division[0], "K": 5},
            "settings": {k: getattr(settings, k) for k in (
                "local_lr", "batch_size", "local_max_epochs", "local_patience", "eps",
                "num_directions", "r_max", "delta", "space", "ellipsoid_c")},
            "summary": summary, "runs": runs}


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
    parser.add_argument("--real-repeats", type=int, default=5,
                        help="rounds of the real node sequence (0 skips it)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help=f"comma-separated subset of {', '.join(POLICIES)}")
    parser.add_argument("--skip-warm", action="store_true", help="only the real sequence")
    parser.add_argument("--eps", type=float, default=0.4)
    parser.add_argument("--e2e", action="store_true", help="also time two full `gems-fl run`s")
    parser.add_argument("--out", default=default_out("radius_search"))
    args = parser.parse_args()
    report = {"machine": machine()}
    if not args.skip_warm:
        report["radius"] = radius_benchmark(args.repeats, args.eps)
    if args.real_repeats:
        policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
        unknown = set(policies) - set(POLICIES)
        if unknown:
            parser.error(f"unknown policies {sorted(unknown)}; choose from {POLICIES}")
        report["real"] = real_benchmark(args.real_repeats, policies)
    if args.e2e:
        report["end_to_end_s"] = e2e_benchmark()
    report["machine_after"] = {"loadavg_1_5_15": [round(v, 2) for v in os.getloadavg()]}
    console = Console()
    m = report["machine"]
    console.print(f"machine: {m['platform']}, {m['cpu_count']} cores ({m['usable_cores']} usable), "
                  f"torch {m['torch']} default threads {m['torch_default_threads']}; load average "
                  f"{m['loadavg_1_5_15']} before, {report['machine_after']['loadavg_1_5_15']} after")
    if "radius" in report:
        console.print(_warm_table(report))
    if "real" in report:
        console.print(_real_table(report, args.real_repeats))
    for name, sec in report.get("end_to_end_s", {}).items():
        console.print(f"gems-fl run: {name}: {sec:.1f} s")
    console.print(f"written: {write_envelope('radius_search', args.out, report)}")


def _warm_table(report: dict) -> Table:
    table = Table(title=f"Radius search, warm, Fashion-MNIST: N={report['radius']['shape']['N']}, "
                        f"d={report['radius']['shape']['d']}, p={report['radius']['shape']['p']}, "
                        f"{report['radius']['torch_threads']} torch threads")
    table.add_column("what")
    table.add_column("median seconds", justify="right")
    table.add_column("x bare matmul (floor)", justify="right")
    base = report["radius"]["seconds"]["bare matmul Xa @ U^T"]
    for name, sec in report["radius"]["seconds"].items():
        table.add_row(name, f"{sec:.4f}", f"{sec / base:.2f}")
    return table


def _real_table(report: dict, rounds: int) -> Table:
    real = report["real"]
    table = Table(title=f"Inside a node, first search right after training "
                        f"({real['node']['num_train']} train / {real['node']['num_val']} val, "
                        f"{rounds} rounds; target ratio <= 2)")
    for col in ("policy", "train s (median)", "search s (median / max)",
                "floor s (median)", "ratio (median / max)"):
        table.add_column(col, justify="right")
    for policy, row in real["summary"].items():
        table.add_row(policy, f"{row['train_median_s']:.2f}",
                      f"{row['search_median_s']:.3f} / {row['search_max_s']:.3f}",
                      f"{row['matmul_median_s']:.4f}",
                      f"{row['ratio_median']:.2f} / {row['ratio_max']:.2f}")
    return table


if __name__ == "__main__":
    main()
