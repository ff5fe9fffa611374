"""Random-feature models: accuracy against bytes up per node, per uplink form and width D.

    python3 benchmarks/random_features.py --divisions dirichlet:0.1:5 paper:5 --seeds 0

For each division (Fashion-MNIST; ``SPEC:K``, e.g. ``dirichlet:0.1:5`` for
Dirichlet(0.1) over 5 nodes), seed, width D (``--dims``) and form of the Gram statistics
on the wire (``--ranks``: ``auto``, the run's default factor; ``0``, the whole matrix as
a float32 triangle; any rank r, a float16 rank-r factor plus the diagonal of the rest),
one run of ``model='random-features'`` through the real apps over the in-process Grid,
with the run's defaults otherwise (``public-samples=0``: no tuning on public data).
``--logistic`` adds the default logistic model on pixels beside it.

``--central`` measures the model class instead: the ridge least-squares fit of
``rf-map`` features on all 50,000 training rows at once (from the summed ``Z^T Z`` and
``Z^T Y``, as the pooled point solves it), for each D and each bandwidth factor
(``--factors``, times the RMS distance between two rows, as ``rf-bandwidth=auto``
computes it from the sums), the ridge picked on the 5,000 validation rows; it prints
validation and test accuracy. The validation column is what chose ``rf-bandwidth``'s
factor. Prints GEMS test
accuracy, the point the selection round kept, bytes up per node (every reply of the run,
as Flower counts it; the JSON also has both ways over all nodes), wall time and on how many nodes h_G is good enough, and writes JSON
(``--out``, default ``results/benchmarks/random_features.json``), saved after every run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--divisions", "paper:3", "--dims", "128", "--ranks", "auto", "--set", "dataset=digits"],
         ["--central", "--dims", "64", "--factors", "0.6"]]
sys.path.insert(0, str(ROOT / "benchmarks"))

from inprocess_run import run_apps

from tests.helpers import app_defaults


def one_run(division: str, nodes: int, seed: int, model: str, dim: int | None,
            rank: str, refine: int, extra: dict | None = None) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = {**app_defaults(), "dataset": "fashion-mnist", "label-division": division,
               "seed": seed, "public-samples": 0, "output-dir": out, "model": model,
               "gram-rank": rank, "refine-rounds": refine,
               **({"rf-dim": dim} if dim else {}), **(extra or {})}
        results, grid, wall = run_apps(cfg, nodes)
    selection = next((r for r in results["rounds"] if r.get("refine") == 0), {})
    up = [e["up"] for e in grid.exchanges]
    return {"division": division, "nodes": nodes, "seed": seed, "model": model, "dim": dim,
            "gram_rank": rank, "layer_gram_rank": results["plan"].get("gram_rank"),
            "refine_rounds": refine, "accuracy": results["rows"]["GEMS"]["accuracy"],
            "point": selection.get("point", results["intersection"]["method"]),
            "bytes_up_per_node": sum(up) / nodes,
            "bytes_both_ways": sum(up) + sum(e["down"] for e in grid.exchanges), "wall_s": wall,
            "bandwidth": (results["dataset"].get("random_features") or {}).get("rf-bandwidth"),
            "good_enough": results["verification"]["good_enough"],
            "settings": extra or {}, "dp": (results.get("privacy") or {}).get("dp"),
            "timing_s": results.get("timing_s")}


def central(dim: int, factor: float, kind: str, seed: int) -> dict:
    """The pooled ridge fit of one map on every training row; ridge chosen on validation."""
    import time

    import torch

    from gems_fl.data import load_dataset
    from gems_fl.data.random_features import RandomFeatures, bandwidth_from_stats
    from gems_fl.data.site_files import feature_stats

    splits = load_dataset("fashion-mnist", seed=seed)
    t0 = time.perf_counter()
    bandwidth = bandwidth_from_stats([feature_stats(splits.train_x)], factor=factor)
    features = RandomFeatures(kind, splits.num_features, dim, bandwidth, seed)

    def mapped(x):
        z = torch.as_tensor(features.transform(x), dtype=torch.float64)
        return torch.cat([z, torch.ones(len(z), 1, dtype=z.dtype)], 1)

    gram = torch.zeros(dim + 1, dim + 1, dtype=torch.float64)
    moments = torch.zeros(dim + 1, splits.num_classes, dtype=torch.float64)
    for start in range(0, len(splits.train_y), 5000):
        z = mapped(splits.train_x[start:start + 5000])
        y = torch.nn.functional.one_hot(torch.as_tensor(splits.train_y[start:start + 5000]),
                                        splits.num_classes).double()
        gram += z.T @ z
        moments += z.T @ y
    z_val, z_test = mapped(splits.val_x), mapped(splits.test_x)
    scale = torch.trace(gram) / (dim + 1)
    best = None
    for ridge in (1e-5, 1e-4, 1e-3, 1e-2):
        w = torch.linalg.solve(gram + ridge * scale * torch.eye(dim + 1, dtype=gram.dtype), moments)
        val = float(((z_val @ w).argmax(1).numpy() == splits.val_y).mean())
        test = float(((z_test @ w).argmax(1).numpy() == splits.test_y).mean())
        if best is None or val > best["val_accuracy"]:
            best = {"ridge": ridge, "val_accuracy": val, "test_accuracy": test}
    return {"map": kind, "dim": dim, "factor": factor, "bandwidth": bandwidth, "seed": seed,
            **best, "wall_s": time.perf_counter() - t0}


def run_fedavg(args: argparse.Namespace, out: Path) -> None:
    """FedAvg-SGD on the same random-feature model (the map a GEMS run with these settings
    agrees on), its rate chosen on the pooled validation splits, never on test."""
    from gems_lab.fedavg import run_sgd

    rows = []
    for text in args.divisions:
        spec, nodes = parse_division(text)
        for seed in args.seeds:
            for dim in args.dims:
                cfg = {**app_defaults(), "dataset": "fashion-mnist", "label-division": spec,
                       "seed": seed, "model": "random-features", "rf-dim": dim,
                       "public-samples": 0}
                curve = run_sgd(cfg, nodes, "fedavg", args.fedavg, grid=tuple(args.lr_grid),
                                tune_rounds=args.tune_rounds)
                row = {"division": spec, "nodes": nodes, "seed": seed, "dim": dim,
                       **curve.to_dict(),
                       "bytes_up_per_node": [b / nodes for b in curve.bytes_up]}
                rows.append(row)
                write_envelope("random_features", out, {"args": vars(args), "fedavg": rows},
                               seeds=args.seeds)
                acc = curve.accuracy
                best = max(range(len(acc)), key=acc.__getitem__)
                edge = " (the grid's edge)" if curve.lr in (min(args.lr_grid), max(args.lr_grid)) else ""
                print(f"\n{spec} K={nodes} seed {seed} D={dim}: FedAvg-SGD, lr {curve.lr:g}{edge} "
                      f"(validation {curve.tuning['val_accuracy']}), {curve.seconds:.0f} s")
                print("| rounds | test accuracy | MB up per node | MB both ways per node |")
                print("| ---: | ---: | ---: | ---: |")
                shown = sorted({r for r in (1, 5, 10, 20, 50, len(acc)) if r <= len(acc)} | {best + 1})
                for r in shown:
                    mark = " (best)" if r == best + 1 else ""
                    print(f"| {r}{mark} | {acc[r - 1]:.4f} | {row['bytes_up_per_node'][r - 1] / 1e6:.2f} | "
                          f"{curve.bytes_total[r - 1] / nodes / 1e6:.2f} |")
                for target in args.targets:
                    hit = next((r + 1 for r, a in enumerate(acc) if a >= target), None)
                    print(f"first round at >= {target}: " + (
                        f"{hit} ({row['bytes_up_per_node'][hit - 1] / 1e6:.2f} MB up per node)"
                        if hit else f"not within {len(acc)} rounds"))
    print(f"\nwritten to {out}")


def run_central(args: argparse.Namespace, out: Path) -> None:
    rows = []
    for seed in args.seeds:
        for dim in args.dims:
            for factor in args.factors:
                rows.append(central(dim, factor, args.map, seed))
                write_envelope("random_features", out, {"args": vars(args), "central": rows},
                               seeds=args.seeds)
                r = rows[-1]
                print(f"{args.map} D={dim} factor {factor} (s={r['bandwidth']:.3f}) seed {seed}: "
                      f"val {r['val_accuracy']:.4f}, test {r['test_accuracy']:.4f} (ridge "
                      f"{r['ridge']:g}), {r['wall_s']:.0f} s", flush=True)
    print("\n| map | D | factor | validation (mean) | test (mean) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for dim in args.dims:
        for factor in args.factors:
            rs = [r for r in rows if r["dim"] == dim and r["factor"] == factor]
            print(f"| {args.map} | {dim} | {factor} | "
                  f"{statistics.mean(r['val_accuracy'] for r in rs):.4f} | "
                  f"{statistics.mean(r['test_accuracy'] for r in rs):.4f} |")
    print(f"\nwritten to {out}")


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text, text)


def parse_division(text: str) -> tuple[str, int]:
    spec, _, nodes = text.rpartition(":")
    if not spec or not nodes.isdigit():
        raise SystemExit(f"--divisions {text!r}: give SPEC:K, e.g. dirichlet:0.1:5 or paper:5")
    return spec, int(nodes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--divisions", nargs="+", default=["dirichlet:0.1:5"])
    parser.add_argument("--dims", type=int, nargs="+", default=[2048],
                        help="rf-dim of the runs; 0 alone: none (with --logistic)")
    parser.add_argument("--ranks", nargs="+", default=["auto", "0"])
    parser.add_argument("--refine", type=int, default=0, help="refine-rounds of every run")
    parser.add_argument("--logistic", action="store_true",
                        help="also the default logistic model on the pixels")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="more run settings for every run, e.g. dp-epsilon=4 rf-bandwidth=7")
    parser.add_argument("--central", action="store_true",
                        help="the model class: pooled ridge on all training rows, per D and factor")
    parser.add_argument("--factors", type=float, nargs="+", default=[0.4, 0.6, 0.8, 1.0])
    parser.add_argument("--map", default="fourier", choices=["fourier", "relu"])
    parser.add_argument("--fedavg", type=int, default=0, metavar="ROUNDS",
                        help="instead: FedAvg-SGD on the same model for ROUNDS rounds")
    parser.add_argument("--lr-grid", type=float, nargs="+", default=[30.0, 100.0, 300.0, 1000.0],
                        help="FedAvg-SGD's rates, chosen on validation after --tune-rounds (the "
                        "features are about sqrt(2/D) each: D=2048 chose 100 from inside these)")
    parser.add_argument("--tune-rounds", type=int, default=10)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.85, 0.866],
                        help="FedAvg: report the first round at these test accuracies")
    parser.add_argument("--out", default=default_out("random_features"))
    args = parser.parse_args()
    out = Path(args.out)
    if args.central:
        run_central(args, out)
        return
    if args.fedavg:
        run_fedavg(args, out)
        return
    plan = [(d, s, "random-features", dim, r) for d in args.divisions for s in args.seeds
            for dim in args.dims for r in args.ranks]
    if args.dims == [0]:  # --dims 0: the logistic rows alone
        plan = []
    if args.logistic:
        plan += [(d, s, "logistic", None, "auto") for d in args.divisions for s in args.seeds]
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: give KEY=VALUE")
        extra[key] = _value(value)
    runs = []
    for i, (division, seed, model, dim, rank) in enumerate(plan, 1):
        spec, nodes = parse_division(division)
        r = one_run(spec, nodes, seed, model, dim, rank, args.refine, extra)
        runs.append(r)
        write_envelope("random_features", out, {"args": vars(args), "runs": runs},
                       seeds=args.seeds)
        print(f"[{i}/{len(plan)}] {division} seed {seed} {model} D={dim} gram-rank={rank}: "
              f"GEMS {r['accuracy']:.4f} ({r['point']}), {r['bytes_up_per_node'] / 1e6:.2f} MB "
              f"up per node, good enough on {r['good_enough']} of {nodes}, {r['wall_s']:.0f} s",
              flush=True)
    print("\n| division | model | D | gram-rank | GEMS (mean) | min | max | MB up per node "
          "| wall s | good enough |")
    print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["division"], r["nodes"], r["model"], r["dim"], r["gram_rank"]),
                          []).append(r)
    for (division, nodes, model, dim, rank), rs in groups.items():
        acc = [r["accuracy"] for r in rs]
        print(f"| {division} K={nodes} | {model} | {dim or '-'} | {rank} | "
              f"{statistics.mean(acc):.4f} | {min(acc):.4f} | {max(acc):.4f} | "
              f"{statistics.mean(r['bytes_up_per_node'] for r in rs) / 1e6:.2f} | "
              f"{statistics.mean(r['wall_s'] for r in rs):.0f} | "
              f"{sum(r['good_enough'] for r in rs)}/{nodes * len(rs)} |")
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
