"""The kernel (Nyström) model: its central ceiling per landmark count and source, and the
federated one-round and refined figures beside FedAvg on the same features.

    python3 benchmarks/kernel.py central --landmarks 1000 2000 3000 --sources centres random
    python3 benchmarks/kernel.py federated --divisions dirichlet:0.1:5 --seeds 0 1 2

``central``: the ridge least-squares fit on every training row of Fashion-MNIST (from the
summed ``Z^T Z`` and ``Z^T Y``, as the pooled point solves it), the ridge picked on the
validation rows, test accuracy reported beside. Landmark sources: ``centres``, the per-class
k-means centres that the nodes of a Dirichlet(0.1) K=5 division send in a run
(:func:`gems_fl.data.kernel_features.class_centres`, each the mean of at least 5 rows);
``random``, training rows drawn at random (what a central learner could use, never a
federated run). ``--no-raw`` drops the rows beside the kernel features. ``--linear`` adds
the ridge on the rows alone. The validation column is what chooses.

``federated``: one run of ``model='kernel'`` per division and seed through the real apps
over the in-process Grid, with the run's defaults (``public-samples=0``); ``--refine N``
also runs it with N refinement rounds; ``--fedavg R`` adds FedAvg-SGD on the same features
for R rounds, its rate tuned on the pooled validation rows. Prints a table and writes the
JSON envelope (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import print_table, write_envelope

#: tiny runs that CI makes of this script (``python3 benchmarks/smoke.py``): every code path
#: of the commands above, in seconds, on digits or a few landmarks
SMOKE = [["central", "--landmarks", "40", "--sources", "random", "--linear"],
         ["federated", "--divisions", "dirichlet:0.5:3", "--set", "dataset=digits",
          "kernel-landmarks=60"]]

RIDGES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
POINT_RIDGES = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)  # absolute, on the mean Gram matrix
POINT_SHRINKAGES = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2)  # relative to tr(S_w) / d


def _splits(seed: int):
    from gems_fl.data import load_dataset
    return load_dataset("fashion-mnist", seed=seed)


def site_landmarks(splits, count: int, seed: int, alpha: float = 0.1, nodes: int = 5) -> np.ndarray:
    """The landmarks a run's nodes would send on a Dirichlet(alpha) division of the rows."""
    from gems_fl.data.dirichlet import DirichletDivision, dirichlet_shares, pool_rows
    from gems_fl.data.kernel_features import class_centres

    shares = dirichlet_shares(splits.train_y, splits.val_y, DirichletDivision(alpha, nodes, 20), seed)
    share = count / sum(len(tr) for tr, _ in shares)
    marks = []
    for tr, _ in shares:
        x, y = pool_rows((splits.train_x, splits.train_y), (splits.val_x, splits.val_y), tr)
        marks.append(class_centres(x, y, share, seed)[0])
    return np.concatenate(marks)


def point_grid(gram, moments, rows, z_val, y_val, z_test, y_test) -> dict:
    """The product's pooled and LDA points (``gems_fl.geometry.pooled``) on the exact pooled
    sums, at each value of a wide grid: which regularisation the features want."""
    import torch

    from gems_fl.geometry.pooled import pooled_lda, pooled_point

    mean_gram, mean_moments = (gram / rows).numpy(), (moments / rows).T.numpy()
    out = {}
    for name, solve, values in (("pooled", pooled_point, POINT_RIDGES),
                                ("lda", pooled_lda, POINT_SHRINKAGES)):
        for value in values:
            w = torch.as_tensor(solve([mean_gram], [mean_moments], [1.0], value)).T
            out[f"{name} {value:g}"] = {
                "val_accuracy": float(((z_val @ w).argmax(1).numpy() == y_val).mean()),
                "test_accuracy": float(((z_test @ w).argmax(1).numpy() == y_test).mean())}
    return out


def ridge_fit(splits, mapped, dim: int, points: bool = False) -> dict:
    import torch

    gram = torch.zeros(dim + 1, dim + 1, dtype=torch.float64)
    moments = torch.zeros(dim + 1, splits.num_classes, dtype=torch.float64)

    def with_bias(x):
        z = torch.as_tensor(mapped(x), dtype=torch.float64)
        return torch.cat([z, torch.ones(len(z), 1, dtype=z.dtype)], 1)

    for start in range(0, len(splits.train_y), 5000):
        z = with_bias(splits.train_x[start:start + 5000])
        y = torch.nn.functional.one_hot(torch.as_tensor(splits.train_y[start:start + 5000]),
                                        splits.num_classes).double()
        gram += z.T @ z
        moments += z.T @ y
    z_val, z_test = with_bias(splits.val_x), with_bias(splits.test_x)
    if points:
        return point_grid(gram, moments, len(splits.train_y), z_val, splits.val_y, z_test,
                          splits.test_y)
    scale = torch.trace(gram) / (dim + 1)
    best = None
    for ridge in RIDGES:
        w = torch.linalg.solve(gram + ridge * scale * torch.eye(dim + 1, dtype=gram.dtype), moments)
        val = float(((z_val @ w).argmax(1).numpy() == splits.val_y).mean())
        test = float(((z_test @ w).argmax(1).numpy() == splits.test_y).mean())
        if best is None or val > best["val_accuracy"]:
            best = {"ridge": ridge, "val_accuracy": val, "test_accuracy": test}
    return best


def central(args) -> list[dict]:
    from gems_fl.data.kernel_features import KernelFeatures, row_scale
    from gems_fl.data.random_features import bandwidth_from_stats
    from gems_fl.data.site_files import feature_stats

    records = []
    for seed in args.seeds:
        splits = _splits(seed)
        bandwidth = bandwidth_from_stats([feature_stats(splits.train_x)])
        if args.linear:
            t0 = time.perf_counter()
            best = ridge_fit(splits, lambda x: x, splits.num_features)
            records.append({"model": "linear", "source": "-", "landmarks": 0, "raw": True,
                            "dim": splits.num_features, "seed": seed, **best,
                            "wall_s": time.perf_counter() - t0})
            print(records[-1], flush=True)
        for count in args.landmarks:
            for source in args.sources:
                t0 = time.perf_counter()
                if source == "centres":
                    marks = site_landmarks(splits, count, seed)
                else:
                    rng = np.random.default_rng(seed)
                    marks = splits.train_x[rng.choice(len(splits.train_y), count, replace=False)]
                pick_s = time.perf_counter() - t0
                variants = [(True, s) for s in args.raw_scales] + ([(False, "1")] if args.no_raw else [])
                for raw, scale_name in variants:
                    scale = row_scale(float(np.mean(np.einsum("ij,ij->i", splits.train_x, splits.train_x))),
                                      splits.num_features) \
                        if scale_name == "unit" else float(scale_name)
                    fmap = KernelFeatures(marks, bandwidth, raw=raw, raw_scale=scale)
                    t1 = time.perf_counter()
                    if args.points:
                        grid = ridge_fit(splits, fmap.transform, fmap.dim, points=True)
                        records.append({"model": "kernel", "landmarks": len(marks), "seed": seed,
                                        "raw_scale": scale_name, "points": grid})
                        for key, r in grid.items():
                            print(f"{key}: val {r['val_accuracy']:.4f} test {r['test_accuracy']:.4f}")
                        write_envelope("kernel", args.out, records)
                        continue
                    best = ridge_fit(splits, fmap.transform, fmap.dim)
                    records.append({"model": "kernel", "source": source, "landmarks": len(marks),
                                    "raw": raw, "raw_scale": scale_name if raw else None,
                                    "dim": fmap.dim, "seed": seed, **best,
                                    "landmark_s": pick_s, "wall_s": time.perf_counter() - t1})
                    print(records[-1], flush=True)
                    write_envelope("kernel", args.out, records)
    if args.points:
        return records
    print_table(["model", "landmarks (source)", "rows beside", "D", "validation", "test", "ridge"],
                [[r["model"], f"{r['landmarks']} ({r['source']})",
                  f"x {r.get('raw_scale')}" if r["raw"] and r.get("raw_scale") else "yes" if r["raw"] else "no",
                  r["dim"], f"{r['val_accuracy']:.4f}", f"{r['test_accuracy']:.4f}", r["ridge"]]
                 for r in records])
    return records


def one_run(division: str, nodes: int, seed: int, extra: dict) -> dict:
    from inprocess_run import run_apps

    from tests.helpers import app_defaults
    with tempfile.TemporaryDirectory() as out:
        cfg = {**app_defaults(), "dataset": "fashion-mnist", "label-division": division,
               "seed": seed, "public-samples": 0, "output-dir": out, "model": "kernel", **extra}
        results, grid, wall = run_apps(cfg, nodes)
    up = [e["up"] for e in grid.exchanges]
    down = [e["down"] for e in grid.exchanges]
    fmap = results["dataset"].get("feature_map") or {}
    return {"division": division, "nodes": nodes, "seed": seed, "settings": extra,
            "landmarks": fmap.get("landmarks"), "dim": fmap.get("dim"),
            "accuracy": results["rows"]["GEMS"]["accuracy"],
            "point": results["intersection"]["method"],
            "bytes_up_per_node": sum(up) / nodes, "bytes_down_per_node": sum(down) / nodes,
            "wall_s": wall, "good_enough": results["verification"]["good_enough"],
            "one_shot_accuracy": next((r["test_accuracy"] for r in results.get("refinement", [])
                                       if r["kind"] == "selection"), None),
            "plan": results.get("plan"),
            "candidates": (results["intersection"].get("selection") or {}).get("candidates"),
            "timing_s": results.get("timing_s")}


def federated(args) -> list[dict]:
    records = []
    for text in args.divisions:
        spec, _, nodes = text.rpartition(":")
        for seed in args.seeds:
            for refine in ([] if args.one_shot is not None else sorted({0, args.refine})):
                extra = {"refine-rounds": refine, **_settings(args.set)}
                records.append(one_run(spec, int(nodes), seed, extra))
                r = records[-1]
                print(f"{spec} K={nodes} seed {seed} refine {refine}: {r['accuracy']:.4f}, "
                      f"good enough {r['good_enough']}, {r['wall_s']:.0f} s", flush=True)
                write_envelope("kernel", args.out, records)
            if args.fedavg:
                one_shot = args.one_shot if args.one_shot is not None else next(
                    r["accuracy"] for r in records if r.get("division") == spec
                    and r.get("seed") == seed and "good_enough" in r
                    and not r["settings"].get("refine-rounds"))
                records.append(fedavg(spec, int(nodes), seed, args, one_shot))
                write_envelope("kernel", args.out, records)
    print_table(["division", "seed", "refine", "m", "D", "test accuracy", "good enough",
                 "MB up / node", "MB down / node", "wall s"],
                [[f"{r['division']} K={r['nodes']}", r["seed"], r.get("settings", {}).get("refine-rounds", "-"),
                  r.get("landmarks", "-"), r.get("dim", "-"), f"{r['accuracy']:.4f}",
                  r.get("good_enough", "-"), f"{r['bytes_up_per_node'] / 1e6:.2f}",
                  f"{r['bytes_down_per_node'] / 1e6:.2f}", f"{r['wall_s']:.0f}"]
                 for r in records if "good_enough" in r], right=0)
    fed = [r for r in records if r.get("method") == "fedavg"]
    if fed:
        print_table(["division", "seed", "lr", "rounds to GEMS one-shot", "round 1", "best (round)",
                     "MB up / node at best"],
                    [[f"{r['division']} K={r['nodes']}", r["seed"], r["lr"], r["rounds_to_gems"],
                      f"{r['accuracy'][0]:.4f}", f"{max(r['accuracy']):.4f} ({r['best_round']})",
                      f"{r['bytes_up_per_node'][r['best_round'] - 1] / 1e6:.2f}"] for r in fed], right=0)
    return records


def fedavg(spec: str, nodes: int, seed: int, args, gems: float) -> dict:
    """FedAvg-SGD on the kernel model's features, the rate tuned on the pooled validation
    rows; ``gems``: the one-shot accuracy it is compared with."""
    from gems_lab.fedavg import run_sgd
    from tests.helpers import app_defaults
    cfg = {**app_defaults(), "dataset": "fashion-mnist", "label-division": spec, "seed": seed,
           "model": "kernel", "public-samples": 0, **_settings(args.set)}
    t0 = time.perf_counter()
    curve = run_sgd(cfg, nodes, "fedavg", args.fedavg, grid=tuple(args.lr_grid),
                    tune_rounds=args.tune_rounds)
    acc = list(curve.accuracy)
    best = max(range(len(acc)), key=acc.__getitem__) + 1
    return {"method": "fedavg", "division": spec, "nodes": nodes, "seed": seed, "lr": curve.lr,
            "accuracy": acc, "best_round": best,
            "gems_one_shot": gems,
            "rounds_to_gems": next((i + 1 for i, a in enumerate(acc) if a >= gems), None),
            "bytes_up_per_node": [b / nodes for b in curve.bytes_up],
            "tuning": curve.tuning, "wall_s": time.perf_counter() - t0}


def _settings(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if value.lower() in ("true", "false"):
            out[key] = value.lower() == "true"
            continue
        for kind in (int, float):
            try:
                value = kind(value)
                break
            except ValueError:
                pass
        out[key] = value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("central")
    c.add_argument("--landmarks", type=int, nargs="+", default=[2000])
    c.add_argument("--sources", nargs="+", default=["centres", "random"], choices=["centres", "random"])
    c.add_argument("--no-raw", action="store_true", help="also without the rows beside")
    c.add_argument("--raw-scales", nargs="+", default=["unit"],
                   help="factors on the rows beside: numbers, or unit (one over their RMS norm)")
    c.add_argument("--linear", action="store_true", help="also the ridge on the rows alone")
    c.add_argument("--points", action="store_true",
                   help="instead: the pooled and LDA points at each value of a wide grid")
    c.add_argument("--seeds", type=int, nargs="+", default=[0])
    c.add_argument("--out", default=str(ROOT / "results/benchmarks/kernel_central.json"))
    f = sub.add_parser("federated")
    f.add_argument("--divisions", nargs="+", default=["dirichlet:0.1:5"])
    f.add_argument("--seeds", type=int, nargs="+", default=[0])
    f.add_argument("--refine", type=int, default=0)
    f.add_argument("--fedavg", type=int, default=0, metavar="ROUNDS")
    f.add_argument("--one-shot", type=float, default=None, metavar="ACCURACY",
                   help="with --fedavg: GEMS's one-shot accuracy measured before (no GEMS run)")
    f.add_argument("--lr-grid", type=float, nargs="+", default=[0.03, 0.1, 0.3, 1.0])
    f.add_argument("--tune-rounds", type=int, default=10)
    f.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    f.add_argument("--out", default=str(ROOT / "results/benchmarks/kernel.json"))
    args = parser.parse_args()
    central(args) if args.what == "central" else federated(args)
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
