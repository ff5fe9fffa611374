"""Tables (markdown, mean (std) over seeds), plots (PNG) and JSON from trial outcomes."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.ticker  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from gems_fl.settings import Settings  # noqa: E402

CONVEX_COLUMNS = ("Global", "Local", "Averaged", "GEMS (ellipsoid)", "GEMS (ball)",
                  "GEMS tuned (ellipsoid)", "GEMS tuned (ball)", "Raw", "Raw converged")
NN_COLUMNS = ("Global", "Local", "Averaged", "Ensemble", "GEMS", "GEMS tuned", "Raw",
              "Raw converged")
CURVE_ROWS = ("GEMS tuned", "Local tuned", "Averaged tuned", "Raw")


def mean_std(values: list[float]) -> str:
    """``0.8468 (0.0031)``: mean and population std over seeds; ``n/a`` when empty."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    return f"{np.mean(values):.4f} ({np.std(values):.4f})"


def rounds_to_reach(
    accuracy: Sequence[float], bytes_total: Sequence[float], target: float
) -> tuple[int, float] | None:
    """First round (1-based) whose accuracy is ``>= target`` and the cumulative bytes
    exchanged by its end, or None when no round reaches ``target``."""
    for round_index, (acc, total) in enumerate(zip(accuracy, bytes_total), start=1):
        if acc >= target:
            return round_index, total
    return None


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _select(records: list[dict], study: int, **labels) -> list[dict]:
    return [r for r in records if study in r["studies"]
            and all(r["labels"].get(k) == v for k, v in labels.items())]


def _acc(record: dict, row: str) -> float | None:
    return record["outcome"]["rows"].get(row, {}).get("accuracy")


def _seeds(records: list[dict]) -> int:
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

    def _save_plot(self, fig, name: str) -> None:  # noqa: ANN001
        fig.tight_layout()
        fig.savefig(self.folder / name, dpi=110)
        plt.close(fig)
        self.files.append(name)
        self.sections.append(f"![{name}]({name})\n")

    # Study 1 -------------------------------------------------------------------
    def convex_table(self, ks: list[int]) -> None:
        rows, payload = [], {}
        for k in ks:
            ell = _select(self.records, 1, K=k, space="ellipsoid")
            ball = _select(self.records, 1, K=k, space="ball")
            cells = {
                "Global": [_acc(r, "Global") for r in ell],
                "Local": [_acc(r, "Local") for r in ell],
                "Averaged": [_acc(r, "Averaged") for r in ell],
                "GEMS (ellipsoid)": [_acc(r, "GEMS") for r in ell],
                "GEMS (ball)": [_acc(r, "GEMS") for r in ball],
                "GEMS tuned (ellipsoid)": [_acc(r, "GEMS tuned") for r in ell],
                "GEMS tuned (ball)": [_acc(r, "GEMS tuned") for r in ball],
                "Raw": [_acc(r, "Raw") for r in ell],
                "Raw converged": [_acc(r, "Raw converged") for r in ell],
            }
            payload[str(k)] = {**cells, "seeds": _seeds(ell),
                               "intersection_found": [r["outcome"]["intersection_found"]
                                                      for r in ell + ball]}
            rows.append([str(k)] + [mean_std(cells[c]) for c in CONVEX_COLUMNS])
        self._save_table("study1_convex", "1. Convex table (logistic regression)",
                         markdown(["K", *CONVEX_COLUMNS], rows), payload,
                         self._seed_note(_select(self.records, 1)))
        self._bars("study1_convex.png", "Convex: test accuracy by K", payload, CONVEX_COLUMNS)

    # Study 2 -------------------------------------------------------------------
    def nn_table(self, ks: list[int]) -> None:
        rows, payload = [], {}
        for k in ks:
            recs = _select(self.records, 2, K=k)
            cfg = recs[0]["run_config"] if recs else {}
            cells = {c: [_acc(r, c) for r in recs] for c in NN_COLUMNS}
            widths = [r["outcome"]["hidden_widths"][0] for r in recs]
            eps_j = cfg.get("eps-neuron", self.meta["defaults"]["eps-neuron"])
            m_eps = cfg.get("clusters", self.meta["defaults"]["clusters"])
            payload[str(k)] = {**cells, "width": widths, "eps_j": eps_j, "m_eps": m_eps,
                               "seeds": _seeds(recs)}
            rows.append([str(k), str(eps_j), str(m_eps)] + [mean_std(cells[c]) for c in NN_COLUMNS]
                        + [f"{np.mean(widths):.1f} ({np.std(widths):.1f})" if widths else "n/a"])
        self._save_table("study2_nn", "2. NN table (MLP, layer-wise GEMS)",
                         markdown(["K", "eps_j", "m_eps", *NN_COLUMNS, "GEMS width"], rows), payload,
                         self._seed_note(_select(self.records, 2)))
        self._bars("study2_nn.png", "MLP: test accuracy by K", payload, NN_COLUMNS)

    def _bars(self, name: str, title: str, payload: dict, columns: tuple[str, ...]) -> None:
        fig, ax = plt.subplots(figsize=(9, 4))
        ks = list(payload)
        width = 0.8 / len(columns)
        for i, col in enumerate(columns):
            means = [np.mean([v for v in payload[k][col] if v is not None] or [np.nan]) for k in ks]
            stds = [np.std([v for v in payload[k][col] if v is not None] or [np.nan]) for k in ks]
            ax.bar(np.arange(len(ks)) + i * width, means, width, yerr=stds, label=col, capsize=2)
        ax.set_xticks(np.arange(len(ks)) + 0.4 - width / 2, [f"K={k}" for k in ks])
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.legend(fontsize=7, ncol=2)
        self._save_plot(fig, name)

    # Study 3 -------------------------------------------------------------------
    def fine_tuning(self) -> None:
        payload = {}
        tables, figures = [], []
        for model in ("logistic", "mlp"):
            extra = {"space": "ellipsoid"} if model == "logistic" else {}
            recs = [r for r in _select(self.records, 3, K=5, model=model, **extra)
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
                                         for k in ("epochs", "lr", "tuned_layers")}}
            rows = [[str(n)] + [f"{curves[row][:, i].mean():.4f} ({curves[row][:, i].std():.4f})"
                                for row in CURVE_ROWS] for i, n in enumerate(sizes)]
            tables.append(f"**{model}** (K=5)\n\n" + markdown(["public samples", *CURVE_ROWS], rows))
            fig, ax = plt.subplots(figsize=(6, 4))
            for row, c in curves.items():
                m, s = c.mean(0), c.std(0)
                ax.plot(sizes, m, marker="o", label=row)
                ax.fill_between(sizes, m - s, m + s, alpha=0.2)
            ax.set_xlabel("public samples used for tuning")
            ax.set_ylabel("test accuracy")
            ax.set_title(f"Fine-tuning, {model}, K=5 ({len(recs)} seeds)")
            ax.legend()
            figures.append((fig, f"study3_fine_tuning_{model}.png"))
        recipe = next(iter(payload.values()))["recipe"] if payload else {}
        note = (f"Every row is tuned with Adam, lr {recipe.get('lr')}, {recipe.get('epochs')} "
                f"epochs, batch 32, on the same nested public samples; pretrained MLPs tune "
                f"their `{recipe.get('tuned_layers')}` layer(s), Raw trains from scratch.\n")
        self._save_table("study3_fine_tuning", "3. Fine-tuning study", "\n".join(tables), payload, note)
        for fig, name in figures:
            self._save_plot(fig, name)

    # Study 4 -------------------------------------------------------------------
    def model_size(self) -> None:
        rows, payload = [], {"grid": [], "ensemble": None}
        groups = defaultdict(list)
        for r in _select(self.records, 4):
            groups[(r["labels"]["clusters"], r["labels"]["eps_neuron"])].append(r)
        ensemble = []
        for (m_eps, eps_j), recs in sorted(groups.items()):
            acc = [_acc(r, "GEMS tuned") for r in recs]
            widths = [r["outcome"]["hidden_widths"][0] for r in recs]
            params = [r["outcome"]["rows"]["GEMS tuned"].get("parameters") for r in recs]
            payload["grid"].append({"m_eps": m_eps, "eps_j": eps_j, "accuracy": acc,
                                    "width": widths, "parameters": params})
            rows.append([f"Tuned GEMS (m_eps={m_eps}, eps_j={eps_j})", mean_std(acc),
                         f"{np.mean(widths):.1f} ({np.std(widths):.1f})", f"{np.mean(params):.0f}"])
            ensemble += recs
        if ensemble:
            ens_acc = [_acc(r, "Ensemble") for r in ensemble[: _seeds(ensemble)]]
            hidden = sum(Settings.from_run_config(ensemble[0]["run_config"]).hidden_widths)
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
        ax.legend(fontsize=7)
        self._save_plot(fig, "study4_model_size.png")

    # Study 5 -------------------------------------------------------------------
    def intersection(self, eps_grid: list[float]) -> None:
        n = len(eps_grid)
        found = np.zeros((n, n))
        acc_mean = np.full((n, n), np.nan)
        cells = []
        for i, e1 in enumerate(eps_grid):
            for j, e2 in enumerate(eps_grid):
                recs = _select(self.records, 5, eps1=e1, eps2=e2)
                hits = [r for r in recs if r["outcome"]["intersection_found"]]
                found[i, j] = len(hits) / max(1, len(recs))
                accs = [_acc(r, "GEMS") for r in hits]
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

    # Study 6 -------------------------------------------------------------------
    def federated(self) -> None:
        payload, rows, lines = {}, [], []
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for ax, model in zip(axes, ("logistic", "mlp")):
            gems = _select(self.records, 6, K=5, model=model)
            gems = [r for r in gems if r["kind"] == "gems"]
            entry = {}
            if gems:
                # The identity check before round 1 is communication too: it opens the sum.
                per_round = np.array([[e["down"] + e["up"] for e in r["outcome"]["bytes_per_round"]]
                                      for r in gems], dtype=float)
                check = np.mean([sum(e["down"] + e["up"] for e in r["outcome"].get("bytes_other", []))
                                 for r in gems])
                cumulative = (check + per_round.mean(0).cumsum()).tolist()
                entry["gems"] = {"bytes_per_round": per_round.mean(0).tolist(),
                                 "bytes_identity_check": float(check),
                                 "bytes_total": cumulative[-1], "rounds": len(cumulative),
                                 "GEMS": [_acc(r, "GEMS") for r in gems],
                                 "GEMS tuned": [_acc(r, "GEMS tuned") for r in gems]}
                for j, b in enumerate(cumulative[:-1], start=1):
                    ax.axvline(b, color="gray", ls=":", lw=1)
                    ax.annotate(f"layer {j}", (b, 0.02), rotation=90, fontsize=7)
                for row, marker in (("GEMS", "*"), ("GEMS tuned", "P")):
                    ax.errorbar(cumulative[-1], np.mean(entry["gems"][row]),
                                yerr=np.std(entry["gems"][row]), marker=marker, ms=12,
                                ls="none", capsize=3, label=f"{row} ({len(cumulative)} round"
                                f"{'s' if len(cumulative) > 1 else ''})")
                rows.append([model, "GEMS", str(len(cumulative)), f"{cumulative[-1]:,.0f}",
                             mean_std(entry["gems"]["GEMS"]), mean_std(entry["gems"]["GEMS tuned"]), ""])
            for strategy in ("fedavg", "fedprox"):
                recs = [r for r in _select(self.records, 6, K=5, model=model, strategy=strategy)]
                if not recs:
                    continue
                acc = np.array([r["outcome"]["accuracy"] for r in recs])
                total = np.array([r["outcome"]["bytes_total"] for r in recs], dtype=float).mean(0)
                m, s = acc.mean(0), acc.std(0)
                ax.plot(total, m, marker=".", label=strategy)
                ax.fill_between(total, m - s, m + s, alpha=0.2)
                reach = None
                if "gems" in entry:
                    target = float(np.mean(entry["gems"]["GEMS tuned"]))
                    hit = rounds_to_reach(m, total, target)
                    reach = None if hit is None else {"round": hit[0], "bytes": float(hit[1])}
                    name = "FedAvg" if strategy == "fedavg" else "FedProx"
                    if reach:
                        lines.append(f"- {model}: {name} reaches GEMS tuned's mean accuracy "
                                     f"{target:.4f} after {reach['round']} rounds and "
                                     f"{reach['bytes']:,.0f} bytes (GEMS: "
                                     f"{entry['gems']['rounds']} round(s), "
                                     f"{entry['gems']['bytes_total']:,.0f} bytes).")
                    else:
                        lines.append(f"- {model}: {name} does not reach GEMS tuned's mean accuracy "
                                     f"{target:.4f} within {len(m)} rounds ({total[-1]:,.0f} bytes; "
                                     f"its best mean is {m.max():.4f}).")
                entry[strategy] = {"rounds": recs[0]["outcome"]["rounds"],
                                   "accuracy_mean": m.tolist(), "accuracy_std": s.tolist(),
                                   "bytes_total": total.tolist(), "reaches_gems_tuned": reach,
                                   "federated": recs[0]["federated"]}
                rows.append([model, strategy, str(len(m)), f"{total[-1]:,.0f}",
                             f"{m[-1]:.4f} ({s[-1]:.4f})", "",
                             f"round {reach['round']}" if reach else "not reached"])
            payload[model] = entry
            ax.set_xscale("log")
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no overlapping labels
            ax.set_xlabel("cumulative bytes sent + received")
            ax.set_ylabel("test accuracy")
            ax.set_ylim(0, 1)
            ax.set_title(f"{model}, K=5")
            ax.legend(fontsize=7)
        table = markdown(["model", "method", "rounds", "bytes (up + down)", "accuracy (last round)",
                          "GEMS tuned", "reaches GEMS tuned"], rows)
        note = ("\n".join(lines) + "\n\nGEMS tuned also uses the server's public sample, which "
                "FedAvg and FedProx do not. Bytes are those of the records exchanged, both ways; "
                "GEMS's include the server's identity check before its first round.\n")
        self._save_table("study6_federated", "6. FedAvg / FedProx vs GEMS (K=5)", table, payload, note)
        self._save_plot(fig, "study6_accuracy_vs_bytes.png")

    def _seed_note(self, records: list[dict]) -> str:
        return f"Mean (std) over {_seeds(records)} seeds.\n"

    def write_summary(self, header: str) -> Path:
        (self.folder / "results.json").write_text(json.dumps(self.data, indent=2))
        path = self.folder / "README.md"
        path.write_text(header + "\n" + "\n".join(self.sections))
        self.files += ["results.json", "README.md"]
        return path
