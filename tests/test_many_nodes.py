"""Output that stays readable with many nodes: logs and tables summarise per-node figures
above a small count, and results.json keeps every one."""

from __future__ import annotations

import logging

from rich.console import Console

from gems_fl.evaluation.results import print_results
from gems_fl.naming import MAX_NODES_NAMED, describe_nodes
from tests.helpers import run_in_process


def test_a_few_nodes_are_named_and_many_are_counted():
    names = {i: f"partition-{i}" for i in range(20)}
    few = describe_nodes(list(range(3)), names)
    assert few == "0 ('partition-0'), 1 ('partition-1'), 2 ('partition-2')"
    many = describe_nodes(list(range(MAX_NODES_NAMED + 1)), names)
    assert many == f"{MAX_NODES_NAMED + 1} nodes (named in results.json)"
    assert describe_nodes([], names) == "none"


def test_printed_tables_summarise_many_nodes_and_results_keep_each(tmp_path, caplog):
    num_nodes = MAX_NODES_NAMED + 2
    with caplog.at_level(logging.INFO, logger="flwr"):
        results = run_in_process(num_nodes, tmp_path, **{"label-division": "iid"})
    logged = caplog.text
    assert f"Identify: {num_nodes} nodes, " in logged and "Identify: node '" not in logged
    assert f"Round 1: Replies from {num_nodes} of {num_nodes} nodes: accepted {num_nodes} nodes" \
        in logged
    console = Console(record=True, width=400)
    print_results(results, console)
    text = console.export_text()
    words = " ".join(text.split())  # titles wrap to their table's width
    local = results["rows"]["Local"]["per_node"]
    assert len(local) == num_nodes
    assert f"{num_nodes} nodes: min {min(local.values()):.3f}" in words
    assert f"over {num_nodes} nodes (each node in results.json)" in words
    # No column per node in the evaluation table; the per-node space table keeps a row each.
    assert "partition-0 (val, n=" not in text and "partition-0 (test, n=" not in text
    assert len(results["verification"]["per_node"]) == num_nodes
    assert sum(line.count("partition-") for line in text.splitlines()) >= num_nodes


def test_a_wide_merged_layer_warns_and_names_max_width(tmp_path, caplog, monkeypatch):
    import gems_fl.protocol.layerwise as layerwise

    monkeypatch.setattr(layerwise, "WIDE_LAYER_BYTES", 1000.0)  # any real layer passes it
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_in_process(3, tmp_path / "wide", model="mlp", **{"public-samples": 0})
    assert "Set max-width (e.g. max-width=150)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        run_in_process(3, tmp_path / "bounded", model="mlp",
                       **{"public-samples": 0, "max-width": 40})
    assert "Set max-width" not in caplog.text
