"""dp-epsilon: each node's Gram statistics leave it clipped and noised, with the guarantee
the accountant reports; nothing else of the node's model reaches the server."""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Message

from gems_fl.geometry.dp import (
    DPSpec,
    clip_rows,
    epsilon_spent,
    gaussian_sigma,
    noised_statistics,
    row_sensitivity,
)
from gems_fl.geometry.gram import unpack_triangle
from gems_fl.geometry.gram_sums import GramSums
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import node_data_options
from tests.helpers import FAST, app_defaults, run_in_process

COMMON = {"label-division": "classes-per-node:4"}
DP = {"dp-epsilon": 8.0, "dp-seeded-noise": True}


# ---------------------------------------------------------------- the mechanism
def _exact(x, y, clip, num_classes=3):
    """The release without noise: (S_G triangle, S_M) flattened."""
    spec = DPSpec(1.0, 1e-5, clip)
    zero = type("NoNoise", (), {"normal": staticmethod(lambda m, s, shape: np.zeros(shape))})()
    out = noised_statistics(x, y, num_classes, spec, zero)
    return np.concatenate([out["gram"], out["moments"].ravel()])


@pytest.mark.parametrize("clip", [0.5, 1.0, 5.0])
def test_replacing_one_row_moves_the_release_by_at_most_the_sensitivity(clip):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 4)) * 3
    y = rng.integers(0, 3, 20)
    worst = 0.0
    # random replacements, and the adversarial one: a row at the clip, its opposite
    for trial in range(200):
        x2, y2 = x.copy(), y.copy()
        x2[0] = rng.normal(size=4) * 10 if trial else -x[0] * 100
        y2[0] = rng.integers(0, 3) if trial else y[0]
        worst = max(worst, float(np.linalg.norm(_exact(x, y, clip) - _exact(x2, y2, clip))))
    assert 0 < worst <= row_sensitivity(clip) + 1e-9
    # and the bound is not loose by more than the triangle's missing half
    assert worst > 0.5 * row_sensitivity(clip)


def test_clip_rows_bounds_every_norm_and_keeps_short_rows():
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    out = clip_rows(x, 1.0)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(out[1], x[1])


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0, 8.0])
def test_the_noise_gives_the_asked_guarantee_by_the_accountant(epsilon):
    sens = row_sensitivity(5.0)
    sigma = gaussian_sigma(epsilon, 1e-5, sens)
    assert epsilon_spent(sigma, sens, 1e-5) == pytest.approx(epsilon, rel=1e-4)
    # less noise would spend more: the calibration is the smallest noise
    assert epsilon_spent(0.95 * sigma, sens, 1e-5) > epsilon
    if epsilon < 1:  # the classical bound sqrt(2 ln(1.25/delta)) / eps is looser
        assert sigma < sens * math.sqrt(2 * math.log(1.25 / 1e-5)) / epsilon


def test_the_noise_has_the_calibrated_spread():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(50, 100)), rng.integers(0, 3, 50)
    spec = DPSpec(2.0, 1e-5, 1.0)
    noised = noised_statistics(x, y, 3, spec, np.random.default_rng(7))
    noise = np.concatenate([noised["gram"], noised["moments"].ravel()]) - _exact(x, y, 1.0)
    assert np.std(noise) == pytest.approx(spec.sigma, rel=0.05)
    assert abs(np.mean(noise)) < 0.05 * spec.sigma


def test_noised_sums_give_no_closed_form_and_cannot_mix_with_plain_replies():
    sums = GramSums(2, 3)
    sums.add_noised(10, np.eye(3) * 10, np.ones((2, 3)) * 5)
    assert not sums.has_centers and sums.class_counts.tolist() == [5, 5]
    with pytest.raises(ValueError, match="closed-form"):
        sums.center_system()
    with pytest.raises(ValueError, match="cannot share"):
        sums.add(10, np.zeros((2, 3)), np.eye(3), np.ones((2, 3)) / 2, np.array([5, 5]))
    assert sums.nodes == 1 and sums.count == 10  # nothing added
    np.testing.assert_allclose(sums.pooled_gram(), np.eye(3))


# ---------------------------------------------------------------- through the apps
def test_a_dp_run_sends_only_noised_sums_and_reports_the_guarantee(tmp_path, strategies):
    results = run_in_process(4, tmp_path, **COMMON, **DP)
    strategy = strategies[0]

    # what reached the strategy in round 1: metrics and the noised sums, no model
    assert strategy.seen and all(set(r.content.keys()) == {"metrics", "dp-release"}
                                 for r in strategy.seen[:4])
    assert all(r.space.center is None for r in strategy.outcome.accepted)
    assert strategy.sums.nodes == 4 and not strategy.sums.has_centers
    # no candidate needs W_k G_k: the closed-form point is not offered
    assert all(c["point"] != "closed-form" for c in results["rounds"][1]["candidates"])
    assert results["rows"]["Local"]["accuracy"] is None
    assert results["rows"]["GEMS"]["accuracy"] > 0.3  # noisy, yet far above chance (0.1)

    assert results["privacy"]["server_receives"] == "each node's noised sums (no model)"
    dp = results["privacy"]["dp"]
    assert dp["epsilon"] == 8.0 and dp["delta"] == 1e-5 and dp["clip"] == 5.0
    assert dp["epsilon_spent"] == pytest.approx(8.0, rel=1e-4)
    assert dp["noise_std"] == pytest.approx(gaussian_sigma(8.0, 1e-5, row_sensitivity(5.0)))
    assert "seeded" in dp["noise_source"]
    # each node checked h_G against the space it kept
    assert all(n["inside_by_node"] is not None for n in results["nodes"])


def test_the_server_sums_are_the_nodes_releases(tmp_path, strategies):
    """The sums the server solved from equal the nodes' own seeded draws."""
    from gems_fl.data.nodes import cast_node_arrays, load_node_data
    from gems_fl.protocol.private import node_release
    from gems_fl.settings.options import dp_spec

    run_in_process(3, tmp_path, **COMMON, **DP)
    strategy = strategies[0]
    settings = Settings.from_run_config({**app_defaults(), **FAST, **COMMON, **DP})
    spec = dp_spec(settings)
    total_g, total_m, rows = 0.0, 0.0, 0
    for k in range(3):
        data = cast_node_arrays(load_node_data(node_data_options(settings), {"partition-id": k,
                                                          "num-partitions": 3}))
        x, y, _, _ = data.arrays
        release = node_release(x, y, data.num_classes, spec, data.seed,
                               seeded_noise=settings.dp_seeded_noise)
        total_g = total_g + unpack_triangle(release["gram"], x.shape[1] + 1)
        total_m, rows = total_m + release["moments"], rows + len(y)
    np.testing.assert_allclose(strategy.sums.pooled_gram(), total_g / rows, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(strategy.sums.pooled_moments(), total_m / rows, rtol=1e-5,
                               atol=1e-4)


def test_seeded_noise_repeats_and_entropy_noise_does_not(tmp_path):
    models = {}
    entropy = {"dp-epsilon": 8.0, "min-good-enough": "0"}  # fresh noise: any verdict
    for name, extra in (("a", DP), ("b", DP), ("c", entropy), ("d", entropy)):
        run_in_process(3, tmp_path / name, **COMMON, **extra)
        models[name] = np.load(tmp_path / name / "run-1" / "gems_model.npz")["weight"]
    np.testing.assert_array_equal(models["a"], models["b"])
    assert not np.allclose(models["c"], models["d"])


def test_dp_through_secure_aggregation_gives_the_plain_dp_model(tmp_path, strategies):
    plain = run_in_process(4, tmp_path / "dp", **COMMON, **DP)
    secure = run_in_process(4, tmp_path / "both", **COMMON, **DP,
                            **{"secure-aggregation": True})
    assert all(set(r.content.keys()) == {"metrics"} for r in strategies[1].seen[:4])
    models = [np.load(tmp_path / m / "run-1" / "gems_model.npz") for m in ("dp", "both")]
    for key in ("weight", "bias"):
        np.testing.assert_allclose(models[1][key], models[0][key],
                                   atol=2e-3 * np.abs(models[0][key]).max())
    assert secure["privacy"]["secure_aggregation"] and secure["privacy"]["dp"]["epsilon"] == 8
    assert "noised on its node" in secure["privacy"]["server_receives"]
    assert secure["rows"]["GEMS"]["accuracy"] == pytest.approx(
        plain["rows"]["GEMS"]["accuracy"], abs=0.01)


def _break_release(node_id: int, how: str):
    def hook(reply: Message) -> Message:
        if reply.metadata.src_node_id == node_id and reply.has_content() \
                and "dp-release" in reply.content.array_records:
            from gems_fl.protocol import wire

            record = reply.content.array_records["dp-release"]
            arrays = {k: record[k].numpy().copy() for k in record.keys()}
            if how == "nan":
                arrays["gram"][3] = np.nan
            else:
                arrays["moments"] = arrays["moments"][:, :-1]
            reply.content.array_records["dp-release"] = wire.array_record(arrays)
        return reply
    return hook


@pytest.mark.parametrize("how", ["nan", "shape"])
def test_a_malformed_release_is_refused_by_name_and_the_round_goes_on(tmp_path, how):
    results = run_in_process(4, tmp_path, reply_hook=_break_release(1002, how), **COMMON,
                             **DP, **{"required-nodes": "3"})
    rejected = {r["node_name"]: r["reason"] for r in results["rejected"]}
    assert "partition-2" in rejected
    assert ("NaN" in rejected["partition-2"]) if how == "nan" else \
        ("shapes" in rejected["partition-2"])
    assert len(results["nodes"]) == 3 and results["rows"]["GEMS"]["accuracy"] is not None


@pytest.mark.parametrize("bad", [{"model": "mlp"}, {"refine_rounds": 2},
                                 {"gram_point": "mixture"}, {"gram_point": "closed-form"},
                                 {"space": "ellipsoid"}, {"server_grams": "nodes"},
                                 {"label_moments": False, "gram_point": "closed-form"},
                                 {"standardize": "federated"}])
def test_dp_refuses_what_needs_a_nodes_model(bad):
    with pytest.raises(SettingsError, match="dp-epsilon=1: nodes send only noised sums"):
        Settings(dp_epsilon=1.0, **bad)


@pytest.mark.parametrize("bad, match", [({"dp_epsilon": -1.0}, "dp-epsilon"),
                                        ({"dp_epsilon": math.inf}, "finite"),
                                        ({"dp_epsilon": 1.0, "dp_delta": 1.0}, "dp-delta"),
                                        ({"dp_epsilon": 1.0, "dp_clip": 0.0}, "dp-clip")])
def test_dp_values_are_checked(bad, match):
    with pytest.raises(SettingsError, match=match):
        Settings(**bad)


def test_dp_widens_the_ridges_the_nodes_choose_from_and_reaches_the_nodes():
    from gems_fl.geometry.choices import DP_POOLED_RIDGES, POOLED_RIDGES

    assert Settings().pooled_ridges == POOLED_RIDGES
    assert Settings(dp_epsilon=1.0).pooled_ridges == DP_POOLED_RIDGES
    assert Settings(dp_epsilon=1.0, pooled_ridge="0.5").pooled_ridges == (0.5,)
    nodes = Settings(dp_epsilon=1.0).for_nodes()
    assert {"dp-epsilon", "dp-delta", "dp-clip", "dp-seeded-noise"} <= set(nodes)


@pytest.mark.slow
def test_a_dp_run_through_flower(tmp_path):
    """3 SuperNodes through `gems-fl run` (Flower's simulation), noise from the nodes'
    own entropy: the run completes and records the guarantee."""
    import json
    import subprocess
    import sys

    from tests.helpers import ROOT

    proc = subprocess.run(
        [sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), "--nodes", "3",
         "--run-config", "num-directions=50 dp-epsilon=4 min-good-enough=0", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert results["status"] == "completed"
    dp = results["privacy"]["dp"]
    assert dp["epsilon_spent"] == pytest.approx(4.0, rel=1e-4)
    assert dp["noise_source"] == "operating-system entropy"
    assert results["rows"]["Local"]["accuracy"] is None
    assert all(n["inside_by_node"] is not None for n in results["nodes"])
    assert results["rows"]["GEMS"]["accuracy"] > 0.2
