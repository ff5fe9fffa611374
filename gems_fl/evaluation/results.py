"""The results of a run: a printed table and the same figures as JSON."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from gems_fl.evaluation.run_files import RESULTS_FILE, git_commit
from gems_fl.geometry.kinds import space_kind
from gems_fl.learning.model_kinds import LOGISTIC_KIND, model_kind
from gems_fl.naming import MAX_NODES_NAMED
from gems_fl.protocol.verify import MIN_VERDICT_ROWS

MODEL_FILE = "gems_model.npz"


def format_table(results: dict[str, Any]) -> Table:
    """A rich table of test accuracy per row (skipped rows show the reason)."""
    meta = results["dataset"]
    cfg = results["settings"]
    model = model_kind(cfg.get("model", LOGISTIC_KIND.name)).title(cfg, meta, results)
    sites = results.get("attendance")
    who = (f"{len(sites['completed'])} of {len(sites['present'])} sites" if sites
           else f"{meta['num_nodes']} nodes")
    title = (f"GEMS {model}, output {cfg['space']} eps={cfg['eps']}, on "
             f"{meta['name']}, {who}")
    where = next((row["evaluated_on"] for row in results["rows"].values()
                  if row.get("evaluated_on")), None)
    table = Table(title=title, caption=None if where is None else f"Accuracy {where}")
    table.add_column("Row")
    table.add_column("Test accuracy" if where is None else "Accuracy", justify="right")
    table.add_column("Note")
    for name, row in results["rows"].items():
        acc = row.get("accuracy")
        note = row.get("skipped", "")
        if name == "Local" and acc is not None:
            per_node = row["per_node"]
            items = (sorted(per_node.items()) if isinstance(per_node, dict)
                     else list(enumerate(per_node)))
            if len(items) <= MAX_NODES_NAMED:
                note = "per node: " + ", ".join(f"{k} {a:.3f}" for k, a in items)
            else:
                accs = np.array([a for _, a in items])
                note = (f"{len(items)} nodes: min {accs.min():.3f}, median "
                        f"{np.median(accs):.3f}, max {accs.max():.3f} (each in results.json)")
        if name == "GEMS" and acc is not None:
            note = gems_note(results)
        if "parameters" in row and name in ("Ensemble", "GEMS"):
            note = f"{note}; {row['parameters']} parameters".lstrip("; ")
        table.add_row(name, "-" if acc is None else f"{acc:.4f}", note)
    return table


def gems_note(results: dict[str, Any]) -> str:
    """What the membership checks and the nodes' own checks said about ``h_G``."""
    inter = results["intersection"]
    inside = inter["inside"]
    inside = list(inside.values()) if isinstance(inside, dict) else inside
    where = space_kind(results["settings"].get("space", "ball")).where(
        bool(inter["found"]), str(inter["method"]), inside)
    selection = inter.get("selection")
    if selection:
        ridge = inter.get("pooled_ridge") if len(selection["candidates"]) > 1 else None
        where += (f"; {'ridge ' + format(ridge, 'g') + ', ' if ridge is not None else ''}"
                  f"logit scale x{selection['scale_applied']:g} chosen on the sites' "
                  "validation data")
    steps = sum(r["kind"] == "step" for r in results.get("refinement") or [])
    if steps:
        method = results["settings"].get("refine-method", "monotone")
        where += f"; then refined by {steps} Bohning steps ({method})"
    ver = results.get("verification")
    if ver:
        return (f"the aggregated model: good enough on {ver['good_enough']} of "
                f"{ver['answered']} sites (their own check); {where}")
    return f"the aggregated model: {where}"


#: What each row of the main table is, printed under it (:func:`legend_lines`).
ROW_MEANINGS = {
    "Global": "one model trained on all sites' data pooled (the paper's upper reference)",
    "Local": "each site's own model (the mean of their accuracies)",
    "Averaged": "the mean of the sites' model parameters (one-shot parameter averaging)",
    "Ensemble": "the sites' MLPs voting (majority of their predictions)",
    "GEMS": "h_G, the aggregated model, picked from the sites' good-enough spaces",
    "GEMS tuned": "h_G fine-tuned on the server's public sample",
    "Raw": "a fresh model tuned like GEMS tuned, on the public sample alone",
    "Raw converged": "a fresh model trained to convergence on the public sample alone",
}
GOOD_ENOUGH_MEANING = (
    "good enough on k of n: h_G reached the site's own eps on the site's validation rows "
    f"(the site's check, the guarantee; with fewer than {MIN_VERDICT_ROWS} of them, on its "
    "validation and training rows); the per-site table gives each site's verdict")


#: the per-node table's columns that are not plain words (docs/running.md, "Reading the summary")
NODE_COLUMN_MEANINGS = (
    "Per-site columns: good enough: the site's verdict, h_G's accuracy on its validation rows "
    f"against its eps (a site with fewer than {MIN_VERDICT_ROWS} validation rows judges on its "
    "validation and training rows together, and says on how many); radius: the size of the "
    "site's good-enough space (RMS logit change it allows, for the Gram space); certified: a "
    "radius within which no model can fall below eps on the site's validation rows (a proven "
    "lower bound); in its space: whether h_G lies inside that space, else 'miss d', how far "
    "outside in the same units (a geometric test, stricter than the verdict: a point picked "
    "from the pooled statistics is often good enough outside every space)")


def _good_enough_cell(node: dict[str, Any]) -> str:
    """The per-site table's verdict in one cell: yes / NO with h_G's accuracy against the
    site's eps, and on how many rows where the site held too few validation rows to judge
    on them alone."""
    good = node.get("good_enough")
    if good is None:
        return "-"
    word, sign = ("yes", ">=") if good else ("NO", "<")
    rows = node.get("verdict_rows")
    accuracy = node["h_g_verdict_accuracy"] if rows else node.get("h_g_val_accuracy")
    if accuracy is None:
        return word
    return f"{word}: {accuracy:.3f} {sign} {node.get('eps', '')}" + (
        f" on {rows} rows" if rows else "")


def legend_lines(results: dict[str, Any]) -> list[str]:
    """What the main table's rows and the GEMS note's words mean, for the rows it shows."""
    rows = [f"{name}: {ROW_MEANINGS[name]}" for name in results.get("rows", {})
            if name in ROW_MEANINGS]
    return ["Rows: " + "; ".join(rows) + ".", GOOD_ENOUGH_MEANING + "."] if rows else []


def markdown_table(results: dict[str, Any]) -> str:
    """The accuracy rows as a markdown table (what README.md shows)."""
    where = next((row["evaluated_on"] for row in results["rows"].values()
                  if row.get("evaluated_on")), None)
    lines = [f"| Row | {'Test accuracy' if where is None else 'Accuracy'} |", "| --- | ---: |"]
    for name, row in results["rows"].items():
        acc = row.get("accuracy")
        lines.append(f"| {name} | {'-' if acc is None else f'{acc:.4f}'} |")
    if where is not None:
        lines += ["", f"Accuracy {where}."]
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
            if merge.get("note"):
                lines.append(merge["note"])
        else:
            label = "Output round" if "layer" in r else f"Round {r['round']}"
            lines.append(f"{label}: {r['bytes_sent']} bytes down, {r.get('bytes_received', 0)} up.")
    return "\n".join(lines)


def refinement_table(results: dict[str, Any]) -> Table | None:
    """The refinement rounds: test accuracy, the pooled loss and the bytes so far."""
    rows = results.get("refinement")
    if not rows:
        return None
    steps = any(r["kind"] == "step" for r in rows)
    table = Table(title="Rounds: the one-shot h_G, the selection round (which point, and the "
                  "logit scale: a factor on h_G's logits that calibrates its probabilities, "
                  "chosen on the sites' validation rows)"
                  + (", the refinement steps (each a curvature-bounded step on the pooled "
                     "loss, refine-rounds)" if steps else "")
                  + "; GEMS is the last model, and 'in its space' below is the selected h_G's")
    for col in ("round", "what", "test acc", "pooled train loss before", "nodes", "bytes so far"):
        table.add_column(col, justify="right")
    for r in rows:
        acc, loss = r.get("test_accuracy"), r.get("loss_before")
        what = ("one-shot h_G" if r["kind"] == "spaces" else selection_text(r)
                if r["kind"] == "selection" else f"hidden layer {r.get('layer')}"
                if r["kind"] == "layer" else f"step {r.get('step')}"
                + (" (loss rose: dropped)" if r.get("kept") is False else ""))
        table.add_row(str(r["round"]), what, "-" if acc is None else f"{acc:.4f}",
                      "-" if loss is None else f"{loss:.4f}", str(r["nodes"]),
                      f"{r['cumulative_bytes']:,}")
    return table


def selection_text(r: dict[str, Any]) -> str:
    """What the selection round chose, in a few words."""
    ridge = r.get("pooled_ridge")
    return (f"ridge {ridge:g}, " if ridge is not None else "") + f"scale x{r.get('temperature'):g}"


def print_results(results: dict[str, Any], console: Console | None = None) -> None:  # noqa: C901
    """Print the accuracy table, per-node spaces and rejections."""
    if console is None:
        console = Console()
        if not console.is_terminal:  # a log stream: rich's 80-column default wraps every name
            console.width = max(console.width, 120)
    console.print(format_table(results))
    for line in legend_lines(results):
        console.print(line, style="dim", highlight=False)
    refinement = refinement_table(results)
    if refinement is not None:
        console.print(refinement)
    nodes = Table(title="Per site: its verdict on h_G (its own check on its own validation "
                  "rows) and its good-enough space")
    for col in ("site", "train", "val", "own model val acc", "good enough", "radius",
                "certified", "in its space"):
        nodes.add_column(col, justify="right", overflow="fold")
    named = Counter(n.get("name") for n in results["nodes"])
    for n in results["nodes"]:
        label = (n["name"] if n.get("name") and named[n["name"]] == 1
                 else f"{n.get('name') or 'node'} ({n['node_id']})")
        cert = n.get("certified_radius")
        nodes.add_row(label, str(n["num_train"]), str(n["num_val"]),
                      f"{n['local_val_accuracy']:.3f}", _good_enough_cell(n),
                      f"{n['radius']:.4g}", "inf" if cert is None else f"{cert:.3g}",
                      ("-" if n["inside"] is None else "yes" if n["inside"]
                       else f"miss {n['miss']:.3g}"))
    console.print(nodes)
    console.print(NODE_COLUMN_MEANINGS + ".", style="dim", highlight=False)
    evaluation = node_evaluation_table(results)
    if evaluation is not None:
        console.print(evaluation)
    for r in results.get("verification", {}).get("missing", []):
        console.print(f"[red]no verification[/red] from node '{r['node_name']}' "
                      f"{r['node_id']}: {r['reason']}")
    for r in results["rejected"]:
        name = f" '{r['node_name']}'" if r.get("node_name") else ""
        console.print(f"[red]rejected[/red] node{name} {r['node_id']}: {r['reason']}")
    merge_notes = [r["merge"]["note"] for r in results.get("rounds", [])
                   if isinstance(r.get("merge"), dict) and r["merge"].get("note")]
    site_notes = [f"site '{p['name']}': {note}" for p in results.get("participants", [])
                  for note in p.get("notes", [])]
    for note in [*site_notes, *results.get("notes", []), *merge_notes]:
        console.print(f"[yellow]note[/yellow]: {note}", highlight=False)


ROW_KEYS = {"GEMS": "gems", "Averaged": "averaged", "GEMS tuned": "gems-tuned", "Raw": "raw"}


def rows_from_sites(rows: dict[str, Any], verification: dict[str, Any]) -> dict[str, Any]:
    """The results table's rows when the server holds no test set: each row's model on the
    sites' own rows (their test split, else val), pooled over the sites as the evaluate
    round reported them; Local is the mean over the sites' own models. Rows the sites did
    not score keep their reason; with any server-side figure the rows stay as they are."""
    pooled = verification.get("pooled") or {}
    per_node = verification.get("per_node") or {}
    if not pooled or any(row.get("accuracy") is not None for row in rows.values()):
        return rows
    splits = sorted({entry["split"] for entry in per_node.values()})
    samples = sum(int(entry["samples"]) for entry in per_node.values())
    where = (f"on the sites' own {'/'.join(splits)} rows, pooled over {len(per_node)} sites "
             f"(n={samples}); the server holds no test set")
    locals_ = {key.split(".", 1)[1]: acc for key, acc in pooled.items()
               if key.startswith("local.")}
    out = {}
    for name, row in rows.items():
        if name == "Local" and locals_:
            out[name] = {"accuracy": float(np.mean(list(locals_.values()))),
                         "per_node": locals_, "evaluated_on": where}
        elif ROW_KEYS.get(name) in pooled:
            out[name] = {"accuracy": float(pooled[ROW_KEYS[name]]), "evaluated_on": where}
        else:
            out[name] = row
    return out


def model_label(key: str) -> str:
    """A model key of the evaluate round as a row label (``local.site-a`` -> ``Local site-a``)."""
    fixed = {"gems": "GEMS", "averaged": "Averaged", "gems-tuned": "GEMS tuned", "raw": "Raw"}
    if key in fixed:
        return fixed[key]
    return f"Local {key.split('.', 1)[1]}" if key.startswith("local.") else key


def node_evaluation_table(results: dict[str, Any]) -> Table | None:
    """Every model evaluated on every node's own data (test split where the node holds one,
    else val) and pooled over the nodes, weighted by samples; None before any node answered."""
    ver = results.get("verification") or {}
    per_node = ver.get("per_node") or {}
    if not per_node:
        return None
    shown = per_node if len(per_node) <= MAX_NODES_NAMED else {}
    title = ("Evaluated on the nodes' own data (test split where present, else val); pooled "
             "weighted by samples")
    if not shown:
        title += f" over {len(per_node)} nodes (each node in results.json)"
    on_val = sorted(name for name, entry in per_node.items() if entry["split"] == "val")
    if on_val:
        title += (f". {len(on_val)} node(s) hold no test split and report val, the split "
                  "their radius and eps check used: those figures are optimistic (give each "
                  "site a <stem>_test file or x_test/y_test for an unbiased one)")
    # where the first table's rows are these pooled figures, they are not printed twice
    pooled_above = any(row.get("evaluated_on") for row in results.get("rows", {}).values())
    if pooled_above and shown:
        title += "; pooled over the sites: the first table"
    table = Table(title=title)
    table.add_column("model")
    for name, entry in shown.items():
        table.add_column(f"{name} ({entry['split']}, n={entry['samples']})", justify="right")
    if not (pooled_above and shown):
        table.add_column("pooled", justify="right")
    keys = list(ver.get("pooled", {}))
    for entry in per_node.values():
        keys += [k for k in entry["accuracy"] if k not in keys]
    for key in keys:
        cells = [f"{entry['accuracy'][key]:.4f}" if key in entry["accuracy"] else "-"
                 for entry in shown.values()]
        pooled = ver.get("pooled", {}).get(key)
        tail = [] if (pooled_above and shown) else ["-" if pooled is None else f"{pooled:.4f}"]
        table.add_row(model_label(key), *cells, *tail)
    return table


PACKAGES = {"gems-fl": "gems-fl", "flwr": "flwr", "torch": "torch", "numpy": "numpy",
            "scikit-learn": "scikit-learn"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run_metadata(started_at: datetime | float | None = None) -> dict[str, Any]:
    """When and with what a run ran: UTC start and end, versions, git commit, cores.

    ``started_at`` is a ``datetime`` or a POSIX timestamp; ``None`` records no start.
    """
    if isinstance(started_at, (int, float)):
        started_at = datetime.fromtimestamp(started_at, UTC)
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    git = git_commit()
    if os.environ.get("GEMS_FL_GIT_COMMIT"):  # `gems-fl run` passes the checkout's commit
        git = {"commit": os.environ["GEMS_FL_GIT_COMMIT"],
               "dirty": os.environ.get("GEMS_FL_GIT_DIRTY") == "1"}
    return {
        "started_at": _iso(started_at) if started_at is not None else None,
        "finished_at": _iso(datetime.now(UTC)),
        "versions": {"python": platform.python_version(),
                     **{key: _version(dist) for key, dist in PACKAGES.items()}},
        "git_commit": git["commit"] if git else None,
        "git_dirty": git["dirty"] if git else None,
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
    }


def _node_names(results: dict[str, Any]) -> list[str]:
    """Name of each entry of ``results["nodes"]`` (its id where a name is missing)."""
    return [str(n.get("name") or n["node_id"]) for n in results.get("nodes", [])]


def _partition_names(results: dict[str, Any], count: int) -> list[str]:
    """Names of partitions 0..count-1 (the order the server rebuilds local MLPs in)."""
    by_partition = {}
    for p in results.get("participants", []):
        data = str(p.get("data", ""))
        if data.startswith("partition "):
            by_partition[int(data.split()[1])] = str(p.get("name") or p["node_id"])
    return [by_partition.get(k, f"partition-{k}") for k in range(count)]


def key_per_node(results: dict[str, Any]) -> dict[str, Any]:
    """Per-node lists become ``{name: value}`` and node rows are sorted by name (in place).

    The lists come in the order of ``results["nodes"]`` (the accepted replies), except the
    layer-wise Local row, whose local MLPs the server rebuilds in partition order.
    """
    names = _node_names(results)
    local = results.get("rows", {}).get("Local", {})
    per_node = local.get("per_node")
    if isinstance(per_node, list):
        mlp = model_kind(results.get("settings", {}).get("model", LOGISTIC_KIND.name)).layerwise
        keys = _partition_names(results, len(per_node)) if mlp else names
        if len(keys) == len(per_node) and len(set(keys)) == len(keys):
            local["per_node"] = dict(sorted(zip(keys, per_node)))
    inter = results.get("intersection", {})
    for key in ("inside", "miss"):
        values = inter.get(key)
        if isinstance(values, list) and len(values) == len(names) and len(set(names)) == len(names):
            inter[key] = dict(sorted(zip(names, values)))
    order = lambda n: (str(n.get("name") or ""), int(n.get("node_id", 0)))
    for key in ("nodes", "participants"):
        if isinstance(results.get(key), list):
            results[key] = sorted(results[key], key=order)
    return results


def complete_results(results: dict[str, Any],
                     started_at: datetime | float | None = None) -> dict[str, Any]:
    """``results`` as a finished run keeps them, in place: per-node lists keyed by node
    name (:func:`key_per_node`) and ``results["run"]`` (:func:`run_metadata`; the start
    defaults to now minus ``timing_s.total``). :func:`write_results` writes them so."""
    if started_at is None:
        total = results.get("timing_s", {}).get("total")
        if isinstance(total, (int, float)):
            started_at = datetime.now(UTC) - timedelta(seconds=float(total))
    key_per_node(results)
    results["run"] = run_metadata(started_at)
    return results


def write_results(results: dict[str, Any], folder: Path, h_g: dict[str, np.ndarray] | None,
                  started_at: datetime | float | None = None) -> Path:
    """Write ``results.json`` (and the aggregated model as ``.npz``) into ``folder``, atomically.

    Completes ``results`` first, in place (:func:`complete_results`). Everything is
    written into a hidden sibling folder first and renamed to ``folder`` at the end, so an
    interrupted write leaves no folder that looks complete. An existing ``folder`` is replaced file by file, ``results.json``
    last.
    """
    complete_results(results, started_at)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results, indent=2, sort_keys=False) + "\n"
    partial = folder.parent / f".{folder.name}.partial-{os.getpid()}-{time.monotonic_ns()}"
    partial.mkdir()
    try:
        if h_g is not None:
            np.savez(partial / MODEL_FILE, **h_g)
        (partial / RESULTS_FILE).write_text(text)
        try:
            os.rename(partial, folder)  # fails if folder exists (and is not empty)
        except OSError:
            if not folder.is_dir():
                raise
            if h_g is not None:
                os.replace(partial / MODEL_FILE, folder / MODEL_FILE)
            os.replace(partial / RESULTS_FILE, folder / RESULTS_FILE)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder / RESULTS_FILE
