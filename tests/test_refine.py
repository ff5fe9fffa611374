"""Refinement rounds: the nodes' gradients, Bohning's step (never increases the pooled
loss), and refine-rounds through the real apps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.refine import bohning_step, pooled_gradient, softmax_gradient
from gems_fl.settings import Settings, SettingsError
from tests.helpers import run_in_process


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, y, w = rng.normal(size=(30, 4)), rng.integers(0, 3, 30), rng.normal(size=(3, 5))
    grad, loss = softmax_gradient(w, x, y)
    eps = 1e-6
    for i, j in [(0, 0), (1, 4), (2, 2)]:
        up, down = w.copy(), w.copy()
        up[i, j] += eps
        down[i, j] -= eps
        numeric = (softmax_gradient(up, x, y)[1] - softmax_gradient(down, x, y)[1]) / (2 * eps)
        assert grad[i, j] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
    assert loss > 0


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4), st.floats(0.0, 1e-1))
def test_bohning_steps_never_increase_the_pooled_loss(seed, nodes, ridge):
    rng = np.random.default_rng(seed)
    parts = [(rng.normal(size=(n, 3)) * rng.uniform(0.1, 5), rng.integers(0, 4, n))
             for n in rng.integers(5, 40, nodes)]
    x = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    counts = [len(p[1]) for p in parts]
    pooled_gram = np.tensordot(np.array(counts) / sum(counts),
                               np.stack([gram_matrix(p[0]) for p in parts]), 1)
    w = rng.normal(size=(4, 4)) * 3
    loss = softmax_gradient(w, x, y)[1]
    for _ in range(5):
        g = pooled_gradient([softmax_gradient(w, *p)[0] for p in parts], counts)
        np.testing.assert_allclose(g, softmax_gradient(w, x, y)[0], atol=1e-12)
        w = bohning_step(w, g, pooled_gram, ridge)
        new = softmax_gradient(w, x, y)[1]
        assert new <= loss + 1e-12
        loss = new


def test_refine_rounds_need_gram_and_the_logistic_model():
    with pytest.raises(SettingsError, match="refine-rounds=2 .* space='gram' and model='logistic'"):
        Settings(refine_rounds=2, space="ball")
    with pytest.raises(SettingsError, match="model='logistic'"):
        Settings(refine_rounds=1, model="mlp")


def test_a_run_with_refinement_rounds_reports_each_round(tmp_path):
    from gems_fl.evaluation.results import gems_note
    from gems_fl.geometry.refine import TEMPERATURES

    results, grid = run_in_process(3, tmp_path, return_grid=True,
                                   **{"refine-rounds": 3, "label-division": "paper"})
    rounds = results["refinement"]
    assert [r["kind"] for r in rounds] == ["spaces", "temperature", "step", "step", "step"]
    assert [r["step"] for r in rounds] == [None, None, 1, 2, 3]
    assert rounds[1]["temperature"] in TEMPERATURES
    assert all(r["test_accuracy"] is not None for r in rounds)
    assert rounds[1]["test_accuracy"] == rounds[0]["test_accuracy"]  # a scale keeps argmax
    losses = [r["loss_before"] for r in rounds[2:]]
    assert all(b <= a + 1e-9 for a, b in zip(losses, losses[1:]))  # monotone
    assert rounds[-1]["test_accuracy"] == results["rows"]["GEMS"]["accuracy"]
    bytes_so_far = [r["cumulative_bytes"] for r in rounds]
    assert all(b > a for a, b in zip(bytes_so_far, bytes_so_far[1:]))
    train = [e for e in grid.exchanges if e["type"] == "train"]
    assert len(train) == 5 and train[2]["up"] < train[0]["up"]  # a gradient, not a space
    assert "then refined by 3 Bohning steps" in gems_note(results)
    chosen = results["rounds"][1]
    assert min(chosen["val_losses"], key=chosen["val_losses"].get) == str(chosen["temperature"])


def test_a_bad_gradient_is_rejected_by_name_and_the_step_goes_on(tmp_path):
    from flwr.app import Array

    def hook(reply):
        if reply.metadata.src_node_id == 1001 and "gradient" in reply.content:
            weight = reply.content["gradient"]["weight"].numpy().copy()
            weight[0, 0] = np.nan
            reply.content["gradient"]["weight"] = Array(weight)
        return reply

    results = run_in_process(3, tmp_path, reply_hook=hook,
                             **{"refine-rounds": 2, "label-division": "paper"})
    steps = [r for r in results["rounds"] if r.get("refine", 0) > 0]
    assert all(1001 not in r["nodes"] and len(r["nodes"]) == 2 for r in steps)
    reasons = [x["reason"] for r in steps for x in r["rejected"]]
    assert len(reasons) == 2 and all("NaN" in reason for reason in reasons)


def test_replies_of_the_wrong_form_are_refused():
    from gems_fl.protocol import wire
    from gems_fl.protocol.replies import (
        ReplyError,
        decode_gradient_reply,
        decode_temperature_reply,
    )

    shapes = {"weight": (3, 4), "bias": (3,)}
    good = wire.encode_gradient_reply({"weight": np.zeros((3, 4)), "bias": np.zeros(3)},
                                      loss=0.5, num_train_examples=10)
    gradient, metrics = decode_gradient_reply(good, shapes)
    assert gradient.shape == (3, 5) and metrics == {"loss": 0.5, "num-train-examples": 10.0}
    with pytest.raises(ReplyError, match="shape"):
        decode_gradient_reply(good, {"weight": (3, 5), "bias": (3,)})
    bad_loss = wire.encode_gradient_reply({"weight": np.zeros((3, 4)), "bias": np.zeros(3)},
                                          loss=-1.0, num_train_examples=10)
    with pytest.raises(ReplyError, match="negative"):
        decode_gradient_reply(bad_loss, shapes)
    with pytest.raises(ReplyError, match="val-losses must be 7"):
        decode_temperature_reply(wire.encode_temperature_reply([0.1, 0.2], 5), 7)
    with pytest.raises(ReplyError, match="num-val-examples"):
        decode_temperature_reply(wire.encode_temperature_reply([0.1] * 7, 0), 7)
