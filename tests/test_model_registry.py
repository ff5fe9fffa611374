"""A new convex model is one object registered where models are: this file brings one (the
logistic model on the rows beside their squares, a map of its own) without editing a
package file, and runs it through the real apps, save and load included."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from sklearn.datasets import load_digits

from gems_fl.api import load_model
from gems_fl.data.feature_map import MapEvidence
from gems_fl.learning.model_kinds import (
    LOGISTIC_KIND,
    ModelKind,
    model_kind,
    register_model,
    unregister_model,
)
from gems_fl.settings import Settings
from tests.helpers import run_in_process


@dataclass(frozen=True)
class SquaresMap:
    """``z(x) = [x, x * x]``: the rows beside their squares."""

    num_inputs: int

    JSON_KEY = "squares_map"

    @property
    def dim(self) -> int:
        return 2 * self.num_inputs

    @property
    def raw_columns(self) -> int:
        return self.num_inputs

    def transform(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.num_inputs:
            raise ValueError(f"the squares map takes {self.num_inputs} features, got {x.shape}")
        return np.hstack([x, x * x])

    def to_config(self, whole: bool = True) -> dict:
        return {"squares-inputs": int(self.num_inputs)}

    def to_json(self) -> dict:
        return self.to_config()

    def arrays(self) -> dict:
        return {}

    def describe(self) -> str:
        return f"the rows beside their squares, D={self.dim}"

    @classmethod
    def from_config(cls, config):
        return cls(int(config["squares-inputs"])) if "squares-inputs" in config else None

    @classmethod
    def from_saved(cls, meta, arrays):
        return cls.from_config(meta)


class SquaresRule:
    """Nothing to agree on but the width: no round of its own."""

    round_asks = 0
    seen: list[MapEvidence] = []

    def agree(self, evidence: MapEvidence):
        SquaresRule.seen.append(evidence)
        return SquaresMap(evidence.num_features), "the rows beside their squares"


SQUARES = ModelKind("squares", convex=True, feature_map=SquaresMap, rows_beside=True,
                    width=lambda settings, inputs: 2 * inputs,
                    map_rule=lambda settings, bandwidth: SquaresRule())


@pytest.fixture
def squares():
    register_model(SQUARES)
    SquaresRule.seen.clear()
    yield SQUARES
    unregister_model(SQUARES.name)


def test_a_model_registered_from_a_test_file_runs_end_to_end_and_its_saved_model_loads(
        tmp_path, squares):
    results = run_in_process(3, tmp_path, model="squares")
    assert results["dataset"]["squares_map"] == {"squares-inputs": 64}
    evidence = SquaresRule.seen[-1]  # the server asked the model's rule, with every node
    assert evidence.num_features == 64 and len(evidence.nodes) == 3
    assert all(n.stats is None or n.stats[1].shape == (64,) for n in evidence.nodes)
    assert results["verification"]["good_enough"] == 3
    assert results["rows"]["GEMS"]["accuracy"] > 0.9
    # the rows beside (rows_beside): the logistic family's candidates on them are scored too
    candidates = results["intersection"]["selection"]["candidates"]
    assert any(c.get("columns") == 64 for c in candidates)

    model = load_model(tmp_path / "run-1")
    assert isinstance(model.features, SquaresMap)
    assert model.layers[-1][0].shape == (10, 128)  # the layer sits on z(x), not on x
    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    weight, bias = model.layers[-1]
    np.testing.assert_allclose(model.logits(x), SquaresMap(64).transform(x) @ weight.T + bias,
                               rtol=1e-5, atol=1e-5)
    assert (model.predict(x).astype(int) == y).mean() > 0.9
    again = load_model(model.save(tmp_path / "saved"))
    np.testing.assert_array_equal(again.logits(x[:20]), model.logits(x[:20]))


def test_the_settings_know_a_registered_model_and_forget_it_after():
    register_model(SQUARES)
    try:
        assert Settings.from_run_config({"model": "squares"}).model_kind is SQUARES
        with pytest.raises(ValueError, match="registered already"):
            register_model(SQUARES)
    finally:
        unregister_model(SQUARES.name)
    for forgotten in (lambda: Settings.from_run_config({"model": "squares"}),
                      lambda: model_kind("squares")):
        with pytest.raises(ValueError, match="'squares'.*logistic, random-features, kernel, mlp"):
            forgotten()


def test_a_built_in_model_cannot_be_removed_nor_a_non_model_registered():
    with pytest.raises(ValueError, match="built-in"):
        unregister_model(LOGISTIC_KIND.name)
    with pytest.raises(TypeError, match="register a ModelKind"):
        register_model("squares")
    with pytest.raises(ValueError, match="feature map needs a convex model"):
        register_model(ModelKind("deep-squares", convex=False, feature_map=SquaresMap))


def test_the_classifier_fits_a_registered_model(squares):
    from gems_fl.estimator import GEMSClassifier

    x, y = load_digits(return_X_y=True)
    clf = GEMSClassifier(model="squares").fit(x[:1200] / 16.0, y[:1200],
                                              sites=np.arange(1200) % 3)
    assert isinstance(clf.model_.features, SquaresMap)
    assert clf.score(x[1200:] / 16.0, y[1200:]) > 0.85
