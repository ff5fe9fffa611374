"""Benchmark: per-neuron radius search of one hidden layer vs one bare matmul, at the run's defaults.

    python benchmarks/neuron_radius.py               # median of 3 repeats
    python benchmarks/neuron_radius.py --repeats 5 --float64

Prints a table and writes benchmarks/out/neuron_radius.json, with the machine and its
load (cores, load average before and after, torch threads).

The layer is what a node searches in round 1 of the MLP protocol with the run's
defaults (``Settings(dataset='fashion-mnist')``): node 0 of the 'paper' division with
K = 5 (classes 0 and 1, about 10000 training and 1000 validation images), the 784-50-10
MLP (``hidden='auto'`` is 50, dropout 0.5) trained by ``train_local_mlp`` (Adam lr 1e-3,
batch 32, patience 3), and Z = its validation inputs. The search takes the defaults:
p = ``num-directions`` = 500 per neuron, delta = ``neuron-delta`` = 0.01, r_max = 4000,
eps = ``eps-neuron`` = 0.1, criterion ``neuron-criterion`` = rms. Without
/usr/share/datasets/fashion-mnist the data is random uniform. Everything runs inside
``compute_threads()`` (the node's thread policy); cases run in interleaved rounds.

The "bare matmul floor" is one [Z, 1] @ U^T of shape (N x 785) @ (785 x H p) in float32,
the product the search performs once (it computes the transpose U @ [Z,1]^T, timed
too). "draws" is the time to draw the H p x 785 Gaussian directions alone, and
"bisection only" the search after its product (both are parts of the search's time).
Target: the search <= 2 x the floor.
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
import torch
from rich.console import Console
from rich.table import Table

from gems_fl.geometry import neurons
from gems_fl.geometry.neurons import NeuronSearch, neuron_directions, neuron_radii
from gems_fl.learning.threads import compute_threads
from gems_fl.settings import Settings

OUT = Path(__file__).resolve().parent / "out"
FASHION = Path("/usr/share/datasets/fashion-mnist")
DEFAULTS = Settings(dataset="fashion-mnist")
H = DEFAULTS.hidden_widths[0]
P = DEFAULTS.num_directions
SEARCH = dict(num_directions=P, r_max=DEFAULTS.r_max, delta=DEFAULTS.neuron_delta, seed=1)
TARGET_RATIO = 2.0


def _interleaved_times(cases: dict, repeats: int) -> dict[str, list[float]]:
    """Wall times of every case, in rounds (one run of each case per round), so that a
    change of machine load during the benchmark hits every case alike."""
    for fn in cases.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def _layer() -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """(W, b, Z, data description) of the first hidden layer a default node searches."""
    from gems_fl.protocol.node_layerwise import layer_inputs, train_local_mlp

    if FASHION.exists():
        from gems_fl.data import load_dataset, node_data, parse_division

        splits = load_dataset("fashion-mnist", seed=DEFAULTS.seed)
        division = parse_division(DEFAULTS.label_division, 5, splits.num_classes)
        x_tr, y_tr, x_val, _ = node_data(splits, division, 0, DEFAULTS.seed)
        data = f"Fashion-MNIST node 0 of {DEFAULTS.label_division!r} K=5"
    else:
        rng = np.random.default_rng(0)
        x_tr = rng.random((10_000, 784), dtype=np.float32)
        y_tr = rng.integers(0, 10, 10_000)
        x_val = rng.random((1000, 784), dtype=np.float32)
        data = "random uniform data (Fashion-MNIST not installed)"
    with compute_threads():
        model = train_local_mlp(x_tr, y_tr, 10, DEFAULTS.local_training, [], seed=0)
    hidden = model.hidden[0]
    w = hidden.weight.detach().double().numpy()
    b = hidden.bias.detach().double().numpy()
    z = layer_inputs(model, x_val, 0)
    return w, b, np.asarray(z, dtype=np.float64), data


def run(repeats: int, eps: float, with_float64: bool) -> dict:
    w, b, z, data = _layer()
    n = len(z)
    za = torch.cat([torch.as_tensor(z, dtype=torch.float32), torch.ones(n, 1)], dim=1)
    u = neuron_directions(H, P, 785, seed=1).reshape(-1, 785).to(torch.float32)
    u_t = u.T.contiguous()
    za_t = za.T.contiguous()

    def draws():
        for _ in neurons._draw_blocks(H * P, 785, seed=1):
            pass

    # The bisection alone, on a layer whose product is done (private API: a breakdown).
    layer = neurons._Layer(w, b, z, torch.float32)
    layer.set_directions(neurons._draw_blocks(H * P, 785, seed=1), H, P)

    def bisection(criterion: str):
        neurons._bisect(neurons._Evaluator(layer, criterion, None), eps, SEARCH["r_max"],
                        SEARCH["delta"])

    cases = {
        f"draws ({H * P} x 785 Gaussians, as the search does)": draws,
        "bare matmul [Z,1] @ U^T (floor)": lambda: za @ u_t,
        "bare matmul U @ [Z,1]^T (search's layout)": lambda: u @ za_t,
        f"search rms eps={eps} (target)": lambda: neuron_radii(
            w, b, z, NeuronSearch(eps=eps, **SEARCH)),
        f"search paper eps={eps}": lambda: neuron_radii(
            w, b, z, NeuronSearch(eps=eps, criterion="paper", **SEARCH)),
        "  of which bisection only, rms": lambda: bisection("rms"),
        "  of which bisection only, paper": lambda: bisection("paper"),
    }
    if with_float64:
        cases[f"search rms eps={eps} float64"] = lambda: neuron_radii(
            w, b, z, NeuronSearch(eps=eps, **SEARCH), dtype=torch.float64)
    with compute_threads() as threads:
        all_times = _interleaved_times(cases, repeats)
    seconds = {name: statistics.median(ts) for name, ts in all_times.items()}

    results = {}
    for crit in ("rms", "paper"):
        with compute_threads():
            res = neuron_radii(w, b, z, NeuronSearch(eps=eps, criterion=crit, **SEARCH))
        results[crit] = {
            "radii_min_median_max": [float(np.min(res.radii)), float(np.median(res.radii)),
                                     float(np.max(res.radii))],
            "saturated": int(res.saturated.sum()),
            "steps": res.steps,
            "evaluations": res.evaluations,
            "evaluations_if_exhaustive": res.steps * H * P,
            "max_deviation_at_radius": float(res.max_deviation_at_radius.max()),
        }
    floor = seconds["bare matmul [Z,1] @ U^T (floor)"]
    target = seconds[f"search rms eps={eps} (target)"]
    return {
        "data": data,
        "shape": {"H": H, "d_in": 784, "N": n, "p": P, "matmul": [n, 785, H * P]},
        "search": {**SEARCH, "eps": eps, "dtype": "float32"},
        "threads": threads,
        "seconds": seconds,
        "all_times": all_times,
        "floor_s": floor,
        "ratio_to_floor": {k: v / floor for k, v in seconds.items()},
        "target_ratio": TARGET_RATIO,
        "target_met": target <= TARGET_RATIO * floor,
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eps", type=float, default=DEFAULTS.eps_neuron)
    parser.add_argument("--float64", action="store_true", help="also time the float64 search")
    args = parser.parse_args()
    machine = {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
               "platform": platform.platform(), "torch": torch.__version__,
               "loadavg_before": [round(v, 2) for v in os.getloadavg()]}
    report = {"machine": machine, "neuron_radius": run(args.repeats, args.eps, args.float64)}
    machine["loadavg_after"] = [round(v, 2) for v in os.getloadavg()]
    bench = report["neuron_radius"]
    console = Console()
    m = report["machine"]
    console.print(f"machine: {m['platform']}, {m['cpu_count']} cores, torch {m['torch']} "
                  f"({m['torch_threads']} threads at start, {bench['threads']} in the search); "
                  f"load average {m['loadavg_before']} before, {m['loadavg_after']} after")
    table = Table(title=f"Per-neuron radius search ({bench['data']}): H={H}, d_in=784, "
                        f"N={bench['shape']['N']}, p={P}, delta={SEARCH['delta']}, "
                        f"r_max={SEARCH['r_max']:g}, float32, median of {args.repeats}")
    table.add_column("what")
    table.add_column("median s", justify="right")
    table.add_column("all runs s", justify="right")
    table.add_column("x floor", justify="right")
    for name, sec in bench["seconds"].items():
        runs = " ".join(f"{t:.2f}" for t in bench["all_times"][name])
        table.add_row(name, f"{sec:.3f}", runs, f"{bench['ratio_to_floor'][name]:.2f}")
    console.print(table)
    detail = Table(title="search outcome")
    for col in ("criterion", "radii min / median / max", "saturated", "steps",
                "deviations evaluated (of exhaustive)", "max dev at radius"):
        detail.add_column(col)
    for crit, res in bench["results"].items():
        lo, med, hi = res["radii_min_median_max"]
        detail.add_row(crit, f"{lo:.4g} / {med:.4g} / {hi:.4g}", str(res["saturated"]),
                       str(res["steps"]),
                       f"{res['evaluations']} ({res['evaluations'] / res['evaluations_if_exhaustive']:.1%})",
                       f"{res['max_deviation_at_radius']:.4g}")
    console.print(detail)
    verdict = "met" if bench["target_met"] else "NOT met"
    ratio = bench["ratio_to_floor"][f"search rms eps={args.eps} (target)"]
    console.print(f"floor {bench['floor_s']:.3f} s; search rms / floor = {ratio:.2f} "
                  f"(target <= {TARGET_RATIO:g}: {verdict})")
    OUT.mkdir(exist_ok=True)
    (OUT / "neuron_radius.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written: {OUT / 'neuron_radius.json'}")


if __name__ == "__main__":
    main()
