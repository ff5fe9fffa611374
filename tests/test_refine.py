"""Refinement rounds: the nodes' gradients, Bohning's step (never increases the pooled
loss), and refine-rounds through the real apps."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gems_fl.geometry.gram import gram_matrix
from gems_fl.geometry.refine import (
    bohning_step,
    penalised,
    pooled_gradient,
    secant_curvature,
    softmax_gradient,
)
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


def test_refine_rounds_need_gram_spaces():
    with pytest.raises(SettingsError, match="refine-rounds=2 .* set space='gram'"):
        Settings(refine_rounds=2, space="ball")
    Settings(refine_rounds=1, model="mlp")


def test_the_mlp_output_layer_is_refined_on_the_merged_hidden_features(tmp_path):
    results, grid = run_in_process(3, tmp_path, return_grid=True, model="mlp", hidden="12",
                                   clusters=6, **{"num-directions": 20, "eps-neuron": 0.5,
                                                  "refine-rounds": 3, "label-division": "paper"})
    rounds = results["refinement"]
    assert [r["kind"] for r in rounds] == ["layer", "spaces", "selection", "step", "step", "step"]
    assert rounds[0]["test_accuracy"] is None  # no output layer yet
    assert results["settings"]["refine-method"] == "secant"
    kept = [r["objective"] for r in rounds[3:] if r["kept"]]
    assert rounds[3]["kept"] and all(b <= a + 1e-9 for a, b in zip(kept, kept[1:]))
    assert rounds[-1]["test_accuracy"] == results["rows"]["GEMS"]["accuracy"]
    steps = [e for e in grid.exchanges if e["type"] == "train"][3:]
    output = [e for e in grid.exchanges if e["type"] == "train"][1]
    assert len(steps) == 3 and all(e["up"] < output["up"] for e in steps)  # gradients only


def test_mlp_steps_name_the_kept_hidden_layers_and_a_node_that_lost_them_is_left_out(tmp_path):
    """The selection round carries the merged hidden layers; each step names them by
    digest (model-sized messages). A node whose state lost them answers an error, is
    rejected by name, and the steps go on with the others."""
    from client_app import app as client_app
    from gems_fl.protocol import wire
    from gems_fl.protocol.node import MERGED_LAYERS_KEY
    from gems_fl.protocol.node_store import NodeStore

    seen = []

    def app(msg, context):
        config = msg.content.config_records.get(wire.CONFIG_KEY, {})
        if wire.REFINE_KEY in config:
            seen.append((context.node_id, int(config[wire.REFINE_KEY]),
                         wire.LAYERS_KEY in msg.content.array_records,
                         config.get(wire.LAYERS_DIGEST_KEY)))
            if context.node_id == 1001 and int(config[wire.REFINE_KEY]) == 2:
                NodeStore(context).drop(MERGED_LAYERS_KEY)  # e.g. a restarted node
        return client_app(msg, context)

    results, grid = run_in_process(3, tmp_path, client=app, return_grid=True, model="mlp",
                                   hidden="12", clusters=6,
                                   **{"num-directions": 20, "eps-neuron": 0.5,
                                      "refine-rounds": 3, "label-division": "paper",
                                      "required-nodes": 2})
    selection = [s for s in seen if s[1] == 0]
    steps = [s for s in seen if s[1] > 0]
    assert len(selection) == 3 and all(layers and digest is None for _, _, layers, digest in selection)
    assert len(steps) == 9 and not any(layers for _, _, layers, _ in steps)
    assert len({digest for *_, digest in steps}) == 1 and steps[0][3]
    train = [e for e in grid.exchanges if e["type"] == "train"]
    assert all(e["down"] < train[2]["down"] / 2 for e in train[3:])  # no layers after selection
    rounds = [r for r in results["rounds"] if (r.get("refine") or {}).get("step")]
    assert [1001 in r["nodes"] for r in rounds] == [True, False, False]
    reasons = [x["reason"] for r in rounds for x in r["rejected"]]
    assert len(reasons) == 2 and all("keeps no merged hidden layers" in x for x in reasons)
    assert results["rows"]["GEMS"]["accuracy"] == results["refinement"][-1]["test_accuracy"]


def test_a_run_with_refinement_rounds_reports_each_round(tmp_path):
    from gems_fl.evaluation.results import gems_note
    from gems_fl.geometry.selection import TEMPERATURES

    results, grid = run_in_process(3, tmp_path, return_grid=True,
                                   **{"refine-rounds": 3, "label-division": "paper",
                                      "gram-point": "pooled", "pooled-ridge": 0.001,
                                      "refine-method": "monotone"})
    rounds = results["refinement"]
    assert [r["kind"] for r in rounds] == ["spaces", "selection", "step", "step", "step"]
    assert [r["step"] for r in rounds] == [None, None, 1, 2, 3]
    assert rounds[1]["temperature"] in TEMPERATURES
    assert all(r["test_accuracy"] is not None for r in rounds)
    assert rounds[1]["pooled_ridge"] == 0.001  # one candidate: only the scale is chosen
    assert len(results["rounds"][1]["candidates"]) == 1
    assert rounds[1]["test_accuracy"] == rounds[0]["test_accuracy"]  # a scale keeps argmax
    objectives = [r["objective"] for r in rounds[2:]]
    assert all(b <= a + 1e-9 for a, b in zip(objectives, objectives[1:]))  # monotone
    assert all(o > r["loss_before"] for o, r in zip(objectives, rounds[2:]))  # refine-l2 > 0
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
        decode_selection_reply,
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
    good = wire.encode_selection_reply(np.full((2, 7), 0.1), [3, 4], 5)
    losses, correct, rows = decode_selection_reply(good, 2, 7)
    assert losses.shape == (2, 7) and list(correct) == [3, 4] and rows == 5
    with pytest.raises(ReplyError, match="val-losses must be 2 x 7"):
        decode_selection_reply(wire.encode_selection_reply(np.full((2, 3), 0.1), [3, 4], 5), 2, 7)
    with pytest.raises(ReplyError, match="num-val-examples"):
        decode_selection_reply(wire.encode_selection_reply(np.full((2, 7), 0.1), [0, 0], 0), 2, 7)
    with pytest.raises(ReplyError, match=r"val-correct must be 2 whole counts in \[0, 5\]"):
        decode_selection_reply(wire.encode_selection_reply(np.full((2, 7), 0.1), [3, 6], 5), 2, 7)


def test_candidates_are_scored_in_one_batch_like_one_by_one():
    from gems_fl.geometry.refine import cross_entropy
    from gems_fl.geometry.selection import score_candidates

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(40, 6)), rng.integers(0, 4, 40)
    candidates = rng.normal(size=(3, 4, 7))
    scales = (0.5, 1.0, 4.0)
    losses, correct = score_candidates(candidates, x, y, scales)
    for i, w in enumerate(candidates):
        for j, t in enumerate(scales):
            assert losses[i, j] == pytest.approx(cross_entropy(t * w, x, y), rel=1e-12)
        assert correct[i] == int(((x @ w[:, :-1].T + w[:, -1]).argmax(1) == y).sum())
    with pytest.raises(ValueError, match="candidates must be"):
        score_candidates(candidates[:, :, :5], x, y, scales)


def test_the_choice_pools_by_rows_accuracy_first_then_loss():
    from gems_fl.geometry.selection import choose_candidate

    scales = (1.0, 2.0)
    # node A (10 rows) prefers candidate 0, node B (30 rows) candidate 1: rows decide
    losses = [np.array([[0.5, 0.4], [0.9, 0.8]]), np.array([[0.9, 0.8], [0.5, 0.6]])]
    choice = choose_candidate(losses, [np.array([9, 5]), np.array([10, 25])], [10, 30], scales)
    assert choice.index == 1 and choice.val_accuracy == pytest.approx([19 / 40, 30 / 40])
    assert choice.temperature == 1.0  # 0.25*0.8+0.75*0.6 > 0.25*0.9+0.75*0.5
    # equal accuracy: the lower cross-entropy at its best scale wins
    tie = choose_candidate([np.array([[0.7, 0.6], [0.7, 0.3]])], [np.array([5, 5])], [10], scales)
    assert tie.index == 1 and tie.temperature == 2.0


def test_the_point_and_ridge_are_chosen_on_the_nodes_validation_data(tmp_path):
    from gems_fl.geometry.choices import GAUSSIAN_L2S, LDA_SHRINKAGES, POOLED_RIDGES

    results = run_in_process(3, tmp_path, **{"label-division": "paper"})
    assert results["settings"]["pooled-ridge"] == "auto"
    assert results["settings"]["gram-point"] == "auto"
    kinds = [r["kind"] for r in results["refinement"]]
    assert kinds == ["spaces", "selection"]
    chosen = results["rounds"][1]
    table = chosen["candidates"]
    # digits' layers are small, so the nodes sent class Gram matrices (class-grams=auto)
    assert [(c["point"], c["pooled_ridge"] or c.get("lda_shrinkage") or c.get("gaussian_l2"))
            for c in table] == \
        [("pooled", r) for r in POOLED_RIDGES] + [("lda", s) for s in LDA_SHRINKAGES] + \
        [("gaussian", v) for v in GAUSSIAN_L2S] + _mixture(table) + [("closed-form", None)]
    accuracies = [c["val_accuracy"] for c in table]
    assert chosen["val_accuracy"] == max(accuracies)
    best = [c for c in table if c["val_accuracy"] == max(accuracies)]
    kept = min(best, key=lambda c: c["val_loss"])  # ties: the lower loss
    details = results["intersection"]
    assert details["method"] == kept["point"] and chosen["pooled_ridge"] == kept["pooled_ridge"]
    assert chosen["point"] == kept["point"]
    if kept["point"] == "pooled":
        assert details["pooled_ridge"] == kept["pooled_ridge"]
        assert details["selection"]["scale_applied"] == chosen["temperature"]
    elif kept["point"] == "lda":
        assert details["lda_shrinkage"] == kept["lda_shrinkage"] == chosen["lda_shrinkage"]
        assert details["selection"]["scale_applied"] == chosen["temperature"]
    elif kept["point"] == "gaussian":
        assert details["gaussian_l2"] == kept["gaussian_l2"] == chosen["gaussian_l2"]
        assert details["selection"]["scale_applied"] == chosen["temperature"]
    else:  # the closed-form center keeps its scale, which places it in the spaces
        assert details["selection"]["scale_applied"] == 1.0
    assert results["refinement"][-1]["test_accuracy"] == results["rows"]["GEMS"]["accuracy"]


def test_pooled_ridge_takes_auto_or_a_number():
    assert Settings(pooled_ridge="0.01").pooled_ridges == (0.01,)
    assert Settings.from_run_config({"pooled-ridge": 0.01}).pooled_ridges == (0.01,)
    with pytest.raises(SettingsError, match="give 'auto'"):
        Settings(pooled_ridge="large")
    with pytest.raises(SettingsError, match="finite number >= 0"):
        Settings(pooled_ridge="-1")


def test_retired_refine_methods_are_refused_by_name():
    for retired in ("accelerated", "fast"):
        with pytest.raises(SettingsError, match=f"refine-method='{retired}' is not one of"):
            Settings(refine_method=retired)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_penalised_bohning_steps_never_increase_the_penalised_loss(seed, l2):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(40, 3)) * rng.uniform(0.1, 5), rng.integers(0, 4, 40)
    gram = gram_matrix(x)
    w = rng.normal(size=(4, 4)) * 3

    def objective(w):
        gradient, loss = softmax_gradient(w, x, y)
        return penalised(w, loss, gradient, l2)

    value, gradient = objective(w)
    for _ in range(5):
        w = bohning_step(w, gradient, gram, 1e-6, l2=l2)
        new, gradient = objective(w)
        assert new <= value + 1e-12
        value = new


def test_the_secant_curvature_is_the_share_of_the_bound_along_the_step():
    rng = np.random.default_rng(1)
    gram = gram_matrix(rng.normal(size=(50, 3)))
    step = rng.normal(size=(2, 4))
    # a quadratic whose curvature is 0.3 of Bohning's (1/2 I (x) G): y = 0.15 s G
    assert secant_curvature(step, 0.15 * step @ gram, gram) == pytest.approx(0.3)
    assert secant_curvature(step, 0.6 * step @ gram, gram) == 1.0  # never above the bound
    assert secant_curvature(step, -step @ gram, gram) == 0.05  # not convex there: the floor
    assert secant_curvature(np.zeros((2, 4)), step, gram) == 1.0
    # with the penalty the bound's curvature is G + 2 l2 I
    y = 0.5 * (step @ gram + 2 * 0.1 * step)
    assert secant_curvature(step, y, gram, l2=0.1) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="differ in shape"):
        secant_curvature(step, step[:1], gram)


def test_secant_steps_go_lower_than_plain_steps_and_go_back_when_the_loss_rises(tmp_path):
    common = {"refine-rounds": 5, "label-division": "paper", "pooled-ridge": 0.001}
    plain = run_in_process(3, tmp_path / "m", **common, **{"refine-method": "monotone"})
    secant = run_in_process(3, tmp_path / "s", **common)
    m = [r for r in plain["refinement"] if r["kind"] == "step"]
    s = [r for r in secant["refinement"] if r["kind"] == "step"]
    assert s[0]["objective"] == pytest.approx(m[0]["objective"], rel=1e-12)  # the same start
    assert s[1]["curvature"] == 1.0 and s[2]["curvature"] < 1.0  # measured after step 2
    assert min(r["objective"] for r in s if r["kept"]) < m[-1]["objective"]

    calls = {"n": 0}

    def inflate_third_step(reply):  # every node reports a loss far above the truth there
        if "gradient" in reply.content:
            calls["n"] += 1
            if 7 <= calls["n"] <= 9:
                metrics = reply.content["metrics"]
                metrics["loss"] = float(metrics["loss"]) + 100.0
        return reply

    bumped = run_in_process(3, tmp_path / "b", reply_hook=inflate_third_step, **common)
    b = [r for r in bumped["refinement"] if r["kind"] == "step"]
    assert [r["kept"] for r in b[:4]] == [True, True, False, True]
    assert b[3]["curvature"] == 1.0  # back to the last good point with a plain step
    assert b[1]["objective"] >= b[3]["objective"]


def test_refine_l2_auto_penalises_the_logistic_model_only():
    from gems_fl.geometry.choices import DEFAULT_REFINE_L2
    from gems_fl.settings.plan import refine_l2_for

    assert Settings().refine_l2 == "auto"
    assert refine_l2_for(Settings()) == DEFAULT_REFINE_L2  # chosen on validation
    assert refine_l2_for(Settings(model="mlp")) == 0.0  # not chosen for the MLP
    assert refine_l2_for(Settings(model="mlp", refine_l2=0.01)) == 0.01
    assert Settings.from_run_config({"refine-l2": "0.003"}).refine_l2 == 0.003
    with pytest.raises(SettingsError, match="refine-l2='-1' must be"):
        Settings(refine_l2="-1")
    with pytest.raises(SettingsError, match="refine-l2='strong'"):
        Settings(refine_l2="strong")


def _mixture(table: list[dict]) -> list[tuple[str, float]]:
    """The mixture candidates the selection round scores where some node split a class
    into k-means components (class-components; on digits only classes large enough)."""
    from gems_fl.geometry.choices import GAUSSIAN_L2S

    return ([("mixture", v) for v in GAUSSIAN_L2S]
            if any(c["point"] == "mixture" for c in table) else [])
