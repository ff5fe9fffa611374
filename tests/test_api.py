"""The Flower-free Python API (gems_fl.api) and the README's example of it."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_limits

from gems_fl.api import aggregate, check, load_model, node_space
from gems_fl.geometry.virtual import forget_draw
from gems_fl.learning.models import build_model
from tests.helpers import ROOT, run_in_process


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _nodes(seed: int = 0, count: int = 3):
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    order = np.random.default_rng(seed).permutation(len(y))
    out = []
    for rows in np.array_split(order[300:], count):
        train, val = rows[: len(rows) * 4 // 5], rows[len(rows) * 4 // 5:]
        clf = LogisticRegression(max_iter=2000).fit(x[train], y[train])
        weights = np.hstack([clf.coef_, clf.intercept_[:, None]])
        out.append((weights, x[train], y[train], x[val], y[val]))
    return out, x[order[:300]], y[order[:300]]


def test_readme_example_runs_without_flower_from_an_empty_folder(tmp_path):
    code = _readme_example() + "\nimport sys\nassert 'flwr' not in sys.modules, 'imported flwr'\n"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "h_G test accuracy:" in done.stdout


def test_readme_classifier_example_runs_from_an_empty_folder(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Python API"):text.index("## Results")]
    code = re.findall(r"```python\n(.*?)```", section, re.S)[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.search(r"h_G test accuracy: ([\d.]+)", done.stdout).group(1))
    assert accuracy > 0.85 and (tmp_path / "wine-model" / "gems_model.npz").is_file()


@pytest.mark.parametrize("kind", ["gram", "ball", "ellipsoid"])
def test_spaces_aggregate_and_check_agree(kind):
    nodes, x_test, y_test = _nodes()
    spaces = [node_space(*node, kind=kind, eps=0.8, num_directions=50) for node in nodes]
    for (weights, *_), space in zip(nodes, spaces):
        assert space.kind == kind and space.weights.shape == weights.shape
        assert np.array_equal(space.weights, weights)
        assert space.center_accuracy >= 0.8 and space.space.radius > 0
        own = check(weights, space)
        assert own.inside and own.distance == 0.0
    merged = aggregate(spaces)
    assert merged.weights.shape == nodes[0][0].shape
    assert merged.inside == [check(merged.weights, s).inside for s in spaces]
    assert merged.found == all(merged.inside)
    accuracy = ((np.hstack([x_test, np.ones((len(x_test), 1))]) @ merged.weights.T).argmax(1)
                == y_test).mean()
    assert accuracy > 0.8


def test_a_model_far_away_is_outside():
    nodes, *_ = _nodes()
    space = node_space(*nodes[0], eps=0.8)
    far = nodes[0][0] + 100.0 * np.sign(nodes[0][0] + 1e-9)
    result = check(far, space)
    assert not result.inside and result.distance > result.radius


def test_bad_input_says_what_is_wrong():
    (weights, xt, yt, xv, yv), *_ = _nodes()[0]
    with pytest.raises(ValueError, match=r"weights must be \(C, d \+ 1\)"):
        node_space(weights[:, :-1], xt, yt, xv, yv)
    with pytest.raises(ValueError, match="one label per row"):
        node_space(weights, xt, yt[:-1], xv, yv)
    with pytest.raises(ValueError, match="kind must be one of .*got .cube."):
        node_space(weights, xt, yt, xv, yv, kind="cube")
    with pytest.raises(ValueError, match="at least one"):
        aggregate([])
    with pytest.raises(FileNotFoundError, match="pass the folder of a finished run"):
        load_model(ROOT / "tests")


@pytest.mark.parametrize("model", ["logistic", "mlp"])
def test_load_model_predicts_like_the_run_s_model(tmp_path, model):
    overrides = {"model": model, "label_division": "iid"}
    if model == "mlp":
        overrides.update({"hidden": "8", "clusters": 10})
    results = run_in_process(3, tmp_path, **{k.replace("_", "-"): v for k, v in overrides.items()})
    loaded = load_model(tmp_path / "run-1")
    state = dict(np.load(tmp_path / "run-1" / "gems_model.npz"))
    widths = [w.shape[0] for w, _ in loaded.layers[:-1]]
    net = build_model(model, 64, 10, widths, 0.5).double().eval()
    net.load_state_dict({k: torch.as_tensor(v, dtype=torch.float64) for k, v in state.items()})
    x = np.random.default_rng(1).random((20, 64))
    with torch.no_grad():
        expected = net(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(loaded.logits(x), expected, rtol=1e-10, atol=1e-10)
    assert loaded.classes == results["dataset"]["classes"]
    assert list(loaded.predict(x)) == [loaded.classes[i] for i in expected.argmax(1)]


def test_load_model_applies_the_run_s_federated_scaling(tmp_path):
    run_in_process(3, tmp_path, **{"label-division": "iid", "standardize": "federated"})
    loaded = load_model(tmp_path / "run-1")
    assert loaded.mean is not None and loaded.std is not None
    x = np.random.default_rng(2).random((5, 64))
    w, b = loaded.layers[-1]
    np.testing.assert_allclose(loaded.logits(x), ((x - loaded.mean) / loaded.std) @ w.T + b)


def test_the_api_module_imports_no_flower():
    code = "import sys, gems_fl.api; assert 'flwr' not in sys.modules, sorted(m for m in sys.modules if 'flwr' in m)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _wine_sites():
    """Three sites of scikit-learn's wine data (features on very different scales) with
    text labels; sites 0 and 1 each lack one class."""
    from sklearn.datasets import load_wine

    x, y = load_wine(return_X_y=True)
    names = np.array(["barolo", "grignolino", "barbera"])[y]
    order = np.random.default_rng(0).permutation(len(y))
    sites = {}
    for k, rows in enumerate(np.array_split(order[40:], 3)):
        if k < 2:
            rows = rows[names[rows] != ["barolo", "grignolino"][k]]
        cut = int(0.75 * len(rows))
        sites[f"site-{'abc'[k]}"] = {"x_train": x[rows[:cut]], "y_train": names[rows[:cut]],
                                     "x_val": x[rows[cut:]], "y_val": names[rows[cut:]]}
    return sites, x[order[:40]], names[order[:40]]


def test_the_classifier_fits_text_labels_and_class_subsets_and_saves(tmp_path):
    """GEMSClassifier: fit on sites holding text labels and different class subsets,
    scaled as a run scales them; predict names, score, probabilities; save/load_model
    give the same predictions."""
    from gems_fl.estimator import GEMSClassifier

    sites, x_test, y_test = _wine_sites()
    clf = GEMSClassifier(eps=0.5)
    assert clf.fit(sites) is clf
    assert list(clf.classes_) == ["barbera", "barolo", "grignolino"]
    assert clf.results_["settings"]["standardize"] == "federated"
    assert clf.results_["attendance"]["line"] == "completed with 3 of 3 sites"
    assert clf.model_.mean is not None  # the sites' features arrive unscaled
    assert set(clf.predict(x_test)) <= set(clf.classes_)
    assert clf.score(x_test, y_test) > 0.85
    proba = clf.predict_proba(x_test)
    assert proba.shape == (len(x_test), 3) and np.allclose(proba.sum(axis=1), 1)
    assert list(clf.classes_[proba.argmax(axis=1)]) == list(clf.predict(x_test))
    loaded = load_model(clf.save(tmp_path / "model"))
    assert list(loaded.predict(x_test)) == list(clf.predict(x_test))
    again = GEMSClassifier(eps=0.5).fit(sites)  # the same seed and data: the same model
    np.testing.assert_array_equal(again.decision_function(x_test), clf.decision_function(x_test))


def test_the_classifier_says_what_is_wrong_before_it_runs():
    from gems_fl.estimator import GEMSClassifier

    sites, x_test, _ = _wine_sites()
    with pytest.raises(ValueError, match="not fitted yet"):
        GEMSClassifier().predict(x_test)
    with pytest.raises(ValueError, match=r"did you mean 'gram-point'"):
        GEMSClassifier(settings={"gram-pont": "lda"}).fit(sites)
    with pytest.raises(ValueError, match="lacks y_val"):
        GEMSClassifier().fit([{k: v for k, v in sites["site-a"].items() if k != "y_val"}])
    with pytest.raises(ValueError, match="pass eps, model and seed as parameters"):
        GEMSClassifier(settings={"eps": 0.3}).fit(sites)
    with pytest.raises(ValueError, match="eps"):
        GEMSClassifier(eps=1.5).fit(sites)
    with pytest.raises(ValueError, match="Invalid parameter 'epsilon'"):
        GEMSClassifier().set_params(epsilon=0.3)


def test_the_gaussian_point_is_the_same_bits_whatever_threads_the_caller_runs():
    """The point is solved on the run's thread policy, not the caller's count: a run that
    names the point and the selection round that scores it give the same layer (the
    virtual rows' products round differently on two threads than on one)."""
    nodes, _, _ = _nodes()
    spaces = [node_space(*n, kind="gram", class_grams=True, num_directions=20) for n in nodes]
    previous = torch.get_num_threads()
    layers = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            forget_draw()  # the draw of virtual rows is made anew at each count
            with threadpool_limits(limits=threads):
                layers.append(aggregate(spaces, gram_point="gaussian", pooled_ridge=1e-4).weights)
    finally:
        torch.set_num_threads(previous)
    np.testing.assert_array_equal(layers[0], layers[1])
