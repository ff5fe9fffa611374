"""GEMSClassifier as a scikit-learn estimator, and the model a user takes home matching
columns by name (a DataFrame in any order) or by position (an array)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from gems_fl.api import load_model
from gems_fl.estimator import GEMSClassifier, GoodEnoughWarning, PooledRowsWarning
from tests.helpers import app_defaults, run_in_process
from tests.sitegen import CLASSES, blobs, write_csv_site


# Every check scikit-learn runs on a classifier applies and passes; none is skipped
# (check_array_api_input skips itself unless SCIPY_ARRAY_API is set).
@parametrize_with_checks([GEMSClassifier()])
def test_scikit_learns_own_estimator_checks(estimator, check):
    check(estimator)


NAMES = [f"f{i}" for i in range(6)]


def _frame_sites(orders):
    """Sites as DataFrames, each site's columns in its own order."""
    sites = {}
    for k, order in enumerate(orders):
        x, y = blobs(160, len(NAMES), seed=k, shift=0.2 * k)
        frame = pd.DataFrame(x, columns=NAMES)[[NAMES[i] for i in order]]
        sites[f"site-{k}"] = {"x_train": frame.iloc[:120], "y_train": y[:120],
                              "x_val": frame.iloc[120:], "y_val": y[120:]}
    return sites


def test_sites_in_different_column_orders_give_the_model_of_sites_in_one_order():
    """fit matches each site's DataFrame by name, as a run matches site files' headers:
    shuffled columns give bit for bit the model of the same columns in one order."""
    same = GEMSClassifier(eps=0.5).fit(_frame_sites([range(6)] * 3))
    mixed = GEMSClassifier(eps=0.5).fit(_frame_sites([range(6), [5, 3, 1, 0, 2, 4], [2, 0, 1, 5, 4, 3]]))
    assert list(mixed.feature_names_in_) == NAMES and mixed.n_features_in_ == 6
    for (w1, b1), (w2, b2) in zip(same.model_.layers, mixed.model_.layers, strict=True):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)


def test_a_table_in_another_order_is_matched_by_name_and_a_wrong_one_is_refused(tmp_path):
    clf = GEMSClassifier(eps=0.5).fit(_frame_sites([range(6)] * 3))
    x, y = blobs(80, len(NAMES), seed=7)
    table = pd.DataFrame(x, columns=NAMES)
    shuffled = table[NAMES[::-1]]
    expected = clf.predict(table)
    assert clf.score(table, y) > 0.9
    np.testing.assert_array_equal(clf.predict(shuffled), expected)
    np.testing.assert_array_equal(clf.predict(x), expected)  # an array: by position
    loaded = load_model(clf.save(tmp_path / "model"))
    assert loaded.feature_names == NAMES
    np.testing.assert_array_equal(loaded.predict(shuffled), expected)
    with pytest.raises(ValueError, match=r"lacks column\(s\) f2"):
        clf.predict(table.drop(columns="f2"))
    with pytest.raises(ValueError, match=r"has column\(s\) rownames that"):
        loaded.predict(table.assign(rownames=np.arange(80)))
    with pytest.raises(ValueError, match="X has 5 features, but GEMSClassifier is expecting 6"):
        clf.predict(x[:, :5])


def test_a_runs_model_carries_the_sites_column_names(tmp_path):
    """A run on CSV sites whose headers come in different orders: load_model(run folder, or
    its results.json) knows the names and matches a table in any order."""
    configs = []
    for k, order in enumerate([None, [12, *range(12)], list(range(13))[::-1]]):
        path = write_csv_site(tmp_path / "sites", f"site-{k}", seed=k, order=order)
        configs.append({"data-path": str(path), "node-name": f"site-{k}"})
    results = run_in_process(3, tmp_path / "out", node_configs=configs,
                             **{"dataset": "node-files", "eps": 0.5, "evaluate-on-server": False})
    assert results["dataset"]["columns"] == [f"f{i}" for i in range(13)]
    folder = tmp_path / "out" / "run-1"
    model = load_model(folder / "results.json")
    assert model.feature_names == [f"f{i}" for i in range(13)]
    test = pd.read_csv(tmp_path / "sites" / "site-2_test.csv")  # its own order
    x, y = test.drop(columns="species"), test["species"].to_numpy()
    assert np.mean(model.predict(x) == y) > 0.9
    np.testing.assert_array_equal(model.predict(x), model.predict(x[sorted(x.columns)]))


def test_the_classifier_works_in_cross_validation_and_a_pipeline():
    """fit(X, y, sites=...) as cross_val_score and Pipeline call it: each fold's sites
    set their own validation rows aside (val-fraction), labels keep their type."""
    x, y = blobs(300, 6, seed=0)
    sites = np.arange(300) % 3
    scores = cross_val_score(GEMSClassifier(eps=0.5), x, y, cv=3, params={"sites": sites})
    assert scores.min() > 0.9
    pipe = make_pipeline(StandardScaler(), GEMSClassifier(eps=0.5)).fit(x, y, gemsclassifier__sites=sites)
    assert set(pipe.predict(x)) <= set(CLASSES) and pipe.score(x, y) > 0.9
    clf = pipe[-1]
    assert list(clf.classes_) == list(CLASSES) and not hasattr(clf, "feature_names_in_")
    notes = [n for p in clf.results_["participants"] for n in p.get("notes", [])]
    assert len(notes) == 3 and all("(20%, val-fraction" in n for n in notes)
    ints = GEMSClassifier(eps=0.5).fit(x, np.searchsorted(CLASSES, y), sites=sites)
    assert ints.predict(x[:5]).dtype.kind == "i"


def test_the_classifier_names_the_parameter_and_raises_not_fitted():
    x, y = blobs(60, 4, seed=0)
    with pytest.raises(NotFittedError):
        GEMSClassifier().predict(x)
    with pytest.raises(ValueError, match=r"parameter eps='high' must be a number in \[0, 1\]"):
        GEMSClassifier(eps="high").fit(x, y)
    with pytest.raises(ValueError, match="parameter model='svm' must be one of logistic"):
        GEMSClassifier(model="svm").fit(x, y)
    with pytest.raises(ValueError, match="requires y to be passed"):
        GEMSClassifier().fit(x)
    with pytest.raises(ValueError, match="sites has|inconsistent numbers of samples"):
        GEMSClassifier().fit(x, y, sites=np.zeros(5))


def test_a_quiet_fit_prints_nothing_and_warns_with_each_site_s_figure(capfd, caplog):
    """verbose=False: nothing on stdout or stderr; Flower's records reach the flwr logger;
    a model the sites do not find good enough comes with a warning naming each site's
    figure (what results_ holds), with min-good-enough given or not."""
    x, y = blobs(120, 4, seed=0)
    y = np.random.default_rng(0).permutation(y)  # labels unrelated to the rows
    capfd.readouterr()
    with caplog.at_level("INFO", logger="flwr"):
        with pytest.warns(GoodEnoughWarning) as caught:
            clf = GEMSClassifier(eps=0.9).fit(x, y, sites=np.arange(120) % 2)
    out, err = capfd.readouterr()
    assert out == "" and err == "", (out, err)
    assert any("Not good enough" in r.getMessage() for r in caplog.records)
    assert clf.results_["status"] == "not-good-enough"  # the run's own record, unchanged
    (warning,) = [w for w in caught if w.category is GoodEnoughWarning]
    text = str(warning.message)
    for node in clf.results_["nodes"]:
        assert f"{node['name']} {node['h_g_verdict_accuracy']:.3f} (not good enough)" in text
    assert "results_['nodes']" in text and "table" not in text and "written" not in text
    with pytest.warns(GoodEnoughWarning):  # explicit, equal to the default: the same
        GEMSClassifier(eps=0.9, settings={"min-good-enough": "majority"}).fit(
            x, y, sites=np.arange(120) % 2)


def test_a_verbose_fit_shows_the_run_s_log(monkeypatch):
    import io

    from flwr.common.logger import console_handler

    piped = io.StringIO()  # Flower's log stream is a pipe here, not a terminal
    monkeypatch.setattr(console_handler, "stream", piped)
    x, y = blobs(60, 4, seed=0)
    GEMSClassifier(eps=0.5, verbose=True).fit(x, y, sites=np.arange(60) % 2)
    assert "Identify" in piped.getvalue() and "\x1b" not in piped.getvalue()


def test_fit_without_sites_warns_that_it_pools_the_rows():
    x, y = blobs(60, 4, seed=0)
    with pytest.warns(PooledRowsWarning, match="without sites= takes every row as one site's"):
        GEMSClassifier(eps=0.5).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PooledRowsWarning)
        GEMSClassifier(eps=0.5).fit(x, y, sites=np.arange(60) % 2)


def test_every_setting_given_as_its_default_gives_the_default_model():
    """Each run setting, given explicitly with the value fit uses when it is left out,
    gives the same model and the same warnings as leaving it out (on sites that do not
    find the model good enough, where min-good-enough once raised when given)."""
    x, y = blobs(90, 4, seed=3)
    y = np.random.default_rng(3).permutation(y)
    sites = np.arange(90) % 3

    def fitted(**params):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            clf = GEMSClassifier(**{"eps": 0.9, **params}).fit(x, y, sites=sites)
        return clf.model_.layers, sorted(w.category.__name__ for w in seen)

    reference = fitted()
    assert reference[1] == ["GoodEnoughWarning"]
    used = {**app_defaults(), **GEMSClassifier().run_config()}
    own = {"dataset", "site-files", "output-dir", "eps", "model", "seed", "lab"}
    for key in sorted(set(used) - own):
        layers, seen = fitted(settings={key: used[key]})
        assert seen == reference[1], key
        for (w1, b1), (w2, b2) in zip(layers, reference[0], strict=True):
            np.testing.assert_array_equal(w1, w2, err_msg=key)
            np.testing.assert_array_equal(b1, b2, err_msg=key)
    for name, value in GEMSClassifier(eps=0.9).get_params().items():
        layers, seen = fitted(**{name: value})
        assert seen == reference[1], name
        np.testing.assert_array_equal(layers[-1][0], reference[0][-1][0], err_msg=name)
