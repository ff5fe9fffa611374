"""The server's run as named stages with typed handoffs: the plan stage from a roster
alone (nothing sent), and the report's publish and conclude steps on an outcome alone."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from gems_fl.api import load_model, model_from_state
from gems_fl.apps import client_app
from gems_fl.data.agreement import DataAgreement
from gems_fl.protocol.attendance import ModelNotGoodEnough, RequiredNodesMissing
from gems_fl.protocol.inprocess import InProcessGrid
from gems_fl.protocol.roster import Roster
from gems_fl.serverapp.finish import RunOutcome, conclude, publish
from gems_fl.serverapp.run import plan_stage, run_without_files
from gems_fl.settings import Settings
from tests.helpers import FAST, app_defaults


def _roster(num_nodes: int, num_features: int, num_classes: int) -> Roster:
    ids = list(range(1000, 1000 + num_nodes))
    return Roster(participants=ids, names={n: f"site-{n}" for n in ids}, connected=ids,
                  agreement=DataAgreement(num_features, [str(c) for c in range(num_classes)]))


@pytest.mark.parametrize(("model", "layerwise"), [("logistic", False), ("mlp", True)])
def test_the_plan_stage_needs_only_the_settings_and_the_roster(model, layerwise):
    settings = Settings.from_run_config({"model": model, "dataset": "digits", "seed": 4})
    planned = plan_stage(settings, _roster(4, 64, 10))
    assert planned.layerwise is layerwise and planned.plan.nodes == 4
    assert planned.plan.layer_size == (None if layerwise else 65)
    assert planned.options.seed == 4 and planned.dropout == settings.dropout
    assert planned.options.selects == (len(planned.plan.points) > 1)


@pytest.fixture(scope="module")
def outcome() -> RunOutcome:
    config = {**app_defaults(), **FAST, "eps": 0.5, "seed": 2}
    grid = InProcessGrid(client_app, 3, config, in_memory=True)
    context = Context(run_id=7, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    return run_without_files(grid, context)


def test_publish_writes_the_outcome_a_run_keeps_in_memory(outcome, tmp_path):
    """The report stage's outcome, published on its own, is the model a run writes."""
    publish(outcome, tmp_path / "run-7")
    written = load_model(tmp_path / "run-7")
    kept = model_from_state(outcome.results["dataset"], outcome.model_state)
    for (w1, b1), (w2, b2) in zip(written.layers, kept.layers, strict=True):
        np.testing.assert_array_equal(w1, w2)
        np.testing.assert_array_equal(b1, b2)
    assert written.classes == kept.classes and outcome.results["run_id"] == 7


def test_conclude_raises_with_the_outcome_where_the_results_say_so(outcome):
    conclude(outcome, written=False)  # completed, every site present: no exception
    results = outcome.results
    weak = RunOutcome({**results, "good_enough": {**results["good_enough"], "ok": False}},
                      outcome.model_state)
    with pytest.raises(ModelNotGoodEnough, match="kept on the exception") as stop:
        conclude(weak, written=False)
    assert stop.value.results is weak.results and stop.value.model_state is outcome.model_state
    missing = RunOutcome({**results, "attendance": {**results["attendance"], "ok": False,
                                                    "line": "site-2 is missing"}}, None)
    with pytest.raises(RequiredNodesMissing, match="site-2 is missing") as stop:
        conclude(missing, written=True)
    assert stop.value.results is missing.results
