"""GEMSClassifier as a scikit-learn estimator, and the model a user takes home matching
columns by name (a DataFrame in any order) or by position (an array)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from gems_fl.api import load_model
from gems_fl.estimator import GEMSClassifier, GoodEnoughWarning
from tests.helpers import run_in_process
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


def test_a_model_few_sites_find_good_enough_warns_unless_asked_to_raise(monkeypatch):
    import io

    from flwr.common.logger import console_handler

    from gems_fl.protocol.attendance import ModelNotGoodEnough

    piped = io.StringIO()  # Flower's log stream is a pipe here, not a terminal
    monkeypatch.setattr(console_handler, "stream", piped)
    x, y = blobs(120, 4, seed=0)
    y = np.random.default_rng(0).permutation(y)  # labels unrelated to the rows
    with pytest.warns(GoodEnoughWarning, match="good enough"):
        clf = GEMSClassifier(eps=0.9).fit(x, y, sites=np.arange(120) % 2)
    assert clf.results_["status"] == "not-good-enough"  # the run's own record, unchanged
    assert "Not good enough" in piped.getvalue() and "\x1b" not in piped.getvalue()
    with pytest.raises(ModelNotGoodEnough):
        GEMSClassifier(eps=0.9, settings={"min-good-enough": "majority"}).fit(
            x, y, sites=np.arange(120) % 2)
