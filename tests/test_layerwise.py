"""The layer-wise (MLP) protocol through the real ServerApp/ClientApp code."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from flwr.app import Array, Message

from gems_fl.evaluation.baselines import row_names
from gems_fl.protocol import wire
from tests.helpers import ROOT, run_in_process

MLP_FAST = {"model": "mlp", "hidden": "12,8", "num-directions": 20, "clusters": 6,
            "eps-neuron": 0.5}


def test_two_hidden_layers_one_round_per_layer_plus_output(tmp_path):
    seen: list[tuple[int, tuple]] = []

    def hook(reply: Message) -> Message:
        content = reply.content
        if wire.NEURONS_KEY in content:
            seen.append((int(reply.metadata.group_id), content[wire.NEURONS_KEY]["weight"].numpy().shape))
        elif wire.CENTER_KEY in content:
            seen.append((int(reply.metadata.group_id), content[wire.CENTER_KEY]["weight"].numpy().shape))
        return reply

    results = run_in_process(3, tmp_path, reply_hook=hook, **MLP_FAST)
    rounds = results["rounds"][:3]
    assert [r["round"] for r in results["rounds"]] == [1, 2, 3, 4]  # 4: the selection round
    assert [r["layer"] for r in rounds] == [1, 2, None]
    widths = results["hidden_widths"]
    assert widths == [rounds[0]["width"], rounds[1]["width"]]
    # Every client built its layers on the server's widths: fan-in of round j+1 == H'_j.
    assert {shape for rnd, shape in seen if rnd == 1} == {(12, 64)}
    assert {shape for rnd, shape in seen if rnd == 2} == {(8, widths[0])}
    assert {shape for rnd, shape in seen if rnd == 3} == {(10, widths[1])}
    for r in rounds:
        assert r["bytes_sent"] > 0 and r["bytes_received"] > 0 and r["wall_s"] > 0
    # Round 2 sends the aggregated first layer down: more bytes than round 1's settings.
    assert rounds[1]["bytes_sent"] > rounds[0]["bytes_sent"]
    assert list(results["rows"]) == list(row_names(True, "cheap"))
    assert results["rows"]["GEMS"]["hidden_widths"] == widths
    assert results["local_models_match_sent_layers"] is True
    assert results["rows"]["Ensemble"]["parameters"] == 3 * results["rows"]["Local"]["parameters"]


def test_node_rejected_in_a_round_takes_no_part_later(tmp_path):
    def hook(reply: Message) -> Message:
        if reply.metadata.src_node_id == 1001 and reply.metadata.group_id == "1":
            radius = reply.content[wire.NEURONS_KEY]["radius"].numpy().copy()
            radius[0] = np.nan
            from flwr.app import Array

            reply.content[wire.NEURONS_KEY]["radius"] = Array(radius)
        return reply

    results = run_in_process(3, tmp_path, reply_hook=hook, **MLP_FAST, **{"required-nodes": "2"})
    first, second, final, selection = results["rounds"]
    assert [r["node_id"] for r in first["rejected"]] == [1001]
    assert 1001 not in second["nodes"] and 1001 not in final["nodes"]
    assert 1001 not in selection["nodes"]
    assert "1001" in results["excluded_nodes"]
    assert len(results["nodes"]) == 2


def test_layerwise_run_is_deterministic(tmp_path):
    a = run_in_process(2, tmp_path / "a", **{**MLP_FAST, "hidden": "10"})
    b = run_in_process(2, tmp_path / "b", **{**MLP_FAST, "hidden": "10"})
    assert a["rows"] == b["rows"] and a["hidden_widths"] == b["hidden_widths"]


@pytest.mark.slow
def test_two_hidden_layer_flwr_simulation(tmp_path):
    from gems_fl.settings import lab_keys
    from gems_fl.settings.lab import fold_lab

    cfg = " ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                   for k, v in fold_lab(MLP_FAST, lab_keys()).items())
    proc = subprocess.run(
        [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), "--nodes", "3",
         "--run-config", cfg, "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert [r["layer"] for r in results["rounds"]] == [1, 2, None, None]  # 4: selection
    assert results["local_models_match_sent_layers"] is True
    assert "Ensemble" in proc.stdout


def test_freeze_hidden_makes_the_hidden_layers_a_fixed_extractor():
    import torch

    from gems_fl.learning.models import MLP, freeze_hidden

    model = MLP(4, [32], 3, dropout=0.5).train()
    x = torch.randn(64, 4)
    assert not torch.equal(model.features(x), model.features(x))  # dropout is on
    freeze_hidden(model)
    assert torch.equal(model.features(x), model.features(x))  # off after freezing
    assert not any(p.requires_grad for p in model.hidden.parameters())
    assert model.output.weight.requires_grad


@pytest.mark.parametrize("winner", [None, "mixture"])
def test_the_mlp_output_layer_is_chosen_on_the_nodes_validation_features(tmp_path, monkeypatch,
                                                                          winner):
    """``winner=None``: the pooled scores choose. Which family wins on digits can differ
    between machines (CI once kept a mixture point), so ``winner`` makes the first
    candidate of that family the best, and the same checks run on its branch."""
    from gems_fl.geometry import selection as geometry_selection
    from gems_fl.geometry.choices import GAUSSIAN_L2S, LDA_SHRINKAGES, POOLED_RIDGES
    from gems_fl.protocol import selection_round

    if winner is not None:
        first = {"mixture": len(POOLED_RIDGES) + len(LDA_SHRINKAGES) + len(GAUSSIAN_L2S)}[winner]

        def choose(losses, correct, rows, temperatures):
            chosen = geometry_selection.choose_candidate(losses, correct, rows, temperatures)
            acc = chosen.val_accuracy.copy()
            acc[first] = acc.max() + 1e-6
            return geometry_selection.Selection(
                first, float(temperatures[int(np.argmin(chosen.val_loss[first]))]), acc,
                chosen.val_loss)

        monkeypatch.setattr(selection_round, "choose_candidate", choose)

    exchanged = []

    def hook(reply: Message) -> Message:
        exchanged.append((reply.metadata.group_id, set(reply.content.keys())))
        return reply

    results = run_in_process(3, tmp_path, reply_hook=hook, **MLP_FAST)
    selection = results["rounds"][-1]["selection"]
    table = selection["candidates"]
    accuracies = [c["val_accuracy"] for c in table]
    # digits' layers are small, so the nodes sent class Gram matrices (class-grams=auto)
    assert [(c["point"], c["pooled_ridge"] or c.get("lda_shrinkage") or c.get("gaussian_l2"))
            for c in table] == \
        [("pooled", r) for r in POOLED_RIDGES] + [("lda", s) for s in LDA_SHRINKAGES] + \
        [("gaussian", v) for v in GAUSSIAN_L2S] + _mixture(table) + [("closed-form", None)]
    assert selection["val_accuracy"] == max(accuracies)
    kept = min((c for c in table if c["val_accuracy"] == max(accuracies)),
               key=lambda c: c["val_loss"])
    assert results["intersection"]["method"] == kept["point"]
    assert winner in (None, kept["point"])
    # the nodes answered with numbers only: no model, no space
    assert {keys == {"metrics"} for group, keys in exchanged if group == "4"} == {True}
    # the returned MLP's output layer is the selected candidate (scaled, if pooled)
    alone = ({"gram-point": "pooled", "pooled-ridge": kept["pooled_ridge"]}
             if kept["point"] == "pooled" else
             {"gram-point": "lda", "pooled-ridge": kept["lda_shrinkage"]}
             if kept["point"] == "lda" else
             {"gram-point": kept["point"], "pooled-ridge": kept["gaussian_l2"]}
             if kept["point"] in ("gaussian", "mixture") else {"gram-point": "closed-form"})
    fixed = run_in_process(3, tmp_path / "fixed", **{**MLP_FAST, **alone})
    assert [r["round"] for r in fixed["rounds"]] == [1, 2, 3]  # nothing left to choose
    saved = np.load(tmp_path / "run-1" / "gems_model.npz")
    one = np.load(tmp_path / "fixed" / "run-1" / "gems_model.npz")
    np.testing.assert_allclose(saved["output.weight"],
                               selection["temperature"] * one["output.weight"], rtol=1e-5)


def test_a_hidden_merge_in_which_nothing_merged_says_so_and_what_changes_it(tmp_path, caplog):
    """Tiny neuron tolerances: no two neurons' balls meet, the merged layer is the nodes'
    layers side by side, and the round's record, the log and the printed notes say so."""
    import logging

    flwr_logger = logging.getLogger("flwr")
    flwr_logger.addHandler(caplog.handler)
    try:
        results = run_in_process(3, tmp_path, **{**MLP_FAST, "eps-neuron": 1e-6})
    finally:
        flwr_logger.removeHandler(caplog.handler)
    first = results["rounds"][0]
    assert first["merge"]["num_intersected_groups"] == 0
    note = first["merge"]["note"]
    assert note.startswith("Layer 1: no neurons merged") and "eps-neuron" in note
    assert f"width {first['width']}" in note
    assert any("no neurons merged" in r.getMessage() for r in caplog.records)
    from gems_fl.evaluation.results import markdown_table

    assert note in markdown_table(results)


def test_mlp_without_server_data_reports_local_and_averaged_on_the_nodes(tmp_path):
    """evaluate-on-server=false: every node sends its whole round-1 MLP once (the one whose
    first layer it sent), and the evaluate round scores every Local model and Averaged on
    every node, as for the convex model; a node's bad model is rejected by name."""
    seen = []

    def hook(reply: Message) -> Message:
        seen.append(reply.metadata.group_id)
        if reply.metadata.group_id == "local-models" and reply.metadata.src_node_id == 1002:
            record = reply.content.array_records["model"]
            record["output.bias"] = Array(np.full(10, np.nan, dtype=np.float32))
        return reply

    results = run_in_process(3, tmp_path, reply_hook=hook,
                             **{**MLP_FAST, "evaluate-on-server": False, "required-nodes": "2"})
    assert seen.count("local-models") == 3
    report = results["local_models"]
    assert report["nodes"] == ["partition-0", "partition-1"]
    (bad,) = report["rejected"]
    assert bad["node_name"] == "partition-2" and "NaN" in bad["reason"]
    assert results["local_models_match_sent_layers"] is None  # one model missing
    pooled = results["verification"]["pooled"]
    assert list(pooled) == ["gems", "averaged", "local.partition-0", "local.partition-1"]
    for entry in results["verification"]["per_node"].values():
        assert set(entry["accuracy"]) == set(pooled)
    clean = run_in_process(3, tmp_path / "clean", **{**MLP_FAST, "evaluate-on-server": False})
    assert clean["local_models_match_sent_layers"] is True
    assert {"averaged", "local.partition-2"} <= set(clean["verification"]["pooled"])


def _mixture(table: list[dict]) -> list[tuple[str, float]]:
    """The mixture candidates the selection round scores where some node split a class
    into k-means components (class-components; on digits only classes large enough)."""
    from gems_fl.geometry.choices import GAUSSIAN_L2S

    return ([("mixture", v) for v in GAUSSIAN_L2S]
            if any(c["point"] == "mixture" for c in table) else [])
