"""A small picture of one run's result: per site, the accuracy of h_G, of the site's own
Local model and of Averaged on the site's own data (its test split where it holds one),
with the site's eps, and h_G's accuracy on the server's test set where the run has one. ``gems-fl run --plot`` and ``gems-fl show --plot`` write it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOT_FILE = "result.png"
BARS = (("gems", "GEMS (h_G)", "#1f77b4"), ("local", "Local (the site's own)", "#ff7f0e"),
        ("averaged", "Averaged", "#7f7f7f"))


def site_figures(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per site (sorted by name): its split, h_G's, its own Local's and Averaged's accuracy
    there (None where the run has no such figure), and its eps."""
    eps = {n.get("name"): n.get("eps") for n in results.get("nodes", [])}
    out = []
    for name, entry in sorted((results.get("verification") or {}).get("per_node", {}).items()):
        acc = entry.get("accuracy", {})
        out.append({"name": name, "split": entry.get("split", "val"), "gems": acc.get("gems"),
                    "local": acc.get(f"local.{name}"), "averaged": acc.get("averaged"),
                    "eps": eps.get(name)})
    return out


def server_test_accuracy(results: dict[str, Any]) -> float | None:
    """h_G's accuracy on the server's test set, where the run has one."""
    row = (results.get("rows") or {}).get("GEMS") or {}
    return None if row.get("evaluated_on") or row.get("accuracy") is None else float(row["accuracy"])


def good_enough_text(results: dict[str, Any]) -> str:
    good = results.get("good_enough") or {}
    if not good.get("checked"):
        return ""
    return f"h_G good enough (accuracy >= eps) on {good['sites']} of {good['checked']} sites"


def plot_run(results: dict[str, Any], path: str | Path) -> Path:
    """Write the picture to ``path``; ``ValueError`` when the run holds no site's figures."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    sites = site_figures(results)
    if not sites:
        raise ValueError("the results hold no site's own check of h_G (no evaluate round): "
                         "nothing to plot")
    shown = [(key, label, colour) for key, label, colour in BARS
             if any(s[key] is not None for s in sites)]
    x = np.arange(len(sites))
    width = 0.8 / len(shown)
    fig, ax = plt.subplots(figsize=(min(14.0, max(6.4, 0.5 * len(sites) + 2.5)), 4.4), dpi=100)
    for i, (key, label, colour) in enumerate(shown):
        values = [np.nan if s[key] is None else s[key] for s in sites]
        ax.bar(x - 0.4 + width * (i + 0.5), values, width, label=label, color=colour)
    for i, site in enumerate(sites):
        if site["eps"] is not None:
            ax.hlines(site["eps"], i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      linewidth=1, label="the site's eps" if i == 0 else None)
    test = server_test_accuracy(results)
    if test is not None:
        ax.axhline(test, color="#1f77b4", linestyle=":", linewidth=1.5,
                   label=f"h_G on the server's test set: {test:.3f}")
    many = len(sites) > 6
    ax.set_xticks(x, [s["name"] for s in sites], rotation=45 if many else 0,
                  ha="right" if many else "center", fontsize=8 if many else 9)
    ax.set_xlim(-0.6, len(sites) - 0.4)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("accuracy on the site's own data")
    splits = sorted({s["split"] for s in sites})
    split = splits[0] if len(splits) == 1 else " or ".join(splits)
    ax.set_title(f"Run {results.get('run_id', '')}: each site's check ({split} rows)\n"
                 f"{good_enough_text(results)}", fontsize=9, wrap=True)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28 if many else -0.1), ncol=2,
              fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
