"""Benchmark: per-neuron radius search of one hidden layer vs one bare matmul.

    python benchmarks/neuron_radius.py               # median of 3 repeats
    python benchmarks/neuron_radius.py --repeats 5 --float64

Prints a table and writes benchmarks/out/neuron_radius.json. The layer is the hidden
layer of a 784-100-10 ReLU MLP trained for one epoch (Adam, lr 1e-3, batch 32) on 10000
Fashion-MNIST training images; Z is the first N = 1000 validation images (random
uniform data when /usr/share/datasets/fashion-mnist is missing). The authors' values:
p = 500 directions per neuron, delta = 1.0, r_max = 4000; eps = 0.1. Cases run in
interleaved rounds; the table shows medians and every run.

The "bare matmul floor" is one [Z, 1] @ U^T of shape (1000 x 785) @ (785 x 50000) in
float32, the product the search performs once (it computes the transpose U @ [Z,1]^T,
timed too). "draws" is the time to draw the 50000 x 785 Gaussian directions alone, and
"bisection only" the search after its product (both are parts of the search's time).
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
from gems_fl.learning.threads import single_thread

OUT = Path(__file__).resolve().parent / "out"
FASHION = Path("/usr/share/datasets/fashion-mnist")
H, N, P = 100, 1000, 500
SEARCH = dict(num_directions=P, r_max=4000.0, delta=1.0, seed=1)


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
    """(W, b, Z, data description) of a trained 784-100-10 MLP's hidden layer."""
    if FASHION.exists():
        from gems_fl.data import load_dataset

        splits = load_dataset("fashion-mnist", seed=0)
        x_tr, y_tr = splits.train_x[:10_000], splits.train_y[:10_000]
        z = splits.val_x[:N]
        data = "Fashion-MNIST validation images"
    else:
        rng = np.random.default_rng(0)
        x_tr = rng.random((10_000, 784), dtype=np.float32)
        y_tr = rng.integers(0, 10, 10_000)
        z = rng.random((N, 784), dtype=np.float32)
        data = "random uniform data (Fashion-MNIST not installed)"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, H), torch.nn.ReLU(), torch.nn.Linear(H, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x_t, y_t = torch.as_tensor(x_tr, dtype=torch.float32), torch.as_tensor(y_tr, dtype=torch.long)
    for idx in torch.randperm(len(x_t)).split(32):  # one epoch
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_t[idx]), y_t[idx]).backward()
        opt.step()
    hidden = model[0]
    w = hidden.weight.detach().double().numpy()
    b = hidden.bias.detach().double().numpy()
    return w, b, np.asarray(z, dtype=np.float64), data


def run(repeats: int, eps: float, with_float64: bool) -> dict:
    w, b, z, data = _layer()
    za = torch.cat([torch.as_tensor(z, dtype=torch.float32), torch.ones(N, 1)], dim=1)
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
        with single_thread():
            neurons._bisect(neurons._Evaluator(layer, criterion, None), eps, 4000.0, 1.0)

    cases = {
        "draws (50000 x 785 Gaussians, as the search does)": draws,
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
    all_times = _interleaved_times(cases, repeats)
    seconds = {name: statistics.median(ts) for name, ts in all_times.items()}

    results = {}
    for crit in ("rms", "paper"):
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
        "shape": {"H": H, "d_in": 784, "N": N, "p": P, "matmul": [N, 785, H * P]},
        "search": {**SEARCH, "eps": eps, "dtype": "float32"},
        "seconds": seconds,
        "all_times": all_times,
        "ratio_to_floor": {k: v / floor for k, v in seconds.items()},
        "target_s": 2.0,
        "target_met": target <= 2.0,
        "results": results,
        "load_average": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--eps", type=float, default=0.1)
    parser.add_argument("--float64", action="store_true", help="also time the float64 search")
    args = parser.parse_args()
    report = {
        "machine": {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                    "platform": platform.platform(), "torch": torch.__version__},
        "neuron_radius": run(args.repeats, args.eps, args.float64),
    }
    bench = report["neuron_radius"]
    console = Console()
    table = Table(title=f"Per-neuron radius search ({bench['data']}): H={H}, d_in=784, N={N}, "
                        f"p={P}, delta=1, r_max=4000, float32, median of {args.repeats}")
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
    console.print(f"target search <= 2 s: {verdict}; load average {bench['load_average']}")
    OUT.mkdir(exist_ok=True)
    (OUT / "neuron_radius.json").write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"written: {OUT / 'neuron_radius.json'}")


if __name__ == "__main__":
    main()
