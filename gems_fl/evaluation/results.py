"""The results of a run: a printed table and the same figures as JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

RESULTS_FILE = "results.json"
MODEL_FILE = "gems_model.npz"


def format_table(results: dict[str, Any]) -> Table:
    """A rich table of test accuracy per row (skipped rows show the reason)."""
    meta = results["dataset"]
    cfg = results["settings"]
    model = "logistic"
    if cfg.get("model") == "mlp":
        model = (f"MLP hidden {cfg['hidden']} -> aggregated {results.get('hidden_widths')}, "
                 f"eps_j={cfg['eps-neuron']}, m_eps={cfg['clusters']}")
    title = (f"GEMS {model}, output {cfg['space']} eps={cfg['eps']}, on "
             f"{meta['name']}, {meta['num_nodes']} nodes")
    table = Table(title=title)
    table.add_column("Row")
    table.add_column("Test accuracy", justify="right")
    table.add_column("Note")
    for name, row in results["rows"].items():
        acc = row.get("accuracy")
        note = row.get("skipped", "")
        if name == "Local" and acc is not None:
            per_node = row["per_node"]
            items = per_node.items() if isinstance(per_node, dict) else enumerate(per_node)
            note = "per node: " + ", ".join(f"{k} {a:.3f}" for k, a in items)
        if name == "GEMS" and acc is not None:
            note = gems_note(results)
        if "parameters" in row and name in ("Ensemble", "GEMS"):
            note = f"{note}; {row['parameters']} parameters".lstrip("; ")
        table.add_row(name, "-" if acc is None else f"{acc:.4f}", note)
    return table


def gems_note(results: dict[str, Any]) -> str:
    """What the membership checks and the nodes' own checks said about ``h_G``."""
    inter = results["intersection"]
    space = results["settings"].get("space")
    if space == "gram":
        where = (f"h_G ({inter['method']}) inside {sum(inter['inside'])} of "
                 f"{len(inter['inside'])} Gram spaces")
    elif inter["found"]:
        where = "h_G inside every space (verified intersection)"
    else:
        where = f"NO INTERSECTION: fallback '{inter['method']}'"
    ver = results.get("verification")
    if ver:
        answered = ver["answered"]
        where += f"; good enough on {ver['good_enough']} of {answered} nodes (their own check)"
    return where


def markdown_table(results: dict[str, Any]) -> str:
    """The accuracy rows as a markdown table (what README.md shows)."""
    lines = ["| Row | Test accuracy |", "| --- | ---: |"]
    for name, row in results["rows"].items():
        acc = row.get("accuracy")
        lines.append(f"| {name} | {'-' if acc is None else f'{acc:.4f}'} |")
    inter = results["intersection"]
    found = "found and verified" if inter["found"] else f"NOT found (fallback '{inter['method']}')"
    radii = ", ".join(f"{n['radius']:.4g}" for n in results["nodes"])
    lines.append("")
    lines.append(f"Intersection {found}; node radii: {radii}.")
    for r in results.get("rounds", []):
        if r.get("layer") is not None:
            merge = r["merge"]
            lines.append(f"Layer {r['layer']}: width {r['width']} ({merge['num_intersected_groups']} "
                         f"merged groups, {merge['num_kept_alone']} kept alone); "
                         f"{r['bytes_sent']} bytes down, {r['bytes_received']} up.")
        else:
            label = "Output round" if "layer" in r else f"Round {r['round']}"
            lines.append(f"{label}: {r['bytes_sent']} bytes down, {r.get('bytes_received', 0)} up.")
    return "\n".join(lines)


def print_results(results: dict[str, Any], console: Console | None = None) -> None:
    """Print the accuracy table, per-node spaces and rejections."""
    console = console or Console()
    console.print(format_table(results))
    nodes = Table(title="Per node: good-enough space, and h_G checked by the node on its own "
                  "validation data")
    for col in ("node", "train", "val", "eps", "local val acc", "radius", "certified",
                "inside", "h_G val acc", "good enough"):
        nodes.add_column(col, justify="right")
    for n in results["nodes"]:
        label = f"{n['name']} ({n['node_id']})" if n.get("name") else str(n["node_id"])
        cert = n.get("certified_radius")
        acc = n.get("h_g_val_accuracy")
        good = n.get("good_enough")
        nodes.add_row(label, str(n["num_train"]), str(n["num_val"]), f"{n.get('eps', '')}",
                      f"{n['local_val_accuracy']:.3f}", f"{n['radius']:.4g}",
                      "inf" if cert is None else f"{cert:.3g}",
                      "yes" if n["inside"] else f"miss {n['miss']:.3g}",
                      "-" if acc is None else f"{acc:.3f}",
                      "-" if good is None else ("yes" if good else "NO"))
    console.print(nodes)
    for r in results.get("verification", {}).get("missing", []):
        console.print(f"[red]no verification[/red] from node '{r['node_name']}' "
                      f"{r['node_id']}: {r['reason']}")
    for r in results["rejected"]:
        name = f" '{r['node_name']}'" if r.get("node_name") else ""
        console.print(f"[red]rejected[/red] node{name} {r['node_id']}: {r['reason']}")
    for note in results.get("notes", []):
        console.print(f"[yellow]note[/yellow]: {note}")


def write_results(results: dict[str, Any], folder: Path, h_g: dict[str, np.ndarray] | None) -> Path:
    """Write ``results.json`` (and the aggregated model as ``.npz``) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RESULTS_FILE
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    if h_g is not None:
        np.savez(folder / MODEL_FILE, **h_g)
    return path
