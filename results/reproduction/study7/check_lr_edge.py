"""Study 7's FedAvg/FedProx-SGD baselines: was the rate grid wide enough, and do the
stored tuning runs recompute to the digit?

Each baseline trial chose its local SGD rate from its grid (``Options.sgd_lrs``, 0.01-0.3,
for the MLP; ``Options.logistic_sgd_lrs``, 0.01-3.0, for the logistic model) by
the pooled node validation accuracy after ``sgd_tune_rounds`` rounds. Where a trial chose
its grid's largest rate, a larger one might have scored better still, and the baseline
would then be held back by its recipe. For every such stored trial this script runs the
same short validation run (never looking at the test set) twice: at the chosen rate, which
must give the stored score again where the trial ran with replies summed in node order
(from ``270b265`` on), and at the grid's next step beyond its top (:func:`next_rate`), to
say whether it would have won against the chosen rate's recomputed score.

``python3 check_lr_edge.py`` reads ``trials/`` next to this file and writes
``lr_edge.md`` and ``lr_edge.json`` there (2 worker processes).
"""
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gems_lab.fedavg import choose_lr


def next_rate(top: float) -> float:
    """The grids' next step (about x3, on the 1-3 series) beyond ``top``: 0.3 -> 1, 3 -> 10."""
    return float(f"{top * 10 / 3:.1g}")


def validation_score(record: dict, lr: float) -> float:
    """The trial's own tuning run (:func:`choose_lr`) at the single rate ``lr``."""
    fed = record["federated"]
    return choose_lr(record["run_config"], record["num_nodes"], record["kind"], (lr,),
                     fed["tune_rounds"], fed["local_epochs"], fed["proximal_mu"]).scores[lr]


def check(record: dict) -> dict:
    tuning, labels = record["outcome"]["tuning"], record["labels"]
    following = next_rate(max(tuning["grid"]))
    return {**{k: labels[k] for k in ("model", "division", "K", "strategy", "seed")},
            "git_commit": record["git_commit"], "chosen_lr": tuning["lr"],
            "stored_val": tuning["val_accuracy"][tuning["grid"].index(tuning["lr"])],
            "recomputed_val": validation_score(record, tuning["lr"]),
            "next_lr": following, "next_val": validation_score(record, following)}


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    t0 = time.perf_counter()
    records = [json.loads(p.read_text()) for p in sorted((here / "trials").glob("*.json"))]
    baselines = [r for r in records if r["kind"] != "gems"
                 and r["federated"].get("optimizer") == "sgd"]
    at_top = [r for r in baselines
              if r["outcome"]["tuning"]["lr"] == max(r["outcome"]["tuning"]["grid"])]
    print(f"{len(at_top)} of {len(baselines)} baseline trials chose the grid's top rate",
          file=sys.stderr)
    rows = []
    with ProcessPoolExecutor(2) as pool:
        for i, row in enumerate(pool.map(check, at_top), start=1):
            rows.append(row)
            print(f"[{i}/{len(at_top)}] {row}", file=sys.stderr, flush=True)
    # Against the recomputed score: the same code as the run at the next rate (trials before
    # 270b265 summed the replies in sampling order, and their stored scores carry that).
    wins = sorted(r["next_val"] - r["recomputed_val"] for r in rows
                  if r["next_val"] > r["recomputed_val"])
    by_commit: dict[str, list[float]] = {}
    for r in rows:
        by_commit.setdefault(r["git_commit"][:7], []).append(abs(r["recomputed_val"] - r["stored_val"]))
    same = "; ".join(f"trials at `{c}`: {sum(d == 0 for d in ds)} of {len(ds)} recompute to the "
                     f"digit (largest difference {max(ds):.4f})" for c, ds in by_commit.items())
    tops = sorted({r["chosen_lr"] for r in rows})
    counts = ", ".join(f"{sum(r['chosen_lr'] == t for r in rows)} at {t:g}" for t in tops)
    summary = (f"{len(baselines)} stored baseline trials; {len(at_top)} chose their grid's top "
               f"rate ({counts})."
               f" At the next rate, {len(wins)} of those would have scored higher on "
               "validation than the chosen rate recomputed" + (f", by {wins[0]:.4f}-{wins[-1]:.4f}" if wins else "")
               + f". Recomputing the chosen rate's validation run: {same}.")
    lines = ["# Study 7: was the SGD rate grid wide enough?", "",
             f"Command: `python3 check_lr_edge.py` ({time.perf_counter() - t0:.0f} s wall, "
             "2 workers).", "", summary, "",
             "| model | division | K | strategy | seed | commit | chosen lr | stored val acc | "
             "recomputed | next lr | val acc there |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['division']} | {r['K']} | {r['strategy']} | {r['seed']} | "
              f"`{r['git_commit'][:7]}` | {r['chosen_lr']:g} | {r['stored_val']:.4f} | "
              f"{r['recomputed_val']:.4f} | {r['next_lr']:g} | {r['next_val']:.4f} |" for r in rows]
    (here / "lr_edge.md").write_text("\n".join(lines) + "\n")
    (here / "lr_edge.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    print(summary)
