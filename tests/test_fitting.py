"""The one core fit (gems_fl.fitting.fit): sites as arrays or files, the model of a run on
the same files bit for bit, nothing written, and the verdicts and stops a run has."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gems_fl.api import load_model
from gems_fl.estimator import GEMSClassifier
from gems_fl.fitting import fit
from gems_fl.protocol import node_store
from gems_fl.protocol.attendance import RequiredNodesMissing
from tests.helpers import FAST, app_defaults, run_in_process
from tests.sitegen import blobs

#: quick settings for three small sites
QUICK = {"eps": 0.5, "seed": 3, "evaluate-on-server": False, "min-rows": 2}


def _config(**extra) -> dict:
    """The app's settings as the tests' runs take them, without what fit sets itself."""
    config = {**app_defaults(), **FAST, **QUICK, **extra}
    return {k: v for k, v in config.items() if k not in ("dataset", "site-files", "output-dir")}


def _sites(num_features: int = 5, n: int = 150) -> dict[str, dict[str, np.ndarray]]:
    sites = {}
    for k in range(3):
        x, y = blobs(n, num_features, seed=k, shift=0.3 * k)
        cut = int(0.75 * n)
        sites[f"site-{k}"] = {"x_train": x[:cut], "y_train": y[:cut],
                              "x_val": x[cut:], "y_val": y[cut:]}
    return sites


def _saved(sites, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, arrays in sites.items():
        paths.append(folder / f"{name}.npz")
        np.savez(paths[-1], **arrays)
    return paths


def _same_model(a, b) -> None:
    assert len(a.layers) == len(b.layers)
    for (w1, b1), (w2, b2) in zip(a.layers, b.layers, strict=True):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)
    assert a.classes == b.classes
    for x, y in ((a.mean, b.mean), (a.std, b.std)):
        np.testing.assert_array_equal(x, y)
    assert (a.features is None) == (b.features is None)
    if a.features is not None:
        for key, value in a.features.arrays().items():
            np.testing.assert_array_equal(value, b.features.arrays()[key])


@pytest.mark.parametrize("model", ["logistic", "kernel"])
def test_sites_as_arrays_give_the_model_a_run_on_their_files_writes(tmp_path, model):
    """fit on arrays, fit on the same arrays' files and the ServerApp's run over the
    in-process grid on those files (which writes results.json and the model): one model,
    bit for bit."""
    sites = _sites()
    paths = _saved(sites, tmp_path / "sites")
    config = _config(model=model)
    from_arrays = fit(sites, config)
    from_files = fit(paths, config)
    results = run_in_process(3, tmp_path / "out", **config, dataset="node-files",
                             **{"site-files": ",".join(map(str, paths))})
    written = load_model(Path(results["output"]["results"]))
    _same_model(from_arrays.model, from_files.model)
    _same_model(from_arrays.model, written)
    assert from_arrays.good_enough and from_arrays.results["status"] == "completed"
    assert [n["name"] for n in from_arrays.results["nodes"]] == sorted(sites)
    assert "output" not in from_arrays.results  # nothing written, so no paths


class _Writes:
    """Every file a fit would write: np.savez, Path.write_text and tempfile's files."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[str] = []
        import tempfile

        for owner, name in ((np, "savez"), (Path, "write_text"), (tempfile, "mkstemp")):
            real = getattr(owner, name)
            monkeypatch.setattr(owner, name, self._spy(name, real))

    def _spy(self, name, real):
        def spy(*args, **kwargs):
            self.calls.append(name)
            return real(*args, **kwargs)
        return spy


def test_a_fit_writes_no_file_where_a_run_writes_several(tmp_path, monkeypatch):
    """Every array a node keeps goes to a file past SPILL_BYTES (0 here), and a run writes
    its results and model: the spy sees those writes in a run, and none in a fit."""
    sites = _sites()
    paths = _saved(sites, tmp_path / "sites")
    monkeypatch.setattr(node_store, "SPILL_BYTES", 0)
    monkeypatch.setenv(node_store.ENV_VAR, str(tmp_path / "store"))
    config = _config(model="kernel")
    writes = _Writes(monkeypatch)
    run_in_process(3, tmp_path / "out", **config, dataset="node-files",
                   **{"site-files": ",".join(map(str, paths))})
    assert writes.calls.count("savez") > 3 and "write_text" in writes.calls
    writes.calls.clear()
    fitted = fit(sites, config)
    assert writes.calls == [] and fitted.good_enough
    clf = GEMSClassifier(eps=0.5, model="kernel", seed=3).fit(sites)
    assert writes.calls == [] and clf.results_["status"] == "completed"


def test_a_model_not_good_enough_comes_back_with_its_verdict():
    """Where a run exits 4 (too few sites find h_G good enough), fit returns the model
    with the results that say so."""
    fitted = fit(_sites(), _config(eps=1.0, **{"min-good-enough": "3"}))
    assert not fitted.good_enough and fitted.results["status"] == "not-good-enough"
    assert fitted.model.layers[-1][0].shape == (3, 5)


def test_a_site_that_does_not_fit_stops_the_fit_with_the_results():
    sites = _sites()
    sites["site-2"] = {**sites["site-2"], "x_train": sites["site-2"]["x_train"][:, :4],
                       "x_val": sites["site-2"]["x_val"][:, :4]}
    with pytest.raises(RequiredNodesMissing, match="site-2") as stop:
        fit(sites, _config())
    assert stop.value.results["status"] == "incomplete"
    assert stop.value.results["attendance"]["missing_required"] == ["site-2"]


@pytest.mark.parametrize(("sites", "config", "error", "message"), [
    ({}, {}, ValueError, "at least one site"),
    ({"a,b": {}}, {}, ValueError, "no ',' or '/'"),
    ("site.npz", {}, ValueError, "mapping of site name"),
    ({"a": {}}, {"site-files": "x.npz"}, ValueError, "site-files itself"),
    ({"a": {}}, {"gram-rnak": 3}, ValueError, "did you mean 'gram-rank'"),
    (["/nowhere/site-a.npz"], {}, FileNotFoundError, "not found: /nowhere/site-a.npz"),
])
def test_fit_refuses_what_it_cannot_take(sites, config, error, message):
    with pytest.raises(error, match=message):
        fit(sites, config)
