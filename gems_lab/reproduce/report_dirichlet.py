"""Study 7's tables and plot: the Gram points, the paper's spaces, refinement rounds and
local-SGD FedAvg/FedProx on Dirichlet divisions."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from gems_fl.learning.model_kinds import LOGISTIC_KIND, MLP_KIND
from gems_lab.reproduce.report import (
    Report,
    cells_by_space,
    markdown,
    mean_std,
    row_accuracy,
    seed_count,
    select_records,
    verified_cell,
)
from gems_lab.reproduce.report_federated import fed_name, other_bytes, rounds_to_reach


def gems_bytes(record: dict) -> float:
    """Every byte a GEMS trial exchanged, both ways: its protocol rounds plus the server's
    identity check and the nodes' verification round, as study 6 counts them."""
    rounds = record["outcome"]["bytes_per_round"]
    return other_bytes(record) + sum(e["down"] + e["up"] for e in rounds)


def _refined_cells(records: list[dict], steps: list[int]) -> dict[str, dict]:
    """Per refinement step: test accuracy and bytes so far (the protocol's rounds up to
    that step plus :func:`other_bytes`), per seed."""
    out: dict[str, dict] = {}
    for record in records:
        for hit in record["outcome"].get("refinement") or []:
            if hit.get("step") in steps:
                cell = out.setdefault(str(hit["step"]), {"accuracy": [], "bytes": []})
                cell["accuracy"].append(hit["test_accuracy"])
                cell["bytes"].append(other_bytes(record) + hit["cumulative_bytes"])
    return out


def _baseline_cells(records: list[dict], strategies: tuple[str, ...], k: int, spec: str,
                    model: str, targets: dict[str, tuple[float, float]]) -> dict[str, dict]:
    """FedAvg/FedProx-SGD at one division: the mean curve and, per GEMS row of
    ``targets`` (label: mean accuracy, GEMS's bytes), the round and bytes that reach it."""
    out = {}
    for strategy in strategies:
        recs = [r for r in select_records(records, 7, K=k, division=spec, model=model,
                                   strategy=strategy) if r["kind"] == strategy]
        if not recs:
            continue
        acc = np.array([r["outcome"]["accuracy"] for r in recs], dtype=float)
        total = np.array([r["outcome"]["bytes_total"] for r in recs], dtype=float).mean(0)
        m, s = acc.mean(0), acc.std(0)
        reaches = {}
        for label, (target, gems_total) in targets.items():
            hit = rounds_to_reach(m, total, target)
            reaches[label] = None if hit is None else {
                "round": hit[0], "bytes": float(hit[1]), "vs_gems": float(hit[1] / gems_total)}
        out[f"{strategy}-sgd"] = {
            "name": fed_name(strategy, "sgd", recs), "rounds": len(m),
            "accuracy_mean": m.tolist(), "accuracy_std": s.tolist(),
            "last": acc[:, -1].tolist(), "bytes_total": total.tolist(),
            "lr": [r["outcome"].get("lr") for r in recs],
            "tuning": [r["outcome"].get("tuning") for r in recs],
            "federated": recs[0]["federated"], "reaches": reaches, "seeds": seed_count(recs)}
    return out


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e7 else f"{n / 1e6:.2f} MB"


def _reach_cell(got: dict | None, rounds: int) -> str:
    if got is None:
        return f"not in {rounds}"
    return f"round {got['round']}, {_mb(got['bytes'])} ({got['vs_gems']:.1f}x)"


def dirichlet_section(report: Report, options) -> None:  # noqa: C901
    """Dirichlet divisions: Averaged, the paper's spaces, the Gram points, refined rounds,
    Global, Raw converged; then FedAvg/FedProx-SGD against the GEMS rows."""
    steps = sorted({1, min(5, options.refine_rounds), options.refine_rounds} - {0})
    default = options.dirichlet_points[-1]
    points = [*options.dirichlet_spaces, *options.dirichlet_points]
    payload, tables, reach_rows = {}, [], []
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.4))
    for ax, model in zip(axes, (LOGISTIC_KIND.name, MLP_KIND.name)):
        rows, entry, labels, series = [], {}, [], {}
        for alpha in options.dirichlet_alphas:
            spec = f"dirichlet:{alpha:g}"
            for k in options.dirichlet_ks:
                by_point = {p: select_records(report.records, 7, K=k, division=spec, model=model,
                                       point=p) for p in [*points, "refined"]}
                base = next((by_point[p] for p in reversed(points) if by_point[p]), [])
                if not base:
                    continue
                cell = {c: [row_accuracy(r, c) for r in base]
                        for c in ("Averaged", "Global", "Raw converged")}
                for p in points:
                    cell[p] = cells_by_space(by_point[p])
                refined = _refined_cells(by_point["refined"], steps)
                cell["refined"] = refined
                # Every GEMS row a baseline is measured against: its mean accuracy, bytes.
                targets = {f"GEMS {p}": (float(np.mean(cell[p]["GEMS"])),
                                         float(np.mean([gems_bytes(r) for r in by_point[p]])))
                           for p in points if by_point[p]}
                if str(options.refine_rounds) in refined:
                    r_cell = refined[str(options.refine_rounds)]
                    targets[f"refined {options.refine_rounds}"] = (
                        float(np.mean(r_cell["accuracy"])), float(np.mean(r_cell["bytes"])))
                if by_point[default]:  # tuning happens on the server: GEMS's bytes
                    targets[f"GEMS tuned ({default})"] = (
                        float(np.mean([a for a in cell[default]["GEMS tuned"] if a is not None])),
                        targets[f"GEMS {default}"][1])
                cell["baselines"] = _baseline_cells(
                    report.records, options.dirichlet_baselines, k, spec, model, targets)
                entry[f"{k}:{spec}"] = {"K": k, "division": spec, **cell,
                                        "seeds": seed_count(base)}
                rows.append(
                    [spec, str(k), mean_std(cell["Averaged"])]
                    + [mean_std(cell[p]["GEMS"]) for p in points]
                    + [f"{mean_std(refined[str(st)]['accuracy'])}, "
                       f"{_mb(np.mean(refined[str(st)]['bytes']))}"
                       if str(st) in refined else "n/a" for st in steps]
                    + [mean_std(cell[default]["GEMS tuned"]), verified_cell(cell[default]),
                       mean_std(cell["Global"]), mean_std(cell["Raw converged"])])
                for fed in cell["baselines"].values():
                    reach_rows.append((
                        [model, spec, str(k), fed["name"],
                         f"{mean_std(fed['last'])}, {_mb(fed['bytes_total'][-1])}"],
                        {label: f"{targets[label][0]:.4f}: {_reach_cell(got, fed['rounds'])}"
                         for label, got in fed["reaches"].items()}))
                labels.append(f"{alpha:g}, K={k}")
                for name, values in (
                        *[(f"GEMS {p}", cell[p]["GEMS"]) for p in points],
                        (f"refined {options.refine_rounds}",
                         refined.get(str(options.refine_rounds), {}).get("accuracy", [])),
                        *[(f"{fed['name'].split(' ')[0]}, {fed['rounds']} rounds", fed["last"])
                          for fed in cell["baselines"].values()]):
                    series.setdefault(name, {})[labels[-1]] = [v for v in values if v is not None]
        if not rows:
            continue
        payload[model] = entry
        header = (["division", "K", "Averaged"] + [f"GEMS {p}" for p in points]
                  + [f"refined {st} (bytes)" for st in steps]
                  + [f"GEMS tuned ({default})", f"h_G good enough ({default})",
                     "Global", "Raw converged"])
        tables.append(f"**{model}**\n\n" + markdown(header, rows))
        width = 0.8 / max(1, len(series))
        for j, (name, by_label) in enumerate(series.items()):
            xs = [i + (j - (len(series) - 1) / 2) * width for i, lab in enumerate(labels)
                  if by_label.get(lab)]
            ys = [by_label[lab] for lab in labels if by_label.get(lab)]
            if ys:
                ax.errorbar(xs, [np.mean(y) for y in ys], yerr=[np.std(y) for y in ys],
                            marker="o", ms=4, ls="none", capsize=2, label=name)
        ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        ax.set_title(f"{model}: by Dirichlet alpha and K")
        ax.set_xlabel("Dirichlet alpha, nodes")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        # below the axes: inside, it would cover the low points (Averaged-like spaces)
        ax.legend(fontsize=8, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.2),
                  frameon=False)
    if reach_rows:
        labels = list(dict.fromkeys(label for _, cells in reach_rows for label in cells))
        tables.append("**FedAvg / FedProx with local SGD**: the accuracy after the last round "
                      "(mean (std)) and the bytes by then; for each GEMS row of the division, "
                      "its mean accuracy, then the first round whose mean accuracy reaches "
                      "it, the bytes by then and their ratio to that GEMS row's bytes.\n\n"
                      + markdown(["model", "division", "K", "method (lr per seed)",
                                  "last round, bytes"] + [f"reaches {lab}" for lab in labels],
                                 [row + [cells.get(lab, "") for lab in labels]
                                  for row, cells in reach_rows]))
    gems = [r for r in select_records(report.records, 7) if r["kind"] == "gems"]
    paper = (f"`GEMS {', '.join(options.dirichlet_spaces)}`: the paper's output space. "
             if options.dirichlet_spaces else "")
    note = (report._seed_note(gems) + "GEMS untuned, one round of "
            "spaces (for the Gram points with pooled-ridge=auto, a selection round in which "
            "the nodes score the candidate ridges on their validation data). " + paper
            + "`refined s`: the model after s Bohning steps (refine-rounds; the MLP's output "
            "layer on its merged hidden features). Bytes: every record exchanged, both ways, the "
            "server's identity check and the nodes' verification round included, as in "
            "study 6. \"h_G good enough\": the nodes whose own validation check passed, "
            "summed over seeds. FedAvg/FedProx use local SGD at the rate each trial chose on "
            "the pooled node validation splits (study 6's recipe), never on test.\n")
    report._save_table("study7_dirichlet", "7. Dirichlet divisions", "\n\n".join(tables),
                       payload, note)
    report._save_plot(fig, "study7_dirichlet.png")
