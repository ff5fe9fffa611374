"""secure-aggregation=true: the Gram statistics reach the server only as SecAgg+ sums."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from gems_fl.protocol import secure
from gems_fl.settings import Settings, SettingsError
from tests.helpers import run_in_process

COMMON = {"label-division": "classes-per-node:4"}
LDA = {"gram-point": "lda"}  # solved from the sums alone: the same model up to quantisation


def test_a_secure_run_gives_the_plain_runs_model_and_the_server_holds_only_sums(
        tmp_path, strategies):
    # the plain run that keeps only the sums (server-grams=sums): the same statistics; at
    # the lda point, solved from the sums alone, the same model up to SecAgg+'s quantisation
    plain = run_in_process(4, tmp_path / "plain", **COMMON, **LDA, **{"server-grams": "sums"})
    results, grid = run_in_process(4, tmp_path / "secure", return_grid=True,
                                   **COMMON, **LDA, **{"secure-aggregation": True})
    strategy = strategies[1]

    # what reached the strategy: round 1 replies with metrics only, no model or matrix
    assert strategy.seen and all(set(r.content.keys()) == {"metrics"} for r in strategy.seen)
    assert all(r.space.center is None and not hasattr(r.space, "gram")
               for r in strategy.outcome.accepted)
    assert strategy.sums.nodes == 4

    # the same point as the plain run, up to SecAgg+'s quantisation
    models = [np.load(tmp_path / m / "run-1" / "gems_model.npz") for m in ("plain", "secure")]
    for key in ("weight", "bias"):
        np.testing.assert_allclose(models[1][key], models[0][key],
                                   atol=1e-3 * np.abs(models[0][key]).max())
    assert results["rows"]["GEMS"]["accuracy"] == pytest.approx(
        plain["rows"]["GEMS"]["accuracy"], abs=0.005)
    assert results["rows"]["Local"]["accuracy"] is None  # the server holds no node model

    # membership: each node's own check, complete
    assert all(n["inside_by_node"] is not None and n["inside"] == n["inside_by_node"]
               for n in results["nodes"])
    assert results["intersection"]["inside"] == plain["intersection"]["inside"]
    record = results["rounds"][0]["secure_aggregation"]
    assert record["nodes"] == 4 and record["max_weight"] == max(
        n["num_train"] for n in results["nodes"])
    # the round's bytes hold SecAgg+'s stages (keys, shares, masked vectors, unmasking)
    assert record["messages"] >= 4 * 4 and record["bytes_received"] > 0
    assert results["rounds"][0]["bytes_received"] > record["bytes_received"] > \
        plain["rounds"][0]["bytes_received"] / 2
    assert results["privacy"] == {
        "secure_aggregation": True, "server_holds": "sums", "dp": None,
        "server_receives": "only the SecAgg+ sum of the nodes' statistics"}


def test_secure_aggregation_offers_the_class_gram_point_of_the_plain_run(tmp_path):
    """Class Gram matrices are sums per class, so SecAgg+ carries them: the secure run's
    selection round has the gaussian point, as the plain run that keeps only sums, and
    picks the same point.

    Which L2 of the gaussian grid wins can differ: its smallest L2s fit nearly without a
    penalty, and their validation scores move by a row of 128 with rounding alone (the
    plain run itself picks 1e-6 under OpenBLAS's AVX512 kernels and 1e-5 under its
    Haswell ones). So the two runs' models are compared at one L2 where the fit is
    well-posed: the gaussian fit's virtual rows feel SecAgg+'s quantisation, so they
    agree in accuracy, not to the bit."""
    plain = run_in_process(4, tmp_path / "plain", **COMMON, **{"server-grams": "sums"})
    secure = run_in_process(4, tmp_path / "secure", **COMMON, **{"secure-aggregation": True})
    assert secure["plan"]["points"] == plain["plan"]["points"] == [
        "pooled", "lda", "gaussian", "closed-form"]
    assert secure["intersection"]["method"] == plain["intersection"]["method"] == "gaussian"

    at = {"gram-point": "gaussian", "pooled-ridge": 1e-4}
    plain = run_in_process(4, tmp_path / "plain-at", **COMMON, **at, **{"server-grams": "sums"})
    secure = run_in_process(4, tmp_path / "secure-at", **COMMON, **at,
                            **{"secure-aggregation": True})
    assert secure["intersection"]["method"] == plain["intersection"]["method"] == "gaussian"
    assert secure["rows"]["GEMS"]["accuracy"] == pytest.approx(
        plain["rows"]["GEMS"]["accuracy"], abs=0.01)


def test_the_same_seed_gives_the_same_secure_sums(tmp_path):
    for name in ("a", "b"):
        run_in_process(3, tmp_path / name, **COMMON, **{"secure-aggregation": True})
    a, b = (np.load(tmp_path / n / "run-1" / "gems_model.npz") for n in ("a", "b"))
    for key in ("weight", "bias"):
        np.testing.assert_array_equal(a[key], b[key])


def _drop_in_stage(node_ids: set[int], stage: str):
    """A reply hook: the nodes in ``node_ids`` never answer SecAgg+'s ``stage``
    (``keys``: the setup stage's public keys; ``masked``: the masked vectors)."""
    def hook(reply: Message) -> Message | None:
        if reply.metadata.src_node_id in node_ids and _replied_stage(reply) == stage:
            return None
        return reply
    return hook


def _replied_stage(reply: Message) -> str | None:
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    if not reply.has_content() or RECORD_KEY_CONFIGS not in reply.content.config_records:
        return None
    configs = reply.content.config_records[RECORD_KEY_CONFIGS]
    return ("masked" if Key.MASKED_PARAMETERS in configs else
            "keys" if Key.PUBLIC_KEY_1 in configs else "other")


def test_a_site_that_drops_out_in_secagg_is_named_and_the_sums_hold_the_others(tmp_path):
    results = run_in_process(4, tmp_path, reply_hook=_drop_in_stage({1002}, "masked"),
                             **COMMON, **LDA, **{"secure-aggregation": True,
                                                 "required-nodes": "3"})
    rejected = {r["node_name"]: r["reason"] for r in results["rejected"]}
    assert "secure aggregation" in rejected["partition-2"]
    assert sorted(n["name"] for n in results["nodes"]) == ["partition-0", "partition-1",
                                                           "partition-3"]
    assert results["rounds"][0]["secure_aggregation"]["nodes"] == 3
    # the sums are those of the three others: the plain run without that node agrees
    without = run_in_process(4, tmp_path / "plain", **COMMON, **LDA, **{"required-nodes": "3"},
                             **{"server-grams": "sums"},
                             reply_hook=lambda r: None if r.metadata.src_node_id == 1002 else r)
    models = [np.load(tmp_path / m / "gems_model.npz") for m in ("run-1", "plain/run-1")]
    for key in ("weight", "bias"):
        np.testing.assert_allclose(models[0][key], models[1][key],
                                   atol=3e-3 * np.abs(models[1][key]).max())  # quantisation
    assert results["rows"]["GEMS"]["accuracy"] == pytest.approx(
        without["rows"]["GEMS"]["accuracy"], abs=0.005)


def test_below_the_threshold_the_run_fails_clearly(tmp_path):
    from gems_fl.protocol.replies import NotEnoughRepliesError

    with pytest.raises(NotEnoughRepliesError, match="secure aggregation halted"):
        run_in_process(4, tmp_path, reply_hook=_drop_in_stage({1001, 1002, 1003}, "keys"),
                       **COMMON, **{"secure-aggregation": True, "required-nodes": "1"})


@pytest.mark.parametrize("bad", [{"model": "mlp"}, {"refine_rounds": 2},
                                 {"gram_point": "mixture"}, {"space": "ball"},
                                 {"server_grams": "nodes"},
                                 {"label_moments": False, "gram_point": "closed-form"}])
def test_secure_aggregation_refuses_what_needs_single_nodes(bad):
    with pytest.raises(SettingsError, match="secure-aggregation=true"):
        Settings(secure_aggregation=True, **bad)


def test_a_node_refuses_to_let_secagg_clip_a_statistic():
    from flwr.app import ConfigRecord, RecordDict

    stats = {"gram": np.array([0.5, 2.0]), "center-gram": np.ones(3), "moments": np.ones(3),
             "class-shares": np.ones(2) / 2}
    config = {f"{secure.SCALE_PREFIX}{k}": 1.0 for k in secure.BLOCKS}
    msg = type("Msg", (), {"content": RecordDict({"fitins.config": ConfigRecord(config)})})()
    with pytest.raises(ValueError, match="SecAgg\\+ would clip it"):
        secure.secure_fit_reply(msg, stats, 10, seed=0)


@pytest.mark.slow
def test_a_secure_run_through_flower(tmp_path):
    """3 SuperNodes through `gems-fl run` (Flower's simulation): SecAgg+ between the real
    ServerApp and ClientApp processes."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), "--nodes", "3",
         "--run-config", "num-directions=50 secure-aggregation=true", "--output-dir",
         str(tmp_path)], capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert results["status"] == "completed"
    assert results["privacy"]["secure_aggregation"] is True
    assert results["rounds"][0]["secure_aggregation"]["nodes"] == 3
    assert all(n["inside_by_node"] is not None for n in results["nodes"])
    assert results["rows"]["GEMS"]["accuracy"] > 0.9
