"""Study 6's table and plot: FedAvg and FedProx against GEMS, accuracy against bytes."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np

from gems_fl.learning.model_kinds import LOGISTIC_KIND, MLP_KIND
from gems_lab.reproduce.report import Report, main_rows, markdown, mean_std, row_accuracy, select_records


def other_bytes(record: dict) -> float:
    """A GEMS trial's bytes outside its protocol rounds, both ways: the server's identity
    check before round 1 and the nodes' verification round."""
    return float(sum(e["down"] + e["up"] for e in record["outcome"].get("bytes_other") or []))


def rounds_to_reach(
    accuracy: Sequence[float], bytes_total: Sequence[float], target: float
) -> tuple[int, float] | None:
    """First round (1-based) whose accuracy is ``>= target`` and the cumulative bytes
    exchanged by its end, or None when no round reaches ``target``."""
    for round_index, (acc, total) in enumerate(zip(accuracy, bytes_total), start=1):
        if acc >= target:
            return round_index, total
    return None


def fed_name(strategy: str, optimizer: str, recs: list[dict]) -> str:
    """``FedAvg (Adam)`` or ``FedAvg-SGD (lr=0.1)`` (rates per seed when they differ)."""
    name = "FedAvg" if strategy == "fedavg" else "FedProx"
    if optimizer != "sgd":
        return f"{name} (Adam)"
    lrs = [r["outcome"].get("lr") for r in recs]
    shown = f"{lrs[0]:g}" if len(set(lrs)) == 1 else "/".join(f"{lr:g}" for lr in lrs)
    return f"{name}-SGD (lr={shown})"


def reach_line(model: str, name: str, label: str, target: float, got: dict | None,
                gems: dict, m: np.ndarray, total: np.ndarray) -> str:
    if got:
        return (f"- {model}: {name} reaches {label}'s mean accuracy {target:.4f} after "
                f"{got['round']} rounds and {got['bytes']:,.0f} bytes, "
                f"{got['bytes'] / gems['bytes_total']:.1f}x GEMS's (GEMS: {gems['rounds']} "
                f"round(s), {gems['bytes_total']:,.0f} bytes).")
    return (f"- {model}: {name} does not reach {label}'s mean accuracy {target:.4f} within "
            f"{len(m)} rounds ({total[-1]:,.0f} bytes, {total[-1] / gems['bytes_total']:.1f}x "
            f"GEMS's; its best mean is {m.max():.4f}).")


def federated_section(report: Report) -> None:  # noqa: C901
    """FedAvg/FedProx (Adam and SGD) against GEMS: accuracy against cumulative bytes,
    and the rounds and bytes each needs to reach GEMS's rows."""
    payload, rows, lines = {}, [], []
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.6))
    for ax, model in zip(axes, (LOGISTIC_KIND.name, MLP_KIND.name)):
        entry = {}
        for space, key in (("ellipsoid", "gems"), ("gram", "gems_gram")):
            gems = [r for r in main_rows(report.records, 6, K=5, model=model, space=space)
                    if r["kind"] == "gems"]
            if not gems:
                continue
            # The identity check before round 1 and the nodes' verification round are
            # communication too: they open the sum.
            per_round = np.array([[e["down"] + e["up"] for e in r["outcome"]["bytes_per_round"]]
                                  for r in gems], dtype=float)
            check = np.mean([other_bytes(r) for r in gems])
            cumulative = (check + per_round.mean(0).cumsum()).tolist()
            entry[key] = {"space": space, "bytes_per_round": per_round.mean(0).tolist(),
                          "bytes_identity_check": float(check),
                          "bytes_total": cumulative[-1], "rounds": len(cumulative),
                          "GEMS": [row_accuracy(r, "GEMS") for r in gems],
                          "GEMS tuned": [row_accuracy(r, "GEMS tuned") for r in gems]}
            if key == "gems":
                for j, b in enumerate(cumulative[:-1], start=1):
                    ax.axvline(b, color="gray", ls=":", lw=1)
                    ax.annotate(f"layer {j}", (b, 0.02), rotation=90, fontsize=7)
            for row, marker in (("GEMS", "*"), ("GEMS tuned", "P")):
                ax.errorbar(cumulative[-1], np.mean(entry[key][row]),
                            yerr=np.std(entry[key][row]), marker=marker, ms=12,
                            ls="none", capsize=3, label=f"{row} ({space}, {len(cumulative)} "
                            f"round{'s' if len(cumulative) > 1 else ''})")
            rows.append([model, f"GEMS ({space})", str(len(cumulative)), f"{cumulative[-1]:,.0f}",
                         mean_std(entry[key]["GEMS"]), mean_std(entry[key]["GEMS tuned"]), ""])
        for optimizer in ("adam", "sgd"):
            for strategy in ("fedavg", "fedprox"):
                recs = [r for r in select_records(report.records, 6, K=5, model=model, strategy=strategy)
                        if r["federated"].get("optimizer", "adam") == optimizer]
                if not recs:
                    continue
                name = fed_name(strategy, optimizer, recs)
                acc = np.array([r["outcome"]["accuracy"] for r in recs])
                total = np.array([r["outcome"]["bytes_total"] for r in recs], dtype=float).mean(0)
                m, s = acc.mean(0), acc.std(0)
                (line,) = ax.plot(total, m, marker=".", ls="-" if optimizer == "sgd" else "--",
                                  label=name)
                ax.fill_between(total, m - s, m + s, alpha=0.2, color=line.get_color())
                reach = {}
                for key, row in (("gems", "GEMS tuned"), ("gems_gram", "GEMS"),
                                 ("gems_gram", "GEMS tuned")):
                    if key not in entry:
                        continue
                    target = float(np.mean(entry[key][row]))
                    hit = rounds_to_reach(m, total, target)
                    got = None if hit is None else {"round": hit[0], "bytes": float(hit[1])}
                    label = f"{row} ({entry[key]['space']})"
                    reach[label] = got
                    if key == "gems" or (strategy == "fedavg" and optimizer == "sgd"):
                        lines.append(reach_line(model, name, label, target, got, entry[key],
                                                 m, total))
                entry[f"{strategy}-{optimizer}"] = {
                    "name": name, "rounds": recs[0]["outcome"]["rounds"],
                    "accuracy_mean": m.tolist(), "accuracy_std": s.tolist(),
                    "bytes_total": total.tolist(), "reaches": reach,
                    "federated": recs[0]["federated"],
                    "lr": [r["outcome"].get("lr") for r in recs],
                    "tuning": [r["outcome"].get("tuning") for r in recs]}
                if optimizer == "adam":  # the keys earlier reports used
                    entry[strategy] = entry[f"{strategy}-{optimizer}"]
                first = reach.get("GEMS tuned (ellipsoid)")
                rows.append([model, name, str(len(m)), f"{total[-1]:,.0f}",
                             f"{m[-1]:.4f} ({s[-1]:.4f})", "",
                             f"round {first['round']}" if first else
                             ("not reached" if "GEMS tuned (ellipsoid)" in reach else "")])
        payload[model] = entry
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # no overlapping labels
        ax.set_xlabel("cumulative bytes sent + received")
        ax.set_ylabel("test accuracy")
        ax.set_ylim(0, 1)
        ax.set_title(f"{model}, K=5")
        # below the axes: inside, it covered GEMS markers
        ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  frameon=False)
    table = markdown(["model", "method", "rounds", "bytes (up + down)", "accuracy (last round)",
                      "GEMS tuned", "reaches GEMS tuned (ellipsoid)"], rows)
    note = ("\n".join(lines) + "\n\nFedAvg/FedProx (Adam) train locally with GEMS's Adam "
            "recipe; FedAvg-SGD/FedProx-SGD with plain SGD at the rate each trial chose from "
            "the grid by the pooled validation accuracy of a short federated run (the "
            "nodes' validation splits, never the test set; the lr in the label is that "
            "choice, per seed when seeds differ). GEMS tuned also uses the server's public "
            "sample, which FedAvg and FedProx do not. Bytes are those of the records "
            "exchanged, both ways; GEMS's include the server's identity check before its "
            "first round and the nodes' verification round (each node scores h_G).\n")
    report._save_table("study6_federated", "6. FedAvg / FedProx vs GEMS (K=5)", table, payload, note)
    report._save_plot(fig, "study6_accuracy_vs_bytes.png")
