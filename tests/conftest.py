"""Shared fixtures: small real data (scikit-learn digits) and a trained local model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.learning.models import build_model, model_to_vector
from gems_fl.learning.train import train_until_converged

# The slow tier's longest test (about 20 min of one worker, all the others 1-5 min) goes
# first: xdist hands each worker a contiguous share of the collected order and balances the
# rest by stealing, so the long one started last would leave the other worker idle at the end.
LONGEST_FIRST = ("test_reproduce_quick_writes_every_table_and_plot_with_every_row",)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.name not in LONGEST_FIRST)  # stable: the rest keep order


@pytest.fixture(scope="session", autouse=True)
def node_store_folder(tmp_path_factory):
    """The files nodes keep for a run (gems_fl/protocol/node_store.py) go to the session's
    temporary folder, for the real-process runs too (they inherit the environment)."""
    import os

    from gems_fl.protocol.node_store import ENV_VAR

    folder = tmp_path_factory.mktemp("node-store")
    before = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = str(folder)
    yield folder
    if before is None:
        os.environ.pop(ENV_VAR, None)
    else:
        os.environ[ENV_VAR] = before


@pytest.fixture(scope="session")
def digits_node():
    """Node 0 of digits under the paper's K=5 division, with its trained model."""
    splits = load_dataset("digits", seed=0)
    division = parse_division("paper", 5, splits.num_classes)
    x_tr, y_tr, x_val, y_val = node_data(splits, division, 0, seed=0)
    torch.manual_seed(0)
    model = build_model("logistic", splits.num_features, splits.num_classes)
    train_until_converged(model, x_tr, y_tr, lr=1e-3, batch_size=32, max_epochs=60,
                          patience=3, seed=0)
    center = model_to_vector(model).reshape(splits.num_classes, splits.num_features + 1)
    return {"center": center, "x_val": x_val, "y_val": y_val, "x_test": splits.test_x,
            "y_test": splits.test_y, "model": model}


@pytest.fixture(scope="session")
def random_linear_problem():
    """A noisy linear problem where the center's accuracy sits well above 0.6."""
    rng = np.random.default_rng(0)
    n, f, c = 400, 30, 5
    x = rng.random((n, f))
    w = rng.normal(size=(c, f + 1))
    y = (np.c_[x, np.ones(n)] @ w.T).argmax(1)
    flip = rng.random(n) < 0.2
    y[flip] = rng.integers(0, c, flip.sum())
    return {"center": w, "x": x, "y": y}


@pytest.fixture
def sites(tmp_path):
    """Node configs of three CSV sites (13 features, text labels) under tmp_path/sites."""
    from tests.sitegen import site_config

    return [site_config(tmp_path / "sites", f"site-{k}", seed=k) for k in range(3)]


@pytest.fixture
def strategies(monkeypatch):
    """Every convex GEMS strategy a run builds (to inspect what the server held), with
    the train replies each was given (``seen``)."""
    import gems_fl.serverapp.protocols as run_module

    built = []

    class Recording(run_module.GEMS):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.seen = []
            built.append(self)

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            self.seen.extend(replies)
            return super().aggregate_train(server_round, replies)

    monkeypatch.setattr(run_module, "GEMS", Recording)
    return built
