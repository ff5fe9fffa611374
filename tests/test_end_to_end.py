"""Whole runs: in-process through the real apps, and `flwr run` via `gems-fl run`."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from gems_fl.evaluation.baselines import row_names
from gems_fl.learning.models import state_to_vector
from gems_fl.protocol.space_replies import decode_reply
from tests.helpers import ROOT, run_in_process

# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def test_same_seed_and_settings_give_the_same_numbers(tmp_path):
    first = run_in_process(3, tmp_path / "a", seed=3)
    second = run_in_process(3, tmp_path / "b", seed=3)
    for key in ("rows", "nodes", "intersection"):
        assert first[key] == second[key]
    other = run_in_process(3, tmp_path / "c", seed=4)
    assert other["nodes"] != first["nodes"]


def test_evaluate_on_server_off_skips_rows_and_says_why(tmp_path):
    sent = {}

    def keep(reply):
        sent[reply.metadata.src_node_id] = reply.content
        return reply

    results = run_in_process(2, tmp_path, reply_hook=keep,
                             **{"evaluate-on-server": False, "space": "ball"})
    # the table's rows are the sites' own figures (their evaluate round), pooled
    pooled = results["verification"]["pooled"]
    rows = results["rows"]
    assert rows["GEMS"]["accuracy"] == pooled["gems"]
    assert rows["Averaged"]["accuracy"] == pooled["averaged"]
    locals_ = [v for k, v in pooled.items() if k.startswith("local.")]
    assert rows["Local"]["accuracy"] == pytest.approx(np.mean(locals_)) and len(locals_) == 2
    assert all("the server holds no test set" in row["evaluated_on"] for row in rows.values())
    # Digits, 2 nodes, seed 0: the mean of the two centers already lies in both balls,
    # so h_G is the model average, found before any Dykstra sweep.
    inter = results["intersection"]
    assert inter["found"] and inter["method"] == "dykstra" and inter["iterations"] == 0
    assert inter["inside"] == {"partition-0": True, "partition-1": True}
    assert inter["miss"] == {"partition-0": 0.0, "partition-1": 0.0}
    assert inter["objective"] == 0.0 and results["notes"] == []
    saved = np.load(tmp_path / "run-1" / "gems_model.npz")
    h_g = state_to_vector(dict(saved))
    shapes = {name: saved[name].shape for name in saved.files}
    spaces = {node_id: decode_reply(content, shapes, "ball")[0]
              for node_id, content in sent.items()}
    np.testing.assert_allclose(h_g, np.mean([s.center for s in spaces.values()], axis=0),
                               rtol=1e-12, atol=0)
    # Membership reported per node is that of the saved model in the node's own ball.
    assert sorted(node["node_id"] for node in results["nodes"]) == sorted(spaces)
    for node in results["nodes"]:
        inside, miss = inter["inside"][node["name"]], inter["miss"][node["name"]]
        space = spaces[node["node_id"]]
        assert node["radius"] == space.radius > 0
        assert node["inside"] is inside is space.contains(h_g)
        assert node["miss"] == miss == 0.0


def test_node_failing_q_gets_radius_zero_and_a_note(tmp_path):
    results = run_in_process(3, tmp_path, **NO_CHECK, eps=1.0, space="ball")
    zero = [n for n in results["nodes"] if n["radius"] == 0.0]
    assert zero, "eps=1.0 should leave some node's own model failing Q"
    for node in zero:
        assert node["local_val_accuracy"] < 1.0
        assert any(f"node {node['name']}" in note and "lower eps" in note
                   for note in results["notes"])


def _gems_fl(*args: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), *args,
         "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=False,
    )


@pytest.mark.slow
def test_flwr_simulation_end_to_end(tmp_path):
    """3 SuperNodes on digits through `flwr run` and the real ServerApp/ClientApp."""
    proc = _gems_fl("--nodes", "3", "--run-config", "num-directions=50 seed=1", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert results["status"] == "completed"
    assert list(results["rows"]) == list(row_names(False, "cheap"))
    for name in row_names(False, "cheap"):
        assert 0.0 <= results["rows"][name]["accuracy"] <= 1.0
    assert len(results["nodes"]) == 3 and results["dataset"]["num_nodes"] == 3
    assert results["rows"]["GEMS"]["accuracy"] > results["rows"]["Local"]["accuracy"]
    assert "Test accuracy" in proc.stdout and "Averaged" in proc.stdout
    # a normal run's output: no third-party warning, no Flower summary dump, no trace
    for noise in ("FutureWarning", "Final results", "Traceback"):
        assert noise not in proc.stdout + proc.stderr, noise
    # The time split covers the whole command: start-up, the app's phases, shut-down.
    timing = results["timing_s"]
    inside = sum(timing[k] for k in ("wait_for_nodes", "identify", "server_data", "rounds",
                                     "verify", "baselines"))
    assert inside <= timing["total"] + 1e-6
    assert timing["startup"] > 0 and timing["shutdown"] >= 0
    assert abs(timing["startup"] + timing["total"] + timing["shutdown"] - timing["wall"]) < 1.0
    assert "gems-fl: time: start-up" in proc.stdout


@pytest.mark.slow
def test_a_failed_flwr_run_is_reported_as_a_failure(tmp_path):
    """`flwr run` exits 0 for a failed run; `gems-fl run` must not."""
    from tests.test_run_behaviour import write_mnist_like

    # Headers that pass the preflight, a label value that only the nodes' loader reads.
    data = write_mnist_like(tmp_path / "data", bad_label=True)
    proc = _gems_fl("--nodes", "2", "--run-config",
                    f"dataset='mnist' data-dir='{data}' required-nodes=0", tmp_path=tmp_path)
    assert proc.returncode == 1
    assert "finished:failed" in proc.stderr
    assert not list(tmp_path.glob("run-*/results.json"))


@pytest.mark.slow
def test_sites_whose_data_fails_stop_the_run_before_training_with_their_reason(tmp_path):
    """Every site present is required by default: two sites whose files fail on the node
    stop the run before any training (exit 3, results with status incomplete and no
    model); the last line names both sites with the nodes' own message, and the output
    carries no traceback of the server's (the node's own stays in the kept log)."""
    from tests.test_run_behaviour import write_mnist_like

    data = write_mnist_like(tmp_path / "data", bad_label=True)
    proc = _gems_fl("--nodes", "2", "--run-config", f"dataset='mnist' data-dir='{data}'",
                    tmp_path=tmp_path)
    assert proc.returncode == 3, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "stopped before training: expected every site present" in last
    assert "expected labels in 0..9" in last and "client error" not in last
    assert last.count("expected labels in 0..9") == 1  # both sites, named together
    assert "RequiredNodesMissing" not in proc.stdout and "Exit Code" not in proc.stdout
    [results] = tmp_path.glob("run-*/results.json")
    saved = json.loads(results.read_text())
    assert saved["status"] == "incomplete" and saved["stage"] == "identity"
    assert len(saved["attendance"]["missing_required"]) == 2
    assert not list(tmp_path.glob("run-*/gems_model.npz"))


def test_show_prints_every_row_of_a_results_file(tmp_path, capsys):
    from gems_fl.running.cli import main

    run_in_process(2, tmp_path, space="ball")
    assert main(["show", str(tmp_path / "run-1" / "results.json"), "--markdown"]) == 0
    out = capsys.readouterr().out
    for name in row_names(False, "cheap"):
        assert f"| {name} |" in out
    assert main(["show", str(tmp_path / "missing.json")]) == 2


def test_baselines_choose_the_comparison_rows_and_never_change_h_g(tmp_path):
    runs = {b: run_in_process(2, tmp_path / b, space="ball", baselines=b)
            for b in ("none", "cheap", "all")}
    for baselines, results in runs.items():
        assert list(results["rows"]) == list(row_names(False, baselines)), baselines
        assert results["settings"]["baselines"] == baselines
    assert row_names(False, "none") == ("GEMS",)
    assert {"Global", "GEMS tuned", "Raw", "Raw converged"} <= set(runs["all"]["rows"])
    models = {b: np.load(tmp_path / b / "run-1" / "gems_model.npz") for b in runs}
    for name in models["all"].files:
        np.testing.assert_array_equal(models["none"][name], models["all"][name])
        np.testing.assert_array_equal(models["cheap"][name], models["all"][name])
    assert len({r["rows"]["GEMS"]["accuracy"] for r in runs.values()}) == 1


def test_the_printed_table_explains_its_rows_and_its_words(tmp_path):
    from rich.console import Console

    from gems_fl.evaluation.results import ROW_MEANINGS, print_results

    results = run_in_process(3, tmp_path)
    console = Console(record=True, width=400)
    print_results(results, console)
    text = console.export_text()
    for name in results["rows"]:
        assert f"{name}: {ROW_MEANINGS[name]}" in text
    assert "good enough on k of n: h_G reached the site's own eps" in text
    assert "in its space: whether h_G lies inside that space" in text
    # one verdict per site, in one cell, with full names; the headline names h_G as the
    # aggregated model and its verdict, not the stricter geometric test
    for node in results["nodes"]:
        assert f"{node['name']} " in text and f"({node['node_id']})" not in text
        assert f"yes: {node['h_g_val_accuracy']:.3f} >= 0.4" in text
    assert "the aggregated model: good enough on 3 of 3 sites (their own check)" in text
    assert "inside 0 of" not in text


def test_a_run_can_write_a_picture_of_each_sites_check(tmp_path, capsys):
    from gems_fl.evaluation.result_plot import PLOT_FILE, site_figures
    from gems_fl.running.cli import main

    results = run_in_process(3, tmp_path)
    sites = site_figures(results)
    assert [s["name"] for s in sites] == ["partition-0", "partition-1", "partition-2"]
    per_node = results["verification"]["per_node"]
    for site in sites:
        accuracy = per_node[site["name"]]["accuracy"]
        assert site["gems"] == accuracy["gems"] and site["averaged"] == accuracy["averaged"]
        assert site["local"] == accuracy[f"local.{site['name']}"]  # the site's own model
        assert site["eps"] == 0.4
    path = tmp_path / "run-1" / "results.json"
    assert main(["show", "--plot", str(path)]) == 0
    picture = path.parent / PLOT_FILE
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"picture: {picture}" in capsys.readouterr().out
