"""How many k-means components per class the ``gaussian`` point of the MLP's output layer
should draw from (``class-components``).

    python3 benchmarks/class_components.py --seeds 0 1 2 3 4 --cases paper:5 \
        --components 1 2 4 8

For each seed and case (``DIVISION:NODES``) one untuned MLP run through the real apps
(the run's defaults, Fashion-MNIST, ``public-samples=0``) gives the merged hidden layer;
its ``gems_model.npz`` is kept under ``--runs`` and reused when there. On the hidden
features of each node's training rows, every node splits each class into ``G``
components (:func:`gems_fl.geometry.components.component_grams`), and the gaussian point
is fitted to the mixture of all nodes' components at each of ``GAUSSIAN_L2S`` (``G=1``:
the ``gaussian`` point, one Gaussian per class over all nodes; above, the ``mixture``
point). The L2 is
chosen on the pooled validation rows of the nodes, as the selection round does; the
table shows, per ``G``, that point's pooled validation and test accuracy and the bytes
of the component matrices per node (float32 triangles). Test accuracy is reported, not
used to choose. Writes JSON after every run (``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--cases", "paper:3", "--components", "1", "2"]]

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.geometry.choices import GAUSSIAN_L2S
from gems_fl.geometry.components import component_grams, mixture_moments
from gems_fl.geometry.virtual import gaussian_point, pooled_class_moments


def merged_model(division: str, nodes: int, seed: int, runs: Path,
                 dataset: str = "fashion-mnist") -> tuple[Path, float | None]:
    """The run's ``gems_model.npz`` (run through the apps unless kept) and its GEMS
    accuracy (None when reused)."""
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.running.run_config import app_config
    from gems_fl.serverapp import run_server

    out = runs / f"{'' if dataset == 'fashion-mnist' else dataset + '-'}" \
                 f"{division.replace('/', '-').replace(',', '')}-{nodes}-seed{seed}"
    found = sorted(out.glob("run-*/gems_model.npz"))
    if found:
        return found[0], None
    cfg = {**app_config(ROOT), "model": "mlp", "dataset": dataset, "public-samples": 0,
           "label-division": division, "seed": seed, "output-dir": str(out)}
    grid = InProcessGrid(client_app, nodes, cfg)
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
    results = run_server(grid, ctx)
    return sorted(out.glob("run-*/gems_model.npz"))[0], results["rows"]["GEMS"]["accuracy"]


def study(division: str, nodes: int, seed: int, components: list[int], runs: Path,
          dataset: str = "fashion-mnist") -> dict:
    path, gems = merged_model(division, nodes, seed, runs, dataset)
    model = np.load(path)
    if "hidden.1.weight" in model:
        raise SystemExit(f"{path}: more than one hidden layer; this study takes one")
    w1, b1 = (model[k].astype(np.float64) for k in ("hidden.0.weight", "hidden.0.bias"))
    features = lambda a: np.maximum(np.asarray(a, np.float64) @ w1.T + b1, 0.0)
    splits = load_dataset(dataset, seed=seed)
    parts = [node_data(splits, parse_division(division, nodes, splits.num_classes), i, seed)
             for i in range(nodes)]
    train = [(features(p[0]), np.asarray(p[1])) for p in parts]
    val_x = features(np.vstack([p[2] for p in parts]))
    val_y = np.concatenate([p[3] for p in parts])
    test_x, test_y = features(splits.test_x), np.asarray(splits.test_y)
    c, n = splits.num_classes, w1.shape[0] + 1

    def accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
        return float(((x @ w[:, :-1].T + w[:, -1]).argmax(1) == y).mean())

    rows = []
    for g in components:
        t0 = time.perf_counter()
        sent = [component_grams(x, y, c, g, seed) for x, y in train]
        if g == 1:  # the gaussian point: one Gaussian per class over all nodes
            counts, means, covs = pooled_class_moments(
                [s[0] for s in sent], [np.bincount(y, minlength=c) for _, y in train])
            classes = np.arange(c)
        else:  # the mixture point: every node's components apart
            counts, means, covs, classes = mixture_moments([s[0] for s in sent],
                                                           [s[1] for s in sent])
        fits = {l2: gaussian_point(counts, means, covs, l2=l2, seed=seed, classes=classes,
                                   num_classes=c) for l2 in GAUSSIAN_L2S}
        val = {l2: accuracy(w, val_x, val_y) for l2, w in fits.items()}
        best = max(GAUSSIAN_L2S, key=lambda v: (val[v], -v))
        rows.append({"components": g, "l2": best, "val": val[best],
                     "test": accuracy(fits[best], test_x, test_y),
                     "sent_per_node": float(np.mean([len(s[1]) for s in sent])),
                     "bytes_per_node": float(np.mean([len(s[1]) for s in sent])) * n * (n + 1) // 2 * 4,
                     "seconds": time.perf_counter() - t0})
        print(f"{division} K={nodes} seed {seed} G={g}: val {val[best]:.4f} test "
              f"{rows[-1]['test']:.4f} (L2 {best:g}, {rows[-1]['sent_per_node']:.1f} matrices "
              f"per node)", flush=True)
    return {"division": division, "nodes": nodes, "seed": seed, "width": n - 1,
            "run_gems": gems, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--cases", nargs="+", default=["paper:5"])
    parser.add_argument("--components", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the merged MLP runs are kept (default: beside --out)")
    parser.add_argument("--out", type=Path, default=Path(default_out("class_components")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    runs = args.runs or args.out.parent / "class_components_runs"
    stored = json.loads(args.out.read_text()) if args.out.exists() else {}
    done = stored["records"][0]["studies"] if "records" in stored else stored.get("studies", [])
    for seed in args.seeds:
        for case in args.cases:
            division, nodes = case.rsplit(":", 1)
            if any(s["division"] == division and s["nodes"] == int(nodes) and s["seed"] == seed
                   for s in done):
                continue
            done.append(study(division, int(nodes), seed, args.components, runs, args.dataset))
            write_envelope("class_components", args.out, {"studies": done}, seeds=args.seeds)
    gs = sorted({r["components"] for s in done for r in s["rows"]})
    print("\n| division | K | seeds | " + " | ".join(f"G={g} val / test" for g in gs) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in gs) + " |")
    for division, nodes in sorted({(s["division"], s["nodes"]) for s in done}):
        mine = [s for s in done if s["division"] == division and s["nodes"] == nodes]
        cells = []
        for g in gs:
            r = [row for s in mine for row in s["rows"] if row["components"] == g]
            cells.append(f"{np.mean([x['val'] for x in r]):.4f} / {np.mean([x['test'] for x in r]):.4f}"
                         if r else "-")
        print(f"| {division} | {nodes} | {len(mine)} | " + " | ".join(cells) + " |")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
