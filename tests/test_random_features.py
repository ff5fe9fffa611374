"""model='random-features': the map from the seed, its bandwidth from sums, the settings,
and a run whose saved model predicts as the run scored it."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from gems_fl.api import load_model
from gems_fl.data import load_dataset
from gems_fl.data.agreement import DataAgreement
from gems_fl.data.random_features import (
    BANDWIDTH_FACTOR,
    RandomFeatures,
    bandwidth_from_stats,
)
from gems_fl.data.site_files import feature_stats
from gems_fl.settings import Settings, SettingsError
from gems_lab.fedavg import feature_map, run_federated
from tests.helpers import FAST, ROOT, app_defaults, run_in_process

DIGEST = ("import hashlib, sys; from gems_fl.data.random_features import RandomFeatures; "
          "w, b = RandomFeatures('{kind}', 64, 256, 1.5, 7).weights(); "
          "sys.stdout.write(hashlib.sha256(w.tobytes() + b.tobytes()).hexdigest())")


@pytest.mark.parametrize("kind", ["fourier", "relu"])
def test_the_map_is_the_same_bit_for_bit_in_another_process(kind):
    w, b = RandomFeatures(kind, 64, 256, 1.5, 7).weights()
    here = hashlib.sha256(w.tobytes() + b.tobytes()).hexdigest()
    done = subprocess.run([sys.executable, "-c", DIGEST.format(kind=kind)], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    assert done.stdout == here
    other_seed = RandomFeatures(kind, 64, 256, 1.5, 8).weights()[0]
    assert not np.array_equal(other_seed, w)


def test_fourier_features_are_bounded_and_relu_features_are_not_negative():
    x = np.random.default_rng(0).normal(size=(300, 10)) * 3
    z = RandomFeatures("fourier", 10, 64, 2.0, 0).transform(x)
    assert z.shape == (300, 64) and z.dtype == np.float32
    assert np.all(np.linalg.norm(z, axis=1) <= np.sqrt(2) + 1e-5)
    assert np.all(RandomFeatures("relu", 10, 64, 2.0, 0).transform(x) >= 0)
    # more rows than one chunk: the same as mapping each row alone
    big = np.random.default_rng(1).normal(size=(5000, 10))
    f = RandomFeatures("fourier", 10, 16, 2.0, 0)
    np.testing.assert_allclose(f.transform(big)[[0, 4500]], f.transform(big[[0, 4500]]), atol=1e-6)


def test_the_map_approximates_the_gaussian_kernel_of_its_bandwidth():
    x = np.random.default_rng(3).normal(size=(40, 5))
    z = RandomFeatures("fourier", 5, 20000, 2.5, 0).transform(x).astype(np.float64)
    distances = np.square(x[:, None] - x[None]).sum(-1)
    np.testing.assert_allclose(z @ z.T, np.exp(-distances / (2 * 2.5 ** 2)), atol=0.05)


def test_bad_maps_are_refused_with_what_to_change():
    with pytest.raises(ValueError, match="rf-map='cosine'"):
        RandomFeatures("cosine", 3, 8, 1.0, 0)
    with pytest.raises(ValueError, match="rf-bandwidth"):
        RandomFeatures("fourier", 3, 8, 0.0, 0)
    with pytest.raises(ValueError, match="takes 3 features"):
        RandomFeatures("fourier", 3, 8, 1.0, 0).transform(np.zeros((2, 4)))


def test_the_bandwidth_from_sums_is_the_same_however_the_rows_are_split():
    x = np.random.default_rng(4).normal(size=(600, 6)) * np.arange(1, 7)
    whole = bandwidth_from_stats([feature_stats(x)])
    split = bandwidth_from_stats([feature_stats(x[:50]), feature_stats(x[50:400]),
                                  feature_stats(x[400:])])
    assert split == pytest.approx(whole, rel=1e-12)
    # factor x the RMS distance between two rows: E|x - x'|^2 = 2 sum var
    pairs = np.square(x[:, None] - x[None]).sum(-1)
    rms = np.sqrt(pairs.sum() / (len(x) * (len(x) - 1)))
    assert whole == pytest.approx(BANDWIDTH_FACTOR * rms, rel=0.01)
    # the features as the nodes scale them: divided by the scaling's std
    std = x.std(axis=0)
    assert bandwidth_from_stats([feature_stats(x)], std) == pytest.approx(
        BANDWIDTH_FACTOR * np.sqrt(2 * 6), rel=1e-9)
    with pytest.raises(ValueError, match="give rf-bandwidth"):
        bandwidth_from_stats([feature_stats(np.ones((5, 3)))])


def test_the_agreement_carries_the_map_to_the_nodes():
    features = RandomFeatures("relu", 4, 32, 0.7, 3)
    agreement = DataAgreement(4, ["a", "b"], features=features)
    assert agreement.model_features == 32
    back = DataAgreement.from_config(agreement.to_config())
    assert back.features == features and back.model_features == 32
    assert DataAgreement.from_config(DataAgreement(4, ["a", "b"]).to_config()).features is None


def test_the_settings_of_the_map():
    settings = Settings(model="random-features", rf_dim=512, rf_bandwidth="2.5")
    assert settings.identity_sums  # the bandwidth's sums
    assert not Settings(model="random-features", rf_bandwidth="2.5", dp_epsilon=1.0,
                        feature_ranges="").identity_sums
    with pytest.raises(SettingsError, match="rf-bandwidth"):
        Settings(model="random-features", dp_epsilon=1.0)
    Settings(model="random-features", dp_epsilon=1.0, rf_bandwidth="3")
    with pytest.raises(SettingsError, match="rf-bandwidth"):
        Settings(rf_bandwidth="wide")
    with pytest.raises(SettingsError, match="rf-map"):
        Settings(rf_map="cosine")
    # gram-rank is checked against the map's width, not the pixels'
    Settings(model="random-features", dataset="digits", rf_dim=512, gram_rank=100)
    with pytest.raises(SettingsError, match="gram-rank=600"):
        Settings(model="random-features", dataset="digits", rf_dim=512, gram_rank=600)


def test_a_random_feature_run_saves_a_model_that_predicts_as_the_run_scored_it(tmp_path):
    results = run_in_process(3, tmp_path, **{"model": "random-features", "rf-dim": 256,
                                             "label-division": "iid", "baselines": "none"})
    spec = results["dataset"]["random_features"]
    assert spec["rf-dim"] == 256 and spec["rf-inputs"] == 64 and spec["rf-seed"] == 0
    assert results["plan"]["model"] == "random-features"
    assert results["verification"]["good_enough"] == 3
    loaded = load_model(tmp_path / "run-1")
    assert loaded.features == RandomFeatures.from_config(spec)
    assert loaded.layers[-1][0].shape == (10, 256)
    splits = load_dataset("digits", seed=0)
    accuracy = float(np.mean(loaded.predict(splits.test_x) == splits.test_y.astype(str)))
    assert accuracy == pytest.approx(results["rows"]["GEMS"]["accuracy"], abs=1e-9)
    assert accuracy > 0.9
    # FedAvg beside it fits the same model: the map the run agreed on, from the settings
    cfg = {**app_defaults(), "model": "random-features", "rf-dim": 256, "label-division": "iid"}
    fedavg_map = feature_map(Settings.from_run_config(cfg), 3, splits)
    assert fedavg_map.bandwidth == pytest.approx(spec["rf-bandwidth"], rel=1e-9)
    assert replace(fedavg_map, bandwidth=spec["rf-bandwidth"]) == loaded.features


def test_fedavg_trains_the_random_feature_model_on_mapped_rows():
    cfg = {**app_defaults(), **FAST, "model": "random-features", "rf-dim": 128}
    curve = run_federated(cfg, 3, "fedavg", num_rounds=3, local_epochs=5)
    per_round = np.diff([0, *curve.bytes_up])
    assert per_round[0] > 3 * 129 * 10 * 4  # three (128 + 1) x 10 models: the mapped width
    assert curve.accuracy[-1] > 0.3, "three rounds of five epochs must learn something"
    assert feature_map(Settings.from_run_config({**app_defaults(), **FAST}), 3, None) is None


def test_dp_noise_is_calibrated_to_the_fourier_map_s_bound():
    from gems_fl.settings.options import dp_spec, node_config

    fourier = Settings(model="random-features", dp_epsilon=1.0, rf_bandwidth="3")
    assert dp_spec(fourier).clip == pytest.approx(np.sqrt(2))
    relu = Settings(model="random-features", dp_epsilon=1.0, rf_bandwidth="3", rf_map="relu")
    assert dp_spec(relu).clip == 5.0  # ReLU features have no such bound: dp-clip
    assert dp_spec(Settings(model="random-features", dp_epsilon=1.0, rf_bandwidth="3",
                            dp_clip=1.0)).clip == 1.0
    # the nodes, which add the noise, read the same clip from what they receive
    from gems_fl.settings.plan import build_plan

    sent = node_config(fourier, build_plan(fourier, 3, 512))
    assert dp_spec(Settings.from_node_config(sent)).clip == pytest.approx(np.sqrt(2))


@pytest.mark.parametrize("privacy", [{"secure-aggregation": True},
                                     {"dp-epsilon": 8.0, "dp-seeded-noise": True,
                                      "rf-bandwidth": "4"}])
def test_privacy_modes_run_on_the_random_features(tmp_path, privacy):
    results = run_in_process(3, tmp_path, **{"model": "random-features", "rf-dim": 128,
                                             "label-division": "iid", "baselines": "none",
                                             **privacy})
    # well above chance (0.1); DP at epsilon 8 on ~400 rows a node costs some
    assert results["rows"]["GEMS"]["accuracy"] > (0.6 if "dp-epsilon" in privacy else 0.85)
    assert results["dataset"]["random_features"]["rf-dim"] == 128
    if "dp-epsilon" in privacy:
        assert results["privacy"]["dp"]["clip"] == pytest.approx(np.sqrt(2))
        assert results["dataset"]["random_features"]["rf-bandwidth"] == 4.0
    else:
        assert results["privacy"]["secure_aggregation"]


def test_the_classifier_fits_random_features_on_unscaled_sites_and_saves_the_map(tmp_path):
    """Wine's features lie on very different scales: the federated scaling comes first,
    then the map, whose bandwidth is derived from the scaled features' sums."""
    from gems_fl.estimator import GEMSClassifier
    from tests.test_api import _wine_sites

    sites, x_test, y_test = _wine_sites()
    clf = GEMSClassifier(eps=0.5, model="random-features", settings={"rf-dim": 64}).fit(sites)
    features = clf.model_.features
    assert features is not None and features.dim == 64 and features.num_inputs == 13
    # 13 standardised features: 0.6 x sqrt(2 x 13), up to the sums' rounding
    assert features.bandwidth == pytest.approx(0.6 * np.sqrt(26), rel=1e-6)
    assert clf.model_.mean is not None
    assert clf.score(x_test, y_test) > 0.85
    loaded = load_model(clf.save(tmp_path / "model"))
    assert loaded.features == features
    np.testing.assert_array_equal(loaded.logits(x_test), clf.decision_function(x_test))


def test_the_evaluate_round_checks_h_g_in_the_factor_the_node_kept_without_rebuilding_it(
        monkeypatch):
    from flwr.app import Context, RecordDict

    from gems_fl.geometry import kinds
    from gems_fl.protocol import verify

    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 40))
    _, factor, residual = kinds.node_gram(x, 8)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    assert verify.kept_gram(context) is None
    verify.keep_own_factor(context, factor, residual)
    center = rng.standard_normal((3, 41))
    gems = center + 0.01 * rng.standard_normal((3, 41))
    as_state = lambda w: {"weight": w[:, :-1], "bias": w[:, -1]}
    content = verify.encode_evaluate({}, {"gems": as_state(gems)}, own=(as_state(center), 0.5))
    rebuilt = verify.check_own_space(content, x, 8)
    monkeypatch.setattr(kinds, "node_gram", lambda *a: pytest.fail("rebuilt the Gram matrix"))
    kept = verify.check_own_space(content, x, 8, gram=verify.kept_gram(context))
    assert kept["space.inside"] == rebuilt["space.inside"]
    assert kept["space.distance"] == pytest.approx(rebuilt["space.distance"], rel=1e-6)
