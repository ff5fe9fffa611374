"""Compressed Gram replies: bytes up per node against accuracy, for every ``gram-rank``.

    python3 benchmarks/gram_rank.py --seeds 0 1 2 3 4

``gram-rank=r`` sends a rank-r factor ``F`` of the node's Gram matrix (float16 vectors,
power-of-two scales) and the diagonal of the rest, ``G ~ F F^T + diag(G - F F^T)``;
``auto`` (the default) rank ``max(32, ceil(size / 16))``, 50 here; 0 sends the full matrix
(its upper triangle, float32). For each division (the paper's K=5, Dirichlet(0.1) and
Dirichlet(0.5) at K=5, Fashion-MNIST, the run's defaults otherwise) and seed, every node trains its model once; then for each rank it
builds its space as a node does (``kinds.Gram.build``: the compressed matrix, the radius
searched in that space), its reply goes through the wire format and the server's checks,
and the server forms the run's default point (the selection round emulated as in
``gram_points.py``) and the closed-form center from the decoded replies. Prints bytes up
per node (the reply as Flower counts it) and mean test accuracy, and writes JSON
(``--out``, default ``results/benchmarks/gram_rank.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--ranks", "0", "auto"]]

from gram_points import _correct, _selected

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.data.nodes import node_seed
from gems_fl.geometry.eps import passes
from gems_fl.geometry.kinds import build_layer_space
from gems_fl.geometry.points import aggregate_gram
from gems_fl.learning.threads import compute_threads
from gems_fl.protocol.node import build_local_space, encode_layer_space
from gems_fl.protocol.replies import decode_reply
from gems_fl.protocol.wire import content_bytes
from gems_fl.settings import Settings
from gems_fl.settings.options import node_work

DIVISIONS = [("paper", 5), ("dirichlet:0.1", 5), ("dirichlet:0.5", 5)]
RANKS: tuple[int | str, ...] = ("auto", 99, 0)  # 0: the full matrix; --ranks to change


def trial(spec: str, num_nodes: int, seed: int, ranks: tuple,
          dataset: str = "fashion-mnist") -> dict:
    settings = Settings(dataset=dataset, label_division=spec, seed=seed)
    splits = load_dataset(dataset, seed=seed)
    division = parse_division(spec, num_nodes, splits.num_classes)
    work = node_work(settings)
    shapes = {"weight": (10, splits.num_features), "bias": (10,)}
    nodes = []
    t0 = time.perf_counter()
    for k in range(num_nodes):
        x_tr, y_tr, x_val, y_val = node_data(splits, division, k, seed)
        local = build_local_space(x_tr, y_tr, x_val, y_val, 10, work, node_seed(seed, k))
        nodes.append((local, x_tr, y_tr, x_val, y_val, node_seed(seed, k)))
    out = {"division": spec, "nodes": num_nodes, "seed": seed,
           "train_s": time.perf_counter() - t0, "ranks": {}}
    test_acc = lambda w: _correct(w, splits.test_x, splits.test_y) / len(splits.test_y)
    for rank in ranks:
        t1 = time.perf_counter()
        options = replace(work.space, gram_rank=rank)
        spaces, counts, vals, sizes = [], [], [], []
        for local, x_tr, y_tr, x_val, y_val, nseed in nodes:
            center = local.space.matrix
            layer = build_layer_space(center, (x_tr, y_tr), x_val, y_val, options, nseed)
            reply = encode_layer_space(layer, splits.num_features, 10, eps=settings.eps,
                                       num_train=len(y_tr), num_val=len(y_val),
                                       val_accuracy=local.val_accuracy)
            sizes.append(content_bytes(reply))
            space, metrics = decode_reply(reply, shapes, "gram", rank, labels=True)
            spaces.append(space)
            counts.append(metrics["num-train-examples"])
            vals.append((x_val, y_val))
        auto, _, _ = _selected(spaces, counts, vals, settings)
        closed = aggregate_gram(spaces, counts, point="closed-form", ridge=settings.gram_ridge)
        row = {}
        for name, result in (("auto", auto), ("closed-form", closed)):
            w = result.point.reshape(10, -1)
            good = sum(passes(_correct(w, x, y), len(y), settings.eps) for x, y in vals)
            row[name] = {"accuracy": test_acc(w), "method": result.method, "good_enough": int(good)}
        out["ranks"][str(rank)] = {"bytes_up_per_node": float(np.mean(sizes)), **row,
                                   "wall_s": time.perf_counter() - t1}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path(default_out("gram_rank")))
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--resume", action="store_true", help="keep the trials in --out")
    parser.add_argument("--ranks", nargs="+", default=[str(r) for r in RANKS],
                        help="gram-rank values to compare (0: the full matrix)")
    args = parser.parse_args()
    ranks = tuple(r if r == "auto" else int(r) for r in args.ranks)
    rows_note = {"note": "auto = rank max(32, ceil(size / 16)) in float16 (50 for 785)"}
    stored = json.loads(args.out.read_text()) if args.resume and args.out.exists() else {}
    rows = stored["records"][0]["trials"] if "records" in stored else stored.get("trials", [])
    done = {(r["division"], r["nodes"], r["seed"]) for r in rows}
    with compute_threads():
        for seed in args.seeds:
            for spec, k in DIVISIONS:
                if (spec, k, seed) in done:
                    continue
                row = trial(spec, k, seed, ranks, args.dataset)
                rows.append(row)
                write_envelope("gram_rank", args.out, {**rows_note, "trials": rows},
                               seeds=args.seeds)
                cells = "  ".join(f"r={r} {v['bytes_up_per_node'] / 1e3:.0f} KB {v['auto']['accuracy']:.3f}"
                                  for r, v in row["ranks"].items())
                print(f"{spec} K={k} seed {seed}: {cells}", flush=True)
    print()
    print("| division | gram-rank | bytes up per node | auto (default point) | closed-form | "
          "good enough (auto, min over seeds) |")
    print("| --- | --- | ---: | --- | --- | --- |")
    for spec, k in DIVISIONS:
        mine = [r for r in rows if r["division"] == spec and r["seed"] in args.seeds]
        for rank in ranks:
            cells = [r["ranks"][str(rank)] for r in mine]
            def acc(p: str, cells: list = cells) -> str:
                return (f"{np.mean([c[p]['accuracy'] for c in cells]):.4f} ("
                        f"{np.std([c[p]['accuracy'] for c in cells]):.4f})")
            good = min(c["auto"]["good_enough"] for c in cells)
            print(f"| {spec} K={k} | {rank or 'full'} | {np.mean([c['bytes_up_per_node'] for c in cells]):,.0f} "
                  f"| {acc('auto')} | {acc('closed-form')} | {good}/{k} |")
    print(f"\nmean (std) test accuracy over seeds {sorted({r['seed'] for r in rows})}; JSON: {args.out}")


if __name__ == "__main__":
    main()
