"""model='kernel': the Nyström map, the nodes' class centres, the landmark round, and the
model a user takes home."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from gems_fl.api import GEMSModel, load_model
from gems_fl.data.kernel_features import (
    MIN_ROWS_PER_LANDMARK,
    KernelFeatures,
    LandmarkRound,
    class_centres,
    landmark_quotas,
    principal_coordinates,
)
from gems_fl.protocol import map_round, wire
from gems_fl.protocol.replies import ReplyError
from gems_fl.protocol.rounds import ROUND_NAME_KEY, Round
from gems_fl.settings import Settings, SettingsError
from tests.helpers import run_in_process


def _rbf(a, b, s):
    return np.exp(-((a[:, None, :] - b[None, :, :]) ** 2).sum(-1) / (2 * s * s))


def test_the_map_is_the_rows_beside_the_nystrom_features():
    rng = np.random.default_rng(0)
    marks, x = rng.normal(size=(12, 5)), rng.normal(size=(30, 5))
    fmap = KernelFeatures(marks, 2.0)
    z = fmap.transform(x)
    assert z.shape == (30, 5 + 12) and fmap.dim == 17
    np.testing.assert_allclose(z[:, :5], x.astype(np.float32))
    # on the landmarks the map reproduces the kernel exactly; elsewhere its projection
    kz = fmap.transform(marks)[:, 5:]
    np.testing.assert_allclose(kz @ kz.T / 12, _rbf(marks, marks, 2.0), atol=1e-4)
    k_xl = _rbf(x, marks, 2.0)
    approx = k_xl @ np.linalg.solve(_rbf(marks, marks, 2.0), k_xl.T)
    np.testing.assert_allclose(z[:, 5:] @ z[:, 5:].T / 12, approx, atol=1e-3)
    assert KernelFeatures(marks, 2.0, raw=False).transform(x).shape == (30, 12)


def test_the_map_travels_in_a_config_and_a_saved_model_and_refuses_a_mismatch():
    marks = np.random.default_rng(1).normal(size=(7, 3))
    fmap = KernelFeatures(marks, 0.7)
    back = KernelFeatures.from_config(fmap.to_config())
    assert back.digest() == fmap.digest() and back.bandwidth == 0.7
    x = np.random.default_rng(2).normal(size=(4, 3))
    np.testing.assert_array_equal(back.transform(x), fmap.transform(x))
    saved = KernelFeatures.from_saved(fmap.to_json(), fmap.arrays())
    assert saved.digest() == fmap.digest()
    other = {"feature-map.landmarks": marks[:6]}
    with pytest.raises(ValueError, match="different runs"):
        KernelFeatures.from_saved(fmap.to_json(), other)
    with pytest.raises(ValueError, match="NaN"):
        KernelFeatures(np.full((2, 3), np.nan), 1.0)
    with pytest.raises(ValueError, match="positive"):
        KernelFeatures(marks, 0.0)
    with pytest.raises(ValueError, match="takes 3 features"):
        fmap.transform(np.zeros((2, 4)))


def test_class_centres_are_means_of_enough_rows_in_proportion_to_each_class():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    y = np.repeat([0, 1, 2], [300, 90, 10])
    assert landmark_quotas(y, 0.1) == {0: 30, 1: 9, 2: 1}
    assert landmark_quotas(y, 0.5) == {0: 60, 1: 18, 2: 2}  # one per MIN_ROWS rows at most
    centres, sizes = class_centres(x, y, 0.1, seed=0)
    assert len(centres) == len(sizes) <= 40 and sizes.min() >= MIN_ROWS_PER_LANDMARK
    assert sizes.sum() <= len(y)
    again = class_centres(x, y, 0.1, seed=0)
    np.testing.assert_array_equal(centres, again[0])
    # each centre is the mean of rows of one class: a class of one point is its mean
    same = np.ones((20, 4), np.float32)
    c, s = class_centres(same, np.zeros(20), 0.2, seed=0)
    np.testing.assert_allclose(c, 1.0)
    assert s.sum() == 20


def test_wide_rows_are_clustered_on_their_top_principal_directions():
    """Rows of more columns than CLUSTER_DIRECTIONS are clustered on their top principal
    coordinates (distances there are the whole rows' distances less what the other
    directions add); narrower rows are clustered as they are; a centre is the mean of its
    cluster's whole rows either way."""
    rng = np.random.default_rng(4)
    signal = rng.normal(size=(300, 3)) @ rng.normal(size=(3, 100)) * 5
    wide = signal + 0.01 * rng.normal(size=(300, 100))
    z = principal_coordinates(wide, directions=3)
    assert z.shape == (300, 3)
    centred = wide - wide.mean(axis=0)
    np.testing.assert_allclose(np.linalg.norm(z, axis=1), np.linalg.norm(centred, axis=1),
                               rtol=1e-3)  # the three directions hold the rows' spread
    narrow = rng.normal(size=(50, 4))
    assert principal_coordinates(narrow, directions=4) is narrow
    y = np.zeros(300, dtype=int)
    centres, sizes = class_centres(wide.astype(np.float32), y, 0.05, seed=0)
    assert centres.shape[1] == 100 and sizes.sum() == 300


@pytest.mark.parametrize("how, reason", [
    ("nan", "NaN"), ("shape", "shape"), ("small", "at least"), ("many", "at most")])
def test_a_malformed_landmark_reply_is_refused_naming_why(how, reason):
    centres, sizes = np.zeros((3, 4), np.float32), np.full(3, 10)
    if how == "nan":
        centres[0, 0] = np.nan
    elif how == "shape":
        centres = np.zeros((3, 5), np.float32)
    elif how == "small":
        sizes[1] = 2
    with pytest.raises(ReplyError, match=reason):
        map_round.decode_summaries(map_round.encode_summaries({"centres": centres, "sizes": sizes}),
                                   LandmarkRound(), 4, most=2 if how == "many" else 10)


def test_the_kernel_model_runs_end_to_end_and_the_saved_model_predicts_raw_rows(tmp_path):
    results = run_in_process(3, tmp_path, model="kernel", **{"kernel-landmarks": 150},
                             **{"label-division": "dirichlet:0.5"})
    fmap = results["dataset"]["feature_map"]
    assert 0 < fmap["landmarks"] <= 150 and fmap["dim"] == 64 + fmap["landmarks"]
    assert results["identify"]["map_round"]["landmarks"] == fmap["landmarks"]
    assert results["rows"]["GEMS"]["accuracy"] > 0.9
    model = load_model(tmp_path / "run-1")
    assert isinstance(model.features, KernelFeatures) and model.features.dim == fmap["dim"]
    from sklearn.datasets import load_digits
    x, y = load_digits(return_X_y=True)
    assert (model.predict(x / 16.0).astype(int) == y).mean() > 0.9
    again = load_model(model.save(tmp_path / "saved"))
    np.testing.assert_allclose(again.logits(x[:20] / 16.0), model.logits(x[:20] / 16.0))


def test_nodes_that_keep_their_arrays_in_files_give_the_same_model_and_leave_no_file(
        tmp_path, monkeypatch):
    """A node keeps its landmarks and Gram factor beside Flower's state (which a simulation
    holds for every node in one process): every array in a file, the same model bit for
    bit, and no file left once the nodes answered their last round."""
    from sklearn.datasets import load_digits

    from client_app import app as client_app
    from gems_fl.protocol import node_store

    store = tmp_path / "store"
    monkeypatch.setenv(node_store.ENV_VAR, str(store))
    settings = {"model": "kernel", "kernel-landmarks": 150, "label-division": "dirichlet:0.5"}
    in_state = run_in_process(3, tmp_path / "state", **settings)
    assert not list(store.rglob("*.npz"))
    monkeypatch.setattr(node_store, "SPILL_BYTES", 0)
    seen = []

    def app(msg: Message, context):
        reply = client_app(msg, context)
        seen.append(len(list(store.rglob("*.npz"))) if store.exists() else 0)
        return reply

    in_files = run_in_process(3, tmp_path / "files", client=app, **settings)
    assert max(seen) >= 3 and seen[-1] == 0 and not list(store.rglob("*"))
    x = load_digits(return_X_y=True)[0] / 16.0
    np.testing.assert_array_equal(load_model(tmp_path / "files" / "run-1").logits(x),
                                  load_model(tmp_path / "state" / "run-1").logits(x))
    assert in_files["rows"]["GEMS"] == in_state["rows"]["GEMS"]


def test_a_node_that_sends_bad_landmarks_is_left_out_and_the_run_goes_on(tmp_path):
    from client_app import app as client_app

    def app(msg: Message, context):
        reply = client_app(msg, context)
        config = msg.content.config_records.get(wire.CONFIG_KEY, {})
        if config.get(ROUND_NAME_KEY) == Round.MAP and context.node_id == 1001:
            return Message(content=map_round.encode_summaries(
                {"centres": np.full((2, 64), np.nan, np.float32), "sizes": np.full(2, 10)}),
                reply_to=msg)
        return reply

    results = run_in_process(3, tmp_path, client=app, model="kernel", **{"kernel-landmarks": 100},
                             **{"required-nodes": 2})
    rejected = [r for r in results["rejected"] if "NaN" in r["reason"]]
    assert [r["node_id"] for r in rejected] == [1001]
    assert len(results["participants"]) == 2 and results["verification"]["good_enough"] == 2


def test_a_node_takes_a_factor_rank_above_the_rows_own_width():
    """The plan's rank follows the mapped width (D = inputs + landmarks); a node's settings
    do not carry the landmark count, so its check must not compare the rank with the raw
    784 inputs (every node of a run at rank >= 785 was refused before)."""
    config = {**Settings(model="kernel", dataset="fashion-mnist").for_nodes(), "gram-rank": 850}
    assert Settings.from_node_config(config).gram_rank == 850
    with pytest.raises(SettingsError, match="gram-rank=4785"):
        Settings(model="kernel", dataset="fashion-mnist", gram_rank=4785)


def test_kernel_nodes_leave_the_server_only_the_sums():
    """100 nodes at D = 4,246 would hold 14 GB of (D + 1)-square matrices on the server
    (that run was killed for memory); auto keeps the sums wherever one node's matrix passes
    64 MiB, so the server's memory does not grow with the kernel model's nodes, while the
    logistic model's 5 MB matrices stay whole up to 100 nodes."""
    from gems_fl.settings.plan import build_plan

    settings = Settings(model="kernel", dataset="fashion-mnist")
    assert build_plan(settings, 100, 4246).server_holds == "sums"
    assert build_plan(settings, 5, 4246).server_holds == "sums"
    assert build_plan(settings, 5, 2000).server_holds == "every node's reply"
    assert build_plan(Settings(dataset="fashion-mnist"), 100, 784).server_holds == "every node's reply"
    assert build_plan(Settings(model="kernel", server_grams="nodes"), 5, 4246).server_holds \
        == "every node's reply"


def test_under_dp_the_kernel_model_needs_the_servers_public_rows():
    with pytest.raises(SettingsError, match="public-samples above 0"):
        Settings(model="kernel", dp_epsilon=4.0, public_samples=0, standardize="off")
    with pytest.raises(SettingsError, match="public-data"):
        Settings(model="kernel", dp_epsilon=4.0, dataset="node-files", standardize="off")
    Settings(model="kernel", dp_epsilon=4.0, public_samples=100, standardize="off")


def test_under_dp_the_landmarks_are_the_servers_public_rows_and_no_node_sends_any(tmp_path):
    """dp-epsilon: no landmark round; the map's landmarks are the server's public sample
    (rows no node holds), its width and scale from them; nodes send only noised sums."""
    from gems_fl.data.agreement import DataAgreement
    from gems_fl.evaluation.server_data import public_map_rows
    from gems_fl.settings.options import server_data_options

    asked = []

    def app(msg: Message, context):
        asked.append(dict(wire.decode_config(msg.content)))
        from client_app import app as real
        return real(msg, context)

    overrides = {"kernel-landmarks": 500, "public-samples": 120, "dp-epsilon": 8.0,
                 "dp-seeded-noise": True, "label-division": "dirichlet:0.5", "seed": 3}
    results = run_in_process(3, tmp_path, client=app, model="kernel", **overrides)
    assert not any(map_round.SHARE_KEY in c for c in asked)
    assert results["identify"].get("map_round") is None
    fmap = results["dataset"]["feature_map"]
    assert fmap["landmarks-from"] == "the server's public rows" and fmap["landmarks"] == 120
    assert results["privacy"]["dp"]["epsilon"] == 8.0
    public, _ = public_map_rows(
        server_data_options(Settings(dataset="digits", public_samples=120, seed=3,
                                     standardize="off")),
        DataAgreement(64, [str(i) for i in range(10)], None, None, None, None))
    marks = load_model(tmp_path / "run-1").features.landmarks
    np.testing.assert_array_equal(np.sort(marks, axis=0), np.sort(public, axis=0))
    assert results["rows"]["GEMS"]["accuracy"] > 0.5
    # more rows than landmarks asked: class centres of the public rows, each class's
    # count rounded (so within half a landmark per class of those asked)
    again = run_in_process(3, tmp_path / "fewer", model="kernel",
                           **{**overrides, "kernel-landmarks": 40})
    assert abs(again["dataset"]["feature_map"]["landmarks"] - 40) <= 10 / 2


def test_the_estimator_fits_a_kernel_model():
    from sklearn.datasets import load_digits

    from gems_fl.estimator import GEMSClassifier
    x, y = load_digits(return_X_y=True)
    clf = GEMSClassifier(model="kernel").fit(x[:1200] / 16.0, y[:1200],
                                             sites=np.arange(1200) % 3)
    assert isinstance(clf.model_, GEMSModel) and isinstance(clf.model_.features, KernelFeatures)
    assert clf.score(x[1200:] / 16.0, y[1200:]) > 0.85


@pytest.mark.parametrize("division", ["iid", "dirichlet:0.5"])
def test_the_selection_round_may_keep_the_linear_model_so_the_kernel_model_is_no_worse(
        tmp_path, division):
    """On the nodes' validation rows h_G of the kernel model scores at least what the
    logistic model's pooled and LDA points score there: those points, on the rows alone,
    are among its candidates."""
    kernel = run_in_process(3, tmp_path / "k", model="kernel", **{"label-division": division})
    table = kernel["intersection"]["selection"]["candidates"]
    linear = [c for c in table if c.get("columns") == 64]
    assert linear and len(linear) < len(table)
    kept = max(c["val_accuracy"] for c in table)
    assert kept >= max(c["val_accuracy"] for c in linear)
    logistic = run_in_process(3, tmp_path / "l", model="logistic", **{"label-division": division})
    same = [c for c in logistic["intersection"]["selection"]["candidates"]
            if c["point"] in ("pooled", "lda")]
    assert kept >= max(c["val_accuracy"] for c in same) - 1e-9


def test_secure_aggregation_runs_the_kernel_model(tmp_path):
    results = run_in_process(3, tmp_path, model="kernel", **{"kernel-landmarks": 60},
                             **{"label-division": "iid", "baselines": "none",
                                "secure-aggregation": True})
    assert results["privacy"]["secure_aggregation"]
    assert results["rows"]["GEMS"]["accuracy"] > 0.85
    assert results["dataset"]["feature_map"]["landmarks"] <= 60


def test_the_classifier_fits_the_kernel_model_on_unscaled_sites_and_saves_the_map(tmp_path):
    """Wine's features lie on very different scales: the federated scaling comes first;
    the landmarks are centres of the scaled rows, the rows beside scaled to unit RMS norm."""
    from gems_fl.estimator import GEMSClassifier
    from tests.test_api import _wine_sites

    sites, x_test, y_test = _wine_sites()
    clf = GEMSClassifier(eps=0.5, model="kernel", settings={"kernel-landmarks": 20}).fit(sites)
    features = clf.model_.features
    assert isinstance(features, KernelFeatures) and features.num_inputs == 13
    assert 0 < features.num_landmarks <= 20 and features.dim == 13 + features.num_landmarks
    # 13 standardised features: E|x|^2 = 13, so each already has mean square 1
    assert features.raw_scale == pytest.approx(1.0, rel=1e-6)
    assert np.abs(features.landmarks).max() < 10  # centres in the scaled units
    assert clf.score(x_test, y_test) > 0.85
    loaded = load_model(clf.save(tmp_path / "model"))
    np.testing.assert_array_equal(loaded.features.landmarks, features.landmarks)
    np.testing.assert_array_equal(loaded.logits(x_test), clf.decision_function(x_test))


def test_fedavg_trains_on_the_kernel_models_features():
    from gems_lab.fedavg import feature_map, run_federated
    from tests.helpers import FAST, app_defaults

    cfg = {**app_defaults(), **FAST, "model": "kernel", "kernel-landmarks": 40}
    fmap = feature_map(Settings.from_run_config(cfg), 3, _digits_splits(cfg))
    assert isinstance(fmap, KernelFeatures) and fmap.dim == 64 + fmap.num_landmarks
    curve = run_federated(cfg, 3, "fedavg", num_rounds=3, local_epochs=5)
    per_round = np.diff([0, *curve.bytes_up])
    assert per_round[0] > 3 * (fmap.dim + 1) * 10 * 4  # three models of the mapped width
    assert curve.accuracy[-1] > 0.3


def _digits_splits(cfg):
    from gems_fl.data import load_dataset
    return load_dataset("digits", seed=int(cfg["seed"]))


def test_the_landmarks_travel_once_and_a_node_that_lost_them_is_left_out_naming_why(tmp_path):
    """Round 1 carries the landmarks; later messages name them by their hash, and each node
    maps its rows with those it kept. A node whose state was lost answers an error."""
    from client_app import app as client_app
    from gems_fl.data.kernel_features import DIGEST_KEY, LANDMARKS_KEY
    from gems_fl.protocol.map_round import KEPT_KEY
    from gems_fl.protocol.node_store import NodeStore

    seen = []

    def app(msg: Message, context):
        config = dict(msg.content.config_records.get(wire.CONFIG_KEY, {}))
        if config.get("feature-map") == "kernel":
            seen.append((msg.metadata.message_type, LANDMARKS_KEY in config, DIGEST_KEY in config))
            if wire.CANDIDATES_KEY in msg.content.array_records and context.node_id == 1002:
                NodeStore(context).drop(KEPT_KEY)  # e.g. a restarted node
        return client_app(msg, context)

    results = run_in_process(3, tmp_path, client=app, model="kernel", **{"kernel-landmarks": 80},
                             **{"required-nodes": 2})
    assert seen[:3] == [("train", True, False)] * 3  # round 1: the landmarks themselves
    assert seen[3:] and all(not whole and digest for _, whole, digest in seen[3:])
    lost = [x for r in results["rounds"] for x in r.get("rejected", [])
            if x["node_id"] == 1002]
    assert lost and "keeps no map part of hash" in lost[0]["reason"]
    assert results["verification"]["good_enough"] == 2


def _label_skewed_sites(y: np.ndarray, num_sites: int, seed: int) -> np.ndarray:
    """Each class's rows over ``num_sites`` sites by a Dirichlet(0.5) draw (seeded)."""
    rng = np.random.default_rng(seed)
    site = np.empty(len(y), dtype=object)
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet([0.5] * num_sites))[:-1] * len(rows)).astype(int)
        for k, part in enumerate(np.split(rows, cuts)):
            site[part] = f"site-{k}"
    return site


@pytest.mark.parametrize("table", ["iris", "wine", "breast_cancer", "digits"])
def test_on_every_bundled_table_the_kernel_models_h_g_scores_at_least_the_logistic_models(table):
    """The kernel model contains the logistic model: its selection round scores the
    logistic family's points on the rows' own columns, the gaussian point among them (with
    those columns' class Gram matrices), so on the sites' validation rows its h_G is never
    poorer than the logistic run's (DESIGN.md 3e)."""
    import sklearn.datasets

    from gems_fl.estimator import GEMSClassifier

    x, y = getattr(sklearn.datasets, f"load_{table}")(return_X_y=True)
    sites = _label_skewed_sites(y, 3, seed=0)
    runs = {model: GEMSClassifier(model=model, seed=0, verbose=False).fit(x, y, sites=sites)
            for model in ("logistic", "kernel")}
    score = {m: clf.results_["verification"]["pooled_val"]["gems"] for m, clf in runs.items()}
    assert score["kernel"] >= score["logistic"], score
    selection = runs["kernel"].results_["intersection"]["selection"]
    linear = {c["point"] for c in selection["candidates"] if c.get("columns") == x.shape[1]}
    assert {"pooled", "lda", "gaussian"} <= linear
    assert selection["family"] in ("the whole layer", "linear, on the rows' columns")
    assert runs["kernel"].results_["plan"]["column_points"] == ["pooled", "lda", "gaussian"]
