"""Which Gram point is best, on every division: closed-form (RegMean), pooled, lda, best,
and the default (the selection round's choice on the nodes' validation data).

    python3 benchmarks/gram_points.py --seeds 0 1 2 3 4

For each label division and seed, on Fashion-MNIST with the run's defaults (logistic
model, ``space='gram'``, eps 0.4), every node does what a node does in a run
(``gems_fl.protocol.node.build_local_space``: train its model, find its Gram space, label
moments included) and its reply goes through the wire format and the server's checks
(``encode_layer_space`` -> ``decode_reply``). The server's three points are then formed
from the same replies (``aggregate_gram``) and scored on the 5000 test images; each node
checks each point on its own validation data against its eps (the evaluate round's rule),
and the table says on how many nodes it is good enough. Averaged is the plain mean of
the local models. Untuned, no public data, one round of spaces. ``auto`` is the run's
default (``gram-point=auto pooled-ridge=auto``): the pooled point for every ridge of
``POOLED_RIDGES``, the LDA point for every shrinkage of ``LDA_SHRINKAGES`` and the
closed-form center are scored on each node's validation split
(:func:`gems_fl.geometry.selection.score_candidates`, what a node does in the selection
round) and the server keeps the best by pooled validation accuracy
(:func:`~gems_fl.geometry.selection.choose_candidate`), as the strategy does.

``--refine R`` also takes R refinement steps from the default point (its logit scale
applied, as a run with ``refine-rounds`` does) with the run's ``refine-method`` and
``refine-l2``: the pooled gradient is the row-weighted sum of the nodes' gradients, i.e.
the gradient on the union of their training rows, and the curvature the pooled Gram
matrix of the decoded replies (``refinement_offline.refine``, the protocol's step rule).

Prints a table and writes JSON (``--out``, default ``results/benchmarks/gram_points.json``).
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

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper:3", "--refine", "5"]]
sys.path.insert(0, str(ROOT / "benchmarks"))  # refinement_offline's step rule

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.data.nodes import node_seed
from gems_fl.geometry.choices import LDA_SHRINKAGES, POOLED_RIDGES
from gems_fl.geometry.eps import passes
from gems_fl.geometry.points import aggregate_gram
from gems_fl.geometry.selection import TEMPERATURES, choose_candidate, score_candidates
from gems_fl.learning.threads import compute_threads
from gems_fl.protocol.node import build_local_space, encode_layer_space
from gems_fl.protocol.replies import decode_reply
from gems_fl.settings import Settings
from gems_fl.settings.options import node_work

# The studies' divisions. K=2 is the disjoint split: the appendix's K=2 gives both nodes
# classes 0-4, so no point can classify 5-9 (every row there is near 0.44).
DIVISIONS = [("0,1,2,3,4/5,6,7,8,9", 2), ("paper", 3), ("paper", 5),
             ("dirichlet:0.05", 5), ("dirichlet:0.1", 5), ("dirichlet:0.5", 5),
             ("dirichlet:0.05", 20), ("dirichlet:0.1", 20), ("dirichlet:0.5", 20)]
# `best` (the best pooled fit inside every space) was measured here and retired: its
# column in results/benchmarks/gram_points*.json comes from the version that had it
POINTS = ("closed-form", "pooled", "lda", "auto")


def _correct(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> int:
    return int(((x @ w[:, :-1].T + w[:, -1]).argmax(axis=1) == y).sum())


def trial(division_spec: str, num_nodes: int, seed: int, refine_steps: int = 0,
          gram_rank: str = "0", dataset: str = "fashion-mnist") -> dict:
    settings = Settings(dataset=dataset, label_division=division_spec, seed=seed,
                        label_moments=True, gram_rank=gram_rank)
    splits = load_dataset(dataset, seed=seed)
    division = parse_division(division_spec, num_nodes, splits.num_classes)
    work = node_work(settings)
    shapes = {"weight": (10, splits.num_features), "bias": (10,)}
    spaces, counts, vals, locals_, trains = [], [], [], [], []
    t0 = time.perf_counter()
    for k in range(num_nodes):
        x_tr, y_tr, x_val, y_val = node_data(splits, division, k, seed)
        local = build_local_space(x_tr, y_tr, x_val, y_val, 10, work, node_seed(seed, k))
        reply = encode_layer_space(local.layer, splits.num_features, 10, eps=settings.eps,
                                   num_train=local.num_train, num_val=local.num_val,
                                   val_accuracy=local.val_accuracy)
        space, metrics = decode_reply(reply, shapes, "gram", settings.gram_rank, labels=True)
        spaces.append(space)
        counts.append(metrics["num-train-examples"])
        vals.append((x_val, y_val))
        trains.append((x_tr, y_tr))
        locals_.append(space.matrix)
    nodes_s = time.perf_counter() - t0
    test_acc = lambda w: _correct(w, splits.test_x, splits.test_y) / len(splits.test_y)
    out = {"division": division_spec, "nodes": num_nodes, "seed": seed, "nodes_s": nodes_s,
           "averaged": test_acc(np.mean(locals_, axis=0)),
           "local_mean": float(np.mean([test_acc(w) for w in locals_])), "points": {}}
    for point in POINTS:
        t1 = time.perf_counter()
        if point == "auto":
            result, ridge, scale = _selected(spaces, counts, vals, settings)
        else:
            reg = 1e-2 if point == "lda" else 1e-3  # pooled ridge, or the LDA shrinkage
            result, ridge = aggregate_gram(spaces, counts, point=point, ridge=settings.gram_ridge,
                                           pooled_ridge=reg), reg
        if point == "auto":
            result_auto = result
        w = result.point.reshape(10, -1)
        good = sum(passes(_correct(w, x, y), len(y), settings.eps) for x, y in vals)
        out["points"][point] = {
            "accuracy": test_acc(w), "method": result.method, "inside": sum(result.inside),
            "good_enough": int(good), "server_s": time.perf_counter() - t1,
            "pooled_ridge": ridge,
            "chosen": result.method,
        }
    if refine_steps:
        out["refined"] = _refined(result_auto, scale, spaces, counts, trains, settings,
                                  refine_steps, test_acc)
    return out


def _refined(result, scale, spaces, counts, trains, settings, steps, test_acc):
    """Test accuracy after each of ``steps`` refinement steps from the default point."""
    from refinement_offline import refine

    from gems_fl.geometry.pooled import pooled_gram
    from gems_fl.protocol.selection_round import step_ridge
    from gems_fl.settings.options import aggregate_options
    from gems_fl.settings.plan import refine_l2_for

    gram = pooled_gram([s.gram for s in spaces], counts).numpy()
    x = np.vstack([x for x, _ in trains])
    y = np.concatenate([y for _, y in trains])
    models = refine(scale * result.point.reshape(10, -1), x, y, gram, settings.refine_method,
                    refine_l2_for(settings), steps,
                    ridge=step_ridge(result, aggregate_options(settings)))
    return {"method": settings.refine_method, "refine_l2": refine_l2_for(settings),
            "test": [test_acc(w) for w in models]}


def _selected(spaces, counts, vals, settings):
    """The default point (``gram-point=auto pooled-ridge=auto``): the pooled point for each
    ridge, the LDA point for each shrinkage and the closed-form center (the candidates of
    ``selection_round.candidate_points``, in its order), scored on the nodes' validation
    data."""
    results = [aggregate_gram(spaces, counts, point="pooled", ridge=settings.gram_ridge,
                              pooled_ridge=r) for r in POOLED_RIDGES]
    results += [aggregate_gram(spaces, counts, point="lda", ridge=settings.gram_ridge,
                               pooled_ridge=s) for s in LDA_SHRINKAGES]
    results.append(aggregate_gram(spaces, counts, point="closed-form", ridge=settings.gram_ridge))
    ridges = list(POOLED_RIDGES) + list(LDA_SHRINKAGES) + [None]
    candidates = np.stack([r.point.reshape(10, -1) for r in results])
    scores = [score_candidates(candidates, x, y, TEMPERATURES) for x, y in vals]
    choice = choose_candidate([s[0] for s in scores], [s[1] for s in scores],
                              [len(y) for _, y in vals], TEMPERATURES)
    return results[choice.index], ridges[choice.index], choice.temperature


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--divisions", nargs="+", default=None,
                        help="SPEC:K items, e.g. paper:5 dirichlet:0.1:20 (default: all)")
    parser.add_argument("--refine", type=int, default=0, metavar="R",
                        help="also R refinement steps from the default point")
    parser.add_argument("--gram-rank", default="0",
                        help="the nodes' Gram form (setting gram-rank; default 0, the whole matrix)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the trials already in --out and run only the others")
    parser.add_argument("--out", type=Path, default=Path(default_out("gram_points")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    divisions = DIVISIONS if not args.divisions else [
        (d.rsplit(":", 1)[0], int(d.rsplit(":", 1)[1])) for d in args.divisions]
    stored = json.loads(args.out.read_text()) if args.resume and args.out.exists() else {}
    rows = stored["records"][0]["trials"] if "records" in stored else stored.get("trials", [])
    done = {(r["division"], r["nodes"], r["seed"]) for r in rows}
    with compute_threads():
        for seed in args.seeds:  # seed-major: a stopped run still covers every division
            for spec, k in divisions:
                if (spec, k, seed) in done:
                    continue
                row = trial(spec, k, seed, args.refine, args.gram_rank, args.dataset)
                rows.append(row)
                write_envelope("gram_points", args.out, {"trials": rows, "complete": False},
                               seeds=args.seeds)
                cells = "  ".join(f"{p} {v['accuracy']:.3f} ({v['good_enough']}/{k})"
                                  for p, v in row["points"].items())
                if "refined" in row:
                    cells += f"  refined 1/5/{args.refine}: " + " / ".join(
                        f"{row['refined']['test'][i]:.3f}" for i in (0, 4, -1))
                print(f"{spec} K={k} seed {seed}: averaged {row['averaged']:.3f}  {cells}",
                      flush=True)
    write_envelope("gram_points", args.out, {"trials": rows, "complete": True}, seeds=args.seeds)
    print()
    refined = [f"refined {args.refine}"] if args.refine else []
    print("| division | K | Averaged | " + " | ".join([*POINTS, *refined]) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in [*POINTS, *refined]) + " |")
    for spec, k in divisions:
        mine = [r for r in rows if r["division"] == spec and r["nodes"] == k
                and r["seed"] in args.seeds]
        cell = lambda vals: f"{np.mean(vals):.3f} ({np.std(vals):.3f})"
        cells = []
        for p in POINTS:
            acc = [r["points"][p]["accuracy"] for r in mine]
            good = min(r["points"][p]["good_enough"] for r in mine)
            cells.append(f"{cell(acc)}, good enough on >= {good}/{k}")
        if all("refined" in r for r in mine) and mine:
            cells.append(cell([r["refined"]["test"][-1] for r in mine]))
        print(f"| {spec} | {k} | {cell([r['averaged'] for r in mine])} | " + " | ".join(cells) + " |")
    print(f"\nmean (std) test accuracy over seeds {args.seeds}; JSON: {args.out}")


if __name__ == "__main__":
    main()
