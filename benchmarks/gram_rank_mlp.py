"""The MLP's output layer with a compressed Gram reply: bytes up against accuracy.

    python3 benchmarks/gram_rank_mlp.py --seeds 0 1 2

Each run is the real ServerApp and ClientApp code over an in-process Grid, with the
run's defaults except ``model='mlp'``, Fashion-MNIST, ``public-samples=0`` (untuned) and
``label-division`` (the paper's K=5 and Dirichlet(0.1) at K=5), once per ``gram-rank``
(``auto``, the default, and 0, the whole matrix). The output layer's Gram matrix is
``(width + 1) x (width + 1)`` over the merged hidden features, so ``auto`` sends a rank-32
factor and the residual diagonal for any merged width above 64. Prints, per division and
rank, the output round's bytes up per node, GEMS's test accuracy and on how many nodes
``h_G`` passed the nodes' own check, and writes JSON (``--out``, default
``results/benchmarks/gram_rank_mlp.json``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing it
sys.path.insert(0, str(ROOT / "benchmarks"))

from envelope import default_out, write_envelope

#: a run of seconds that benchmarks/smoke.py (and CI) runs so this script cannot rot
SMOKE = [["--dataset", "digits", "--divisions", "paper", "--ranks", "auto"]]


def mlp_run(overrides: dict, nodes: int) -> tuple[dict, float, dict]:
    """One untuned MLP run on Fashion-MNIST through the real apps over an in-process Grid,
    the run's defaults plus ``overrides``: ``(results, wall seconds, the output round)``."""
    from flwr.app import Context, RecordDict

    from client_app import app as client_app
    from gems_fl.protocol.inprocess import InProcessGrid
    from gems_fl.running.run_config import app_config
    from gems_fl.serverapp import run_server

    with tempfile.TemporaryDirectory() as out:
        cfg = {**app_config(ROOT), "model": "mlp", "dataset": "fashion-mnist",
               "public-samples": 0, **overrides, "output-dir": out}
        grid = InProcessGrid(client_app, nodes, cfg)
        ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=cfg)
        t0 = time.perf_counter()
        results = run_server(grid, ctx)
        wall = time.perf_counter() - t0
    output = next(r for r in results["rounds"]
                  if r.get("layer") is None and not r.get("selection") and not r.get("refine"))
    return results, wall, output


def run_once(division: str, seed: int, rank: str, nodes: int,
             dataset: str = "fashion-mnist") -> dict:
    from gems_fl.geometry.choices import gram_rank_for

    results, wall, output = mlp_run({"label-division": division, "seed": seed,
                                     "gram-rank": rank, "dataset": dataset}, nodes)
    width = results["hidden_widths"][-1]
    ver = results["verification"]
    return {"division": division, "seed": seed, "gram_rank": rank, "nodes": nodes,
            "width": width, "rank_sent": gram_rank_for(rank, width + 1),
            "output_up_per_node": output["bytes_received"] / len(output["nodes"]),
            "gems": results["rows"]["GEMS"]["accuracy"], "method": results["intersection"]["method"],
            "good_enough": ver["good_enough"], "answered": ver["answered"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--divisions", nargs="+", default=["paper", "dirichlet:0.1"])
    parser.add_argument("--ranks", nargs="+", default=["auto", "0"])
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(default_out("gram_rank_mlp")))
    parser.add_argument("--dataset", default="fashion-mnist")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        for division in args.divisions:
            for rank in args.ranks:
                row = run_once(division, seed, rank, args.nodes, args.dataset)
                rows.append(row)
                write_envelope("gram_rank_mlp", args.out, rows, seeds=args.seeds)
                print(f"{division} seed {seed} gram-rank {rank}: width {row['width']}, rank sent "
                      f"{row['rank_sent']}, output round up {row['output_up_per_node']:,.0f} B/node, "
                      f"GEMS {row['gems']:.4f} ({row['method']}), good enough "
                      f"{row['good_enough']}/{row['answered']} ({row['wall_s']:.0f} s)", flush=True)
    print(f"\nmean (std) over seeds {args.seeds}, {args.nodes} nodes, Fashion-MNIST MLP, untuned")
    print("| division | gram-rank | rank sent | output round up per node | GEMS | good enough |")
    print("| --- | --- | --- | ---: | --- | --- |")
    for division in args.divisions:
        for rank in args.ranks:
            mine = [r for r in rows if r["division"] == division and r["gram_rank"] == rank]
            acc = [r["gems"] for r in mine]
            print(f"| {division} | {rank} | {sorted({r['rank_sent'] for r in mine})} | "
                  f"{np.mean([r['output_up_per_node'] for r in mine]):,.0f} | "
                  f"{np.mean(acc):.4f} ({np.std(acc):.4f}) | "
                  f"{sum(r['good_enough'] for r in mine)}/{sum(r['answered'] for r in mine)} |")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
