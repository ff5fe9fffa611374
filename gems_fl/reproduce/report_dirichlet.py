"""Study 7's table and plot: the Gram points and refinement rounds on Dirichlet divisions."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from gems_fl.reproduce.report import (
    Report,
    _acc,
    _seeds,
    _select,
    _space_cells,
    _verified,
    markdown,
    mean_std,
)


def dirichlet_section(report: Report, options) -> None:  # noqa: ANN001 - plan.Options
    """Dirichlet divisions: Averaged, the Gram points, refined rounds, Global, Raw."""
    steps = sorted({1, min(5, options.refine_rounds), options.refine_rounds} - {0})
    payload, tables = {}, []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, model in zip(axes, ("logistic", "mlp")):
        points = list(options.dirichlet_points) + (["refined"] if model == "logistic"
                                                   and options.refine_rounds else [])
        rows, entry = [], {}
        for alpha in options.dirichlet_alphas:
            spec = f"dirichlet:{alpha:g}"
            for k in options.dirichlet_ks:
                by_point = {p: _select(report.records, 7, K=k, division=spec, model=model,
                                       point=p) for p in points}
                base = next((by_point[p] for p in points if by_point[p]), [])
                if not base:
                    continue
                cell = {c: [_acc(r, c) for r in base]
                        for c in ("Averaged", "Global", "Raw converged")}
                for p in options.dirichlet_points:
                    cell[p] = _space_cells(by_point[p])
                refined = {}
                for r in by_point.get("refined", []):
                    rounds = r["outcome"].get("refinement") or []
                    for step in steps:
                        hit = next((x for x in rounds if x.get("step") == step), None)
                        if hit is not None:
                            refined.setdefault(step, {"accuracy": [], "bytes": []})
                            refined[step]["accuracy"].append(hit["test_accuracy"])
                            refined[step]["bytes"].append(hit["cumulative_bytes"])
                cell["refined"] = {str(st): v for st, v in refined.items()}
                entry[f"{k}:{spec}"] = {"K": k, "division": spec, **cell,
                                        "seeds": _seeds(base)}
                default = options.dirichlet_points[-1]
                rows.append(
                    [spec, str(k), mean_std(cell["Averaged"])]
                    + [mean_std(cell[p]["GEMS"]) for p in options.dirichlet_points]
                    + [f"{mean_std(v['accuracy'])}, {np.mean(v['bytes']) / 1e6:.1f} MB"
                       for v in (refined.get(st, {"accuracy": [], "bytes": [0]})
                                 for st in (steps if "refined" in points else []))]
                    + [mean_std(cell[default]["GEMS tuned"]), _verified(cell[default]),
                       mean_std(cell["Global"]), mean_std(cell["Raw converged"])])
                ax.errorbar([f"{spec[10:]}, K={k}"], [np.mean(cell[default]["GEMS"])],
                            yerr=[np.std(cell[default]["GEMS"])], marker="o", ls="none",
                            color="C0", label=None)
        if not rows:
            continue
        payload[model] = entry
        header = (["division", "K", "Averaged"]
                  + [f"GEMS {p}" for p in options.dirichlet_points]
                  + ([f"refined {st} (bytes so far)" for st in steps]
                     if "refined" in points else [])
                  + [f"GEMS tuned ({options.dirichlet_points[-1]})",
                     f"h_G good enough ({options.dirichlet_points[-1]})",
                     "Global", "Raw converged"])
        tables.append(f"**{model}**\n\n" + markdown(header, rows))
        ax.set_title(f"{model}: GEMS ({options.dirichlet_points[-1]}) by division")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    note = (report._seed_note(_select(report.records, 7)) + "GEMS untuned, one round of "
            "spaces (with pooled-ridge=auto, a selection round in which the nodes score "
            "the candidate ridges on their validation data). `refined s`: the logistic "
            "model after s Bohning steps (refine-rounds), with the protocol's bytes up "
            "and down so far. \"h_G good enough\": the nodes whose own validation check "
            "passed, summed over seeds.\n")
    report._save_table("study7_dirichlet", "7. Dirichlet divisions", "\n\n".join(tables),
                     payload, note)
    report._save_plot(fig, "study7_dirichlet.png")
