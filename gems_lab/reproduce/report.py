"""Tables (markdown, mean (std) over seeds), plots (PNG) and JSON from trial outcomes."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from gems_fl.settings import Settings
from gems_lab.reproduce.plan import LATER_SETTINGS

BASELINES = ("Global", "Local", "Averaged")
NN_BASELINES = ("Global", "Local", "Averaged", "Ensemble")
RAW = ("Raw", "Raw converged")
VERIFY_NOTE = ("Second table: GEMS per output space; \"h_G good enough\" counts the nodes "
               "whose own validation check found h_G good enough (accuracy >= their eps), "
               "summed over seeds, out of the nodes that answered. For gram, \"intersection "
               "found\" counts the seeds where h_G lies inside every node's Gram space.\n")
CURVE_ROWS = ("GEMS tuned", "Local tuned", "Averaged tuned", "Raw")


def mean_std(values: list[float]) -> str:
    """``0.8468 (0.0031)``: mean and population std over seeds; ``n/a`` when empty."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{np.mean(values):.4f} ({np.std(values):.4f})"


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def rank_order(rank: int | str) -> tuple[int, int, int]:
    """The gram-rank sweep's order: the fixed ranks ascending, ``auto``, the full matrix."""
    return (rank == 0, rank == "auto", rank if isinstance(rank, int) else 0)


def rank_label(rank: int | str) -> str:
    return "full" if rank == 0 else "auto (default)" if rank == "auto" else f"r={rank}"


def point_counts(points: list[str | None]) -> str:
    """How often each point was kept, most often first: ``"gaussian 4, pooled 1"``."""
    counts = Counter(p or "?" for p in points)
    return ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda i: (-i[1], i[0])))


def select_records(records: list[dict], study: int, **labels) -> list[dict]:
    return [r for r in records if study in r["studies"]
            and all(r["labels"].get(k) == v for k, v in labels.items())]


def row_accuracy(record: dict, row: str) -> float | None:
    return record["outcome"]["rows"].get(row, {}).get("accuracy")


def main_rows(records: list[dict], study: int, **labels) -> list[dict]:
    """:func:`select_records` without the gram-rank sweep's other trials (``auto``, the default,
    is the main trial itself)."""
    return [r for r in select_records(records, study, **labels)
            if r["labels"].get("gram_rank", "auto") == "auto"]


def _setup_key(k: int, division: str) -> str:
    return str(k) if division == "paper" else f"{k}:{division}"


def _division_label(division: str) -> str:
    return "appendix" if division == "paper" else division


def cells_by_space(recs: list[dict]) -> dict:
    ver = [r["outcome"].get("verification") or {} for r in recs]
    return {"GEMS": [row_accuracy(r, "GEMS") for r in recs],
            "GEMS tuned": [row_accuracy(r, "GEMS tuned") for r in recs],
            "good_enough": [v.get("good_enough") for v in ver],
            "answered": [v.get("answered") for v in ver],
            "intersection_found": [r["outcome"]["intersection_found"] for r in recs],
            "seeds": seed_count(recs)}


def verified_cell(cells: dict) -> str:
    """``9/10``: nodes where h_G is good enough, of those that answered, over seeds."""
    pairs = [(g, a) for g, a in zip(cells["good_enough"], cells["answered"]) if a]
    if not pairs:
        return "n/a"
    return f"{sum(g for g, _ in pairs)}/{sum(a for _, a in pairs)}"


def _bar_payload(payload: dict, spaces: list[str]) -> dict:
    """Flat ``{setup: {column: values}}`` for :meth:`Report._bars`."""
    out = {}
    for v in payload.values():
        label = f"{v['K']}" if v["division"] == "paper" else f"{v['K']} ({v['division']})"
        out[label] = {**{c: v[c] for c in v if isinstance(v[c], list)},
                      **{f"GEMS one-shot ({s})": v["spaces"][s]["GEMS"] for s in spaces},
                      **{f"GEMS tuned ({s})": v["spaces"][s]["GEMS tuned"] for s in spaces}}
    return out


def seed_count(records: list[dict]) -> int:
    return len({r["labels"]["seed"] for r in records})


class Report:
    """Collects each study's table, plots and data, then writes them to ``folder``."""

    def __init__(self, folder: Path, records: list[dict], meta: dict) -> None:
        self.folder = folder
        self.records = records
        self.meta = meta
        self.sections: list[str] = []
        self.data: dict[str, object] = {"meta": meta}
        self.files: list[str] = []

    def _save_table(self, stem: str, title: str, table: str, payload: object, note: str = "") -> None:
        text = f"## {title}\n\n{table}\n{note}\n"
        (self.folder / f"{stem}.md").write_text(text)
        (self.folder / f"{stem}.json").write_text(json.dumps(payload, indent=2))
        self.files += [f"{stem}.md", f"{stem}.json"]
        self.sections.append(text)
        self.data[stem] = payload

    def _save_plot(self, fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(self.folder / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.files.append(name)
        self.sections.append(f"![{name}]({name})\n")

    # Study 1 -------------------------------------------------------------------
    def convex_table(self, setups: list[tuple[int, str]], spaces: list[str]) -> None:
        rows, payload = [], {}
        for k, division in setups:
            by_space = {s: main_rows(self.records, 1, K=k, division=division, space=s) for s in spaces}
            base = next((by_space[s] for s in spaces if by_space[s]), [])
            cells = {c: [row_accuracy(r, c) for r in base] for c in BASELINES + RAW}
            payload[_setup_key(k, division)] = {
                "K": k, "division": division, **cells, "seeds": seed_count(base),
                "spaces": {s: cells_by_space(by_space[s]) for s in spaces}}
        rows = [[str(v["K"]), _division_label(v["division"])]
                + [mean_std(v[c]) for c in BASELINES]
                + [mean_std(v["spaces"][s][c]) for s in spaces for c in ("GEMS", "GEMS tuned")]
                + [mean_std(v[c]) for c in RAW] for v in payload.values()]
        header = (["K", "division", *BASELINES]
                  + [f"{c} ({s})" for s in spaces for c in ("GEMS untuned", "GEMS tuned")] + list(RAW))
        table = markdown(header, rows) + "\n" + self._space_table(payload, spaces)
        self._save_table("study1_convex", "1. Convex table (logistic regression)", table, payload,
                         self._seed_note(select_records(self.records, 1)) + VERIFY_NOTE)
        self._bars("study1_convex.png", "Convex: test accuracy by setup", _bar_payload(payload, spaces),
                   tuple(BASELINES) + tuple(c for s in spaces for c in (f"GEMS one-shot ({s})", f"GEMS tuned ({s})")) + RAW)

    def _space_table(self, payload: dict, spaces: list[str], width: bool = False) -> str:
        rows = []
        for v in payload.values():
            for s in spaces:
                c = v["spaces"][s]
                row = [str(v["K"]), _division_label(v["division"]), s, mean_std(c["GEMS"]),
                       mean_std(c["GEMS tuned"]), verified_cell(c),
                       f"{sum(bool(f) for f in c['intersection_found'])}/{len(c['intersection_found'])}"]
                if width:
                    w = c.get("width", [])
                    row.append(f"{np.mean(w):.1f} ({np.std(w):.1f})" if w else "n/a")
                rows.append(row)
        header = ["K", "division", "space", "GEMS untuned", "GEMS tuned",
                  "h_G good enough (nodes)", "intersection found (seeds)"]
        return markdown(header + (["GEMS width"] if width else []), rows)

    def gram_rank(self) -> None:
        """Study 1's gram-rank sweep: bytes up per node against untuned GEMS accuracy."""
        groups = defaultdict(list)
        for r in select_records(self.records, 1, K=5, space="gram"):
            if "gram_rank" in r["labels"]:
                groups[r["labels"]["gram_rank"]].append(r)
        if not groups:
            return
        order = sorted(groups, key=rank_order)  # then auto, the full matrix (0) last
        payload, rows = {"ranks": []}, []
        for rank in order:
            recs = groups[rank]
            up = [r["outcome"].get("bytes_up_per_node") for r in recs]
            points = [r["outcome"].get("method") for r in recs]
            entry = {"gram_rank": rank, "bytes_up_per_node": up, "point": points,
                     **cells_by_space(recs)}
            payload["ranks"].append(entry)
            rows.append([rank_label(rank), f"{np.mean(up):,.0f}",
                         mean_std(entry["GEMS"]), mean_std(entry["GEMS tuned"]), verified_cell(entry),
                         point_counts(points)])
        self._save_table("study1_gram_rank", "1b. Gram rank: bytes against accuracy (convex, K=5)",
                         markdown(["gram-rank", "bytes up per node", "GEMS untuned", "GEMS tuned",
                                   "h_G good enough (nodes)", "point kept (seeds)"], rows),
                         payload,
                         "gram-rank r > 0 sends a rank-r factor of each node's Gram matrix and "
                         "the diagonal of the rest, auto a rank that follows the matrix size, "
                         "0 the full matrix; auto is the default (the gram rows of the tables "
                         "above). The bytes include the class Gram matrices in the same form "
                         "(class-grams=auto); with the full matrix above 256 inputs, auto sends "
                         "none (one would be a whole matrix per class), so that row's "
                         "selection round has no gaussian point to choose. "
                         + self._seed_note([r for recs in groups.values() for r in recs]))
        fig, ax = plt.subplots(figsize=(6, 4))
        for entry in payload["ranks"]:
            acc = [a for a in entry["GEMS"] if a is not None]
            ax.errorbar(np.mean(entry["bytes_up_per_node"]), np.mean(acc), yerr=np.std(acc),
                        marker="o", capsize=3)
            ax.annotate(rank_label(entry["gram_rank"]),
                        (np.mean(entry["bytes_up_per_node"]), np.mean(acc)),
                        textcoords="offset points", xytext=(5, 5), fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("bytes up per node")
        ax.set_ylabel("test accuracy (GEMS untuned)")
        ax.set_title("Gram rank: bytes against accuracy, convex, K=5")
        self._save_plot(fig, "study1_gram_rank.png")

    # Study 2 -------------------------------------------------------------------
    def nn_table(self, setups: list[tuple[int, str]], spaces: list[str]) -> None:
        payload = {}
        for k, division in setups:
            by_space = {s: main_rows(self.records, 2, K=k, division=division, space=s) for s in spaces}
            base = next((by_space[s] for s in spaces if by_space[s]), [])
            cfg = base[0]["run_config"] if base else {}
            cells = {c: [row_accuracy(r, c) for r in base] for c in NN_BASELINES + RAW}
            space_cells = {}
            for s in spaces:
                space_cells[s] = cells_by_space(by_space[s])
                space_cells[s]["width"] = [r["outcome"]["hidden_widths"][0] for r in by_space[s]]
            payload[_setup_key(k, division)] = {
                "K": k, "division": division, **cells, "seeds": seed_count(base),
                "eps_j": cfg.get("eps-neuron", self.meta["defaults"]["eps-neuron"]),
                "m_eps": cfg.get("clusters", self.meta["defaults"]["clusters"]),
                "spaces": space_cells}
        rows = [[str(v["K"]), _division_label(v["division"]), str(v["eps_j"]), str(v["m_eps"])]
                + [mean_std(v[c]) for c in NN_BASELINES]
                + [mean_std(v["spaces"][s][c]) for s in spaces for c in ("GEMS", "GEMS tuned")]
                + [mean_std(v[c]) for c in RAW] for v in payload.values()]
        header = (["K", "division", "eps_j", "m_eps", *NN_BASELINES]
                  + [f"{c} ({s})" for s in spaces for c in ("GEMS untuned", "GEMS tuned")] + list(RAW))
        table = markdown(header, rows) + "\n" + self._space_table(payload, spaces, width=True)
        self._save_table("study2_nn", "2. NN table (MLP, layer-wise GEMS; space = output layer's)",
                         table, payload, self._seed_note(select_records(self.records, 2)) + VERIFY_NOTE)
        self._bars("study2_nn.png", "MLP: test accuracy by setup", _bar_payload(payload, spaces),
                   tuple(NN_BASELINES) + tuple(c for s in spaces for c in (f"GEMS one-shot ({s})", f"GEMS tuned ({s})")) + RAW)

    def _bars(self, name: str, title: str, payload: dict, columns: tuple[str, ...]) -> None:
        """Grouped bars, the legend under the axes (never over a bar); a space's one-shot
        GEMS is the hatched bar beside its tuned one, in the same colour."""
        fig, ax = plt.subplots(figsize=(10, 4.8))
        ks = list(payload)
        width = 0.8 / len(columns)
        colours: dict[str, Any] = {}
        palette = iter(plt.get_cmap("tab20").colors[::2] + plt.get_cmap("tab20").colors[1::2])
        for i, col in enumerate(columns):
            means = [np.mean([v for v in payload[k][col] if v is not None] or [np.nan]) for k in ks]
            stds = [np.std([v for v in payload[k][col] if v is not None] or [np.nan]) for k in ks]
            family = col.replace("GEMS one-shot", "GEMS tuned")
            colour = colours.setdefault(family, next(palette))
            ax.bar(np.arange(len(ks)) + i * width, means, width, yerr=stds, label=col, capsize=2,
                   color=colour, hatch="///" if "one-shot" in col else None,
                   edgecolor="white" if "one-shot" in col else None)
        ax.set_xticks(np.arange(len(ks)) + 0.4 - width / 2, [f"K={k}" for k in ks], fontsize=8)
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=7, ncol=min(len(columns), 5), loc="upper center",
                  bbox_to_anchor=(0.5, -0.1), frameon=False)
        self._save_plot(fig, name)

    # Study 3 -------------------------------------------------------------------
    def fine_tuning(self) -> None:
        payload = {}
        tables, figures = [], []
        for model in ("logistic", "mlp"):
            recs = [r for r in select_records(self.records, 3, K=5, model=model, space="ellipsoid")
                    if r["outcome"].get("fine_tuning")]
            if not recs:
                continue
            sizes = recs[0]["outcome"]["fine_tuning"]["sizes"]
            curves = {row: np.array([r["outcome"]["fine_tuning"]["accuracy"][row] for r in recs])
                      for row in CURVE_ROWS}
            payload[model] = {"sizes": sizes, "seeds": len(recs),
                              **{row: {"mean": c.mean(0).tolist(), "std": c.std(0).tolist()}
                                 for row, c in curves.items()},
                              "recipe": {k: recs[0]["outcome"]["fine_tuning"][k]
                                         for k in ("epochs", "lr", "tuned_layers", "stop",
                                                   "max_epochs")
                                         if k in recs[0]["outcome"]["fine_tuning"]}}
            rows = [[str(n)] + [f"{curves[row][:, i].mean():.4f} ({curves[row][:, i].std():.4f})"
                                for row in CURVE_ROWS] for i, n in enumerate(sizes)]
            tables.append(f"**{model}** (K=5)\n\n" + markdown(["public samples", *CURVE_ROWS], rows))
            fig, ax = plt.subplots(figsize=(6.5, 4.6))
            markers = iter("o^sDv<>px*")
            for row, c in curves.items():
                m, s = c.mean(0), c.std(0)
                gems = row.startswith("GEMS")  # drawn on top: the curves often coincide
                ax.plot(sizes, m, marker=next(markers), label=row, zorder=3 if gems else 2,
                        linewidth=2.2 if gems else 1.2, markersize=6 if gems else 4,
                        linestyle="-" if gems else "--")
                ax.fill_between(sizes, m - s, m + s, alpha=0.15)
            ax.set_xlabel("public samples used for tuning")
            ax.set_ylabel("test accuracy")
            ax.set_title(f"Fine-tuning, {model}, K=5 ({len(recs)} seeds)")
            ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                      frameon=False)
            figures.append((fig, f"study3_fine_tuning_{model}.png"))
        recipe = next(iter(payload.values()))["recipe"] if payload else {}
        if recipe.get("stop", "fixed") == "holdout":
            how = (f"at most {recipe.get('max_epochs')} epochs, the epoch and (for the trained "
                   "starts) the factor the start is shrunk by (1, 0.5, 0.2, 0) chosen on a "
                   "held-out 20 % of the sample, then that many epochs on all of it")
        else:
            how = f"{recipe.get('epochs')} epochs"
        layers = recipe.get("tuned_layers")
        which = ("the output layer or every layer, whichever scores better on the held-out "
                 "rows" if layers == "auto" and recipe.get("stop") == "holdout"
                 else f"their `{'last' if layers == 'auto' else layers}` layer(s)")
        note = (f"Every row is tuned with Adam, lr {recipe.get('lr')}, {how}, batch 32, on the "
                f"same nested public samples; pretrained MLPs tune {which}, Raw trains from "
                "scratch.\n")
        self._save_table("study3_fine_tuning", "3. Fine-tuning study", "\n".join(tables), payload, note)
        for fig, name in figures:
            self._save_plot(fig, name)

    # Study 4 -------------------------------------------------------------------
    def model_size(self) -> None:
        rows, payload = [], {"grid": [], "ensemble": None}
        groups = defaultdict(list)
        for r in select_records(self.records, 4):
            groups[(r["labels"]["clusters"], r["labels"]["eps_neuron"])].append(r)
        ensemble = []
        for (m_eps, eps_j), recs in sorted(groups.items()):
            acc = [row_accuracy(r, "GEMS tuned") for r in recs]
            widths = [r["outcome"]["hidden_widths"][0] for r in recs]
            params = [r["outcome"]["rows"]["GEMS tuned"].get("parameters") for r in recs]
            payload["grid"].append({"m_eps": m_eps, "eps_j": eps_j, "accuracy": acc,
                                    "width": widths, "parameters": params})
            rows.append([f"Tuned GEMS (m_eps={m_eps}, eps_j={eps_j})", mean_std(acc),
                         f"{np.mean(widths):.1f} ({np.std(widths):.1f})", f"{np.mean(params):.0f}"])
            ensemble += recs
        if ensemble:
            ens_acc = [row_accuracy(r, "Ensemble") for r in ensemble[: seed_count(ensemble)]]
            stored = {**LATER_SETTINGS, **ensemble[0]["run_config"]}  # as the trial ran
            hidden = sum(Settings.from_run_config(stored).hidden_widths)
            nodes = ensemble[0]["num_nodes"]
            ens_params = ensemble[0]["outcome"]["rows"]["Ensemble"].get("parameters")
            payload["ensemble"] = {"accuracy": ens_acc, "hidden_neurons": nodes * int(hidden),
                                   "parameters": ens_params}
            rows.append(["Ensemble", mean_std(ens_acc), str(nodes * int(hidden)), str(ens_params)])
        self._save_table("study4_model_size", "4. Model size (MLP, K=5)",
                         markdown(["Method", "Accuracy", "# hidden neurons", "# parameters"], rows),
                         payload)
        fig, ax = plt.subplots(figsize=(6, 4))
        for g in payload["grid"]:
            ax.errorbar(np.mean(g["width"]), np.mean(g["accuracy"]), xerr=np.std(g["width"]),
                        yerr=np.std(g["accuracy"]), marker="o", capsize=3,
                        label=f"GEMS tuned m_eps={g['m_eps']}, eps_j={g['eps_j']}")
        if payload["ensemble"]:
            e = payload["ensemble"]
            ax.errorbar(e["hidden_neurons"], np.mean(e["accuracy"]), yerr=np.std(e["accuracy"]),
                        marker="s", color="k", capsize=3, label="Ensemble (untuned)")
        ax.set_xlabel("hidden neurons")
        ax.set_ylabel("test accuracy")
        ax.set_title("Model size vs accuracy, MLP, K=5")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  frameon=False)
        self._save_plot(fig, "study4_model_size.png")

    # Study 5 -------------------------------------------------------------------
    def intersection(self, eps_grid: list[float]) -> None:
        n = len(eps_grid)
        found = np.zeros((n, n))
        acc_mean = np.full((n, n), np.nan)
        cells = []
        for i, e1 in enumerate(eps_grid):
            for j, e2 in enumerate(eps_grid):
                recs = select_records(self.records, 5, eps1=e1, eps2=e2)
                hits = [r for r in recs if r["outcome"]["intersection_found"]]
                found[i, j] = len(hits) / max(1, len(recs))
                accs = [row_accuracy(r, "GEMS") for r in hits]
                if accs:
                    acc_mean[i, j] = np.mean(accs)
                cells.append({"eps1": e1, "eps2": e2, "seeds": len(recs), "found": len(hits),
                              "accuracy_where_found": accs})
        header = ["eps node 1 \\ eps node 2", *[str(e) for e in eps_grid]]
        rows = []
        for i, e1 in enumerate(eps_grid):
            row = [str(e1)]
            for j in range(n):
                c = cells[i * n + j]
                row.append("no intersection" if not c["found"] else
                           f"{mean_std(c['accuracy_where_found'])} [{c['found']}/{c['seeds']}]")
            rows.append(row)
        note = ("Cells: untuned GEMS test accuracy, mean (std) over the seeds where an "
                "intersection was found [found/seeds]; balls, K=2.\n")
        self._save_table("study5_intersection", "5. Intersection analysis (convex, K=2, balls)",
                         markdown(header, rows), {"eps": eps_grid, "cells": cells}, note)
        fig, ax = plt.subplots(figsize=(5.5, 4.5))
        xs, ys = np.meshgrid(eps_grid, eps_grid, indexing="ij")
        ok = found > 0
        sc = ax.scatter(xs[ok], ys[ok], c=acc_mean[ok], s=260, cmap="viridis", vmin=0, vmax=1,
                        edgecolors="k")
        ax.scatter(xs[~ok], ys[~ok], marker="x", color="red", s=120, label="no intersection")
        fig.colorbar(sc, ax=ax, label="GEMS test accuracy (untuned)")
        ax.set_xlabel("eps, node 1")
        ax.set_ylabel("eps, node 2")
        ax.set_title("Intersection analysis (K=2, balls)")
        ax.margins(0.12)
        if (~ok).any():
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, frameon=False)
        self._save_plot(fig, "study5_intersection.png")

    def _seed_note(self, records: list[dict]) -> str:
        return f"Mean (std) over {seed_count(records)} seeds.\n" + self._fresh_note(records)

    def _fresh_note(self, records: list[dict]) -> str:
        """How many GEMS tuned rows kept a fresh model trained to convergence
        (``tune-fresh``), where that option was on."""
        on = [r for r in records
              if r["run_config"].get("tune-fresh",
                                     self.meta.get("defaults", {}).get("tune-fresh", False))
              and row_accuracy(r, "GEMS tuned") is not None]
        if not on:
            return ""
        fresh = sum(bool(r["outcome"]["rows"]["GEMS tuned"].get("fresh")) for r in on)
        return (f"GEMS tuned: the held-out 20 % of the public sample kept a fresh model "
                f"trained to convergence instead of the tuned GEMS model (`tune-fresh`) in "
                f"{fresh} of {len(on)} runs.\n")

    def write_summary(self, header: str) -> Path:
        (self.folder / "results.json").write_text(json.dumps(self.data, indent=2))
        path = self.folder / "README.md"
        path.write_text(header + "\n" + "\n".join(self.sections))
        self.files += ["results.json", "README.md"]
        return path
