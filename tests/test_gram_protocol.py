"""Gram spaces through the real apps: replies, their validation, the closed-form h_G,
and the evaluate round in which every node checks h_G on its own data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, Message

from gems_fl.geometry.gram import gram_matrix, label_moments, pack_triangle
from gems_fl.protocol import replies, space_replies, wire
from gems_fl.settings import Settings
from tests.helpers import run_in_process

SHAPES = {"weight": (3, 4), "bias": (3,)}
N = 5  # inputs + 1


# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def _gram_reply(gram: np.ndarray | None = None) -> object:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 4))
    if gram is None:
        gram = gram_matrix(x)
    return wire.encode_reply({"weight": rng.standard_normal((3, 4)), "bias": np.zeros(3)}, None,
                             radius=2.0, certified_radius=0.5, eps=0.4, num_train_examples=40,
                             num_val_examples=10, local_val_accuracy=0.9, gram=gram,
                             labels=label_moments(x, np.arange(40) % 3, 3))


def test_decode_accepts_a_gram_reply_and_rebuilds_the_matrix():
    rng = np.random.default_rng(0)
    gram = gram_matrix(rng.standard_normal((40, 4)))
    space, metrics = space_replies.decode_reply(_gram_reply(gram), SHAPES, "gram", labels=True)
    assert space.kind == "gram" and space.radius == 2.0 and space.certified_radius == 0.5
    np.testing.assert_allclose(space.gram, gram, rtol=1e-6, atol=1e-6)  # float32 on the wire
    assert metrics["eps"] == 0.4
    assert space.class_counts.tolist() == [14, 13, 13]
    np.testing.assert_allclose(space.moments[:, -1], [14 / 40, 13 / 40, 13 / 40], rtol=1e-6)


def _set_triangle(content, values: np.ndarray) -> None:
    content["gram"]["triangle"] = Array(np.ascontiguousarray(values, dtype=np.float32))


def _not_psd(c):
    g = np.eye(N)
    g[0, 0] = -1.0
    _set_triangle(c, pack_triangle(g))


def _nan(c):
    tri = pack_triangle(np.eye(N))
    tri[2] = np.nan
    _set_triangle(c, tri)


def _wrong_shape(c):
    _set_triangle(c, pack_triangle(np.eye(N + 1)))


def _missing(c):
    del c["gram"]


def _not_symmetric_factor(c):
    # A factor where a triangle is expected is the wrong record key.
    c["gram"] = wire.array_record({"factor": np.ones((N, 2), dtype=np.float32)})


def _counts_off(c):
    c["labels"]["counts"] = Array(np.array([14, 13, 14], dtype=np.int64))  # 41 rows, not 40


def _moments_nan(c):
    moments = c["labels"]["moments"].numpy().copy()
    moments[0, 0] = np.nan
    c["labels"]["moments"] = Array(moments)


def _moments_shape(c):
    c["labels"]["moments"] = Array(np.zeros((3, N + 1), dtype=np.float32))


def _moments_bias(c):
    moments = c["labels"]["moments"].numpy().copy()
    moments[:, -1] = 1.0 / 3.0 + 0.01  # not the class shares
    c["labels"]["moments"] = Array(moments)


def _no_labels(c):
    del c["labels"]


BAD_GRAMS = {
    "counts-off": (_counts_off, "summing to the node's 40 training samples"),
    "moments-nan": (_moments_nan, "NaN"),
    "moments-shape": (_moments_shape, "label moments have shape"),
    "moments-bias": (_moments_bias, "last column differs"),
    "no-labels": (_no_labels, "missing \\['labels'\\]"),
    "not-psd": (_not_psd, "positive semi-definite|PSD|eigenvalue"),
    "nan": (_nan, "NaN"),
    "wrong-shape": (_wrong_shape, "shape"),
    "missing": (_missing, "missing \\['gram'\\]"),
    "wrong-key": (_not_symmetric_factor, "expected \\['triangle'\\]"),
}


@pytest.mark.parametrize("name", sorted(BAD_GRAMS))
def test_bad_gram_replies_are_rejected_with_a_reason(name):
    corrupt, reason = BAD_GRAMS[name]
    content = _gram_reply()
    corrupt(content)
    with pytest.raises(replies.ReplyError, match=reason):
        space_replies.decode_reply(content, SHAPES, "gram", labels=True)


def test_label_moments_are_sent_only_when_the_run_asks_for_them():
    with pytest.raises(replies.ReplyError, match="unexpected \\['labels'\\]"):
        space_replies.decode_reply(_gram_reply(), SHAPES, "gram")  # label-moments=false
    content = _gram_reply()
    del content["labels"]
    space, _ = space_replies.decode_reply(content, SHAPES, "gram")
    assert space.moments is None and space.class_counts is None


def test_pooled_points_need_label_moments_in_the_settings():
    from gems_fl.settings import Settings, SettingsError

    with pytest.raises(SettingsError, match="label-moments=true"):
        Settings(gram_point="lda", label_moments=False)
    Settings(gram_point="lda", label_moments=True)
    assert Settings().gram_point == "auto" and Settings().label_moments  # the defaults agree
    Settings(space="ball", label_moments=False)  # the Gram point is not asked for a ball


def test_a_non_symmetric_full_matrix_is_rejected():
    from gems_fl.geometry.gram import check_gram

    g = np.eye(N)
    g[0, 1] = 0.5
    with pytest.raises(ValueError, match="symmetric"):
        check_gram(g, N)


def test_bad_gram_from_one_node_is_dropped_with_its_name_and_the_round_goes_on(tmp_path):
    def hook(reply: Message) -> Message:
        if reply.metadata.src_node_id == 1001:
            _not_psd_full(reply.content)
        return reply

    results = run_in_process(4, tmp_path, reply_hook=hook, space="gram",
                             **{"label-division": "classes-per-node:4", "required-nodes": "3"})
    rejected = {r["node_id"]: r for r in results["rejected"]}
    assert list(rejected) == [1001]
    assert rejected[1001]["node_name"] == "partition-1"
    assert "gram" in rejected[1001]["reason"]
    assert sorted(n["node_id"] for n in results["nodes"]) == [1000, 1002, 1003]


def _not_psd_full(content) -> None:
    n = 65  # digits: 64 features + 1
    g = np.eye(n)
    g[5, 5] = -3.0
    content["gram"]["triangle"] = Array(pack_triangle(g).astype(np.float32))


def test_gram_run_reports_per_node_verification(tmp_path):
    results = run_in_process(3, tmp_path, space="gram", **{"label-division": "classes-per-node:4",
                                                           "gram-point": "closed-form"})
    assert results["intersection"]["method"] == "closed-form"
    nodes = results["nodes"]
    assert [n["name"] for n in nodes] == sorted(n["name"] for n in nodes)
    for node in nodes:
        for key in ("eps", "radius", "certified_radius", "inside", "h_g_val_accuracy",
                    "good_enough"):
            assert key in node
        assert node["good_enough"] == (node["h_g_val_accuracy"] >= node["eps"])
    ver = results["verification"]
    assert ver["answered"] == 3 and ver["missing"] == []
    assert set(ver["pooled_val"]) >= {"gems", "averaged"}
    saved = json.loads((tmp_path / "run-1" / "results.json").read_text())
    assert saved["nodes"] == nodes


def test_closed_form_center_is_what_h_g_is(tmp_path):
    """h_G equals the weighted Gram center of the accepted replies (samples weighting)."""
    from gems_fl.geometry.gram_merge import gram_center

    captured = []

    def hook(reply: Message) -> Message:
        captured.append(space_replies.decode_reply(reply.content, {"weight": (10, 64), "bias": (10,)},
                                          "gram"))
        return reply

    results, grid = run_in_process(3, tmp_path, reply_hook=hook, space="gram",
                                   return_grid=True, **{"label-division": "classes-per-node:4",
                                                        "gram-point": "closed-form",
                                                        "label-moments": False})
    spaces = [s for s, _ in captured]
    weights = [m["num-train-examples"] for _, m in captured]
    expected = gram_center([s.matrix for s in spaces], [s.gram for s in spaces], weights, 1e-6)
    saved = np.load(tmp_path / "run-1" / "gems_model.npz")
    got = np.concatenate([saved["weight"], saved["bias"][:, None]], axis=1)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)


def test_a_node_that_does_not_answer_the_evaluate_message_is_reported(tmp_path):
    def drop(reply: Message):
        return None if reply.metadata.src_node_id == 1002 else reply

    results = run_in_process(3, tmp_path, space="gram", evaluate_hook=drop,
                             **{"label-division": "classes-per-node:4", "round-timeout": 5.0,
                                "required-nodes": "2"})
    assert results["attendance"]["left_out"] == [
        {"name": "partition-2", "stage": "evaluate", "reason": "no answer"}]
    missing = results["verification"]["missing"]
    assert [m["node_name"] for m in missing] == ["partition-2"]
    assert missing[0]["reason"] == "no answer"
    by_name = {n["name"]: n for n in results["nodes"]}
    assert by_name["partition-2"]["good_enough"] is None
    assert by_name["partition-0"]["good_enough"] is not None


def test_a_node_with_its_own_eps_is_reported_with_that_eps(tmp_path):
    configs = [{"partition-id": k, "num-partitions": 3} for k in range(3)]
    configs[1]["eps"] = 0.9
    results = run_in_process(3, tmp_path, **NO_CHECK, node_configs=configs, space="ball",
                             **{"label-division": "classes-per-node:4"})
    eps = {n["name"]: n["eps"] for n in results["nodes"]}
    assert eps == {"partition-0": 0.4, "partition-1": 0.9, "partition-2": 0.4}
    by_name = {n["name"]: n for n in results["nodes"]}
    assert by_name["partition-1"]["good_enough"] == (by_name["partition-1"]["h_g_val_accuracy"] >= 0.9)


def test_mlp_without_public_samples_completes(tmp_path):
    results = run_in_process(3, tmp_path, model="mlp", space="gram", baselines="all",
                             **{"public-samples": 0, "label-division": "classes-per-node:4"})
    rows = results["rows"]
    assert rows["GEMS tuned"]["accuracy"] is None and "public-samples=0" in rows["GEMS tuned"]["skipped"]
    assert rows["GEMS"]["accuracy"] is not None and rows["Ensemble"]["accuracy"] is not None
    assert results["verification"]["answered"] == 3


def test_a_rank_r_reply_carries_the_residual_diagonal_and_the_server_holds_the_nodes_space(tmp_path):
    """gram-rank=r: F (n x r) and diag(G - F F^T) travel; the server's G is exactly the
    node's (F F^T + diag), every input direction keeps its own variance, and a reply
    without the residual is refused."""
    from gems_fl.geometry.gram import from_factor, gram_matrix, low_rank_factor, residual_diagonal

    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 12)) @ rng.normal(size=(12, 12))
    g = gram_matrix(x)
    f = low_rank_factor(g, 3)
    d = residual_diagonal(g, f)
    approx = from_factor(f, d)
    np.testing.assert_allclose(np.diag(approx), np.diag(g), rtol=1e-5)
    assert np.linalg.norm(approx - g) < np.linalg.norm(from_factor(f) - g) * 1.5
    assert (d >= 0).all()
    results = run_in_process(3, tmp_path, space="gram", **{"gram-rank": 5,
                                                          "label-division": "classes-per-node:4"})
    up = results["rounds"][0]["bytes_received"]
    full = run_in_process(3, tmp_path / "full", space="gram",
                          **{"label-division": "classes-per-node:4"})["rounds"][0]["bytes_received"]
    assert up < full
    content = _gram_reply()
    content.array_records["gram"] = wire.array_record({"vectors": np.ones((65, 5), np.float16),
                                                       "scales": np.ones(5, np.float32)})
    with pytest.raises(replies.ReplyError, match="residual"):
        space_replies.decode_reply(content, SHAPES, "gram", 5, labels=True)
    n = SHAPES["weight"][1] + 1
    content.array_records["gram"] = wire.array_record({"vectors": np.full((n, 2), 2, np.float16),
                                                       "scales": np.ones(2, np.float32),
                                                       "residual": np.ones(n, np.float32)})
    with pytest.raises(replies.ReplyError, match=r"\[-1, 1\]"):
        space_replies.decode_reply(content, SHAPES, "gram", 2, labels=True)


@pytest.mark.parametrize("features, rank", [(64, 0), (65, 32), (800, 51)])
def test_gram_rank_auto_compresses_only_where_the_factor_is_smaller(features, rank):
    """gram-rank=auto: r = max(32, ceil(n / 16)) for an n x n matrix when
    n > 2r + 1, else the whole matrix; the node sends that form (float16 vectors) and the
    server, which knows n from the model's shape, reads the same form and holds exactly
    the node's own space."""
    from gems_fl.geometry.choices import gram_rank_for
    from gems_fl.geometry.kinds import SpaceOptions, build_layer_space
    from gems_fl.protocol.node import encode_layer_space

    assert Settings(gram_rank="auto").gram_rank == "auto"
    assert gram_rank_for("auto", features + 1) == rank
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(200, features)), rng.integers(0, 3, 200)
    w = rng.normal(size=(3, features + 1)) * 0.01
    options = SpaceOptions(kind="gram", eps=0.0, num_directions=20, gram_rank="auto",
                           label_moments=True)
    layer = build_layer_space(w, (x, y), x[:50], y[:50], options, seed=0)
    content = encode_layer_space(layer, features, 3, eps=0.0, num_train=200, num_val=50,
                                 val_accuracy=0.5)
    sent = set(content.array_records["gram"].keys())
    assert sent == ({"vectors", "scales", "residual"} if rank else {"triangle"})
    if rank:
        vectors = content.array_records["gram"]["vectors"].numpy()
        assert vectors.shape == (features + 1, rank) and vectors.dtype == np.float16
    shapes = {"weight": (3, features), "bias": (3,)}
    space, _ = space_replies.decode_reply(content, shapes, "gram", "auto", labels=True)
    if rank:  # the factor travels exactly; the triangle in float32
        np.testing.assert_array_equal(space.gram, layer.space.gram)
    np.testing.assert_allclose(space.gram, layer.space.gram, rtol=1e-5, atol=1e-6)
    with pytest.raises(replies.ReplyError, match="gram-rank"):  # the other form is refused
        space_replies.decode_reply(content, shapes, "gram", 0 if rank else 5, labels=True)


def test_the_run_plan_resolves_every_auto_and_matches_what_the_run_did(tmp_path):
    """``results.json`` holds the plan: the autos resolved once, at the start."""
    results = run_in_process(3, tmp_path)
    plan = results["plan"]
    assert plan["gram_point"] == "auto" and plan["nodes"] == 3 and plan["layer_size"] == 65
    assert plan["gram_rank"] == 0 and plan["class_grams"] is True  # digits: whole, small
    assert results["intersection"]["method"] in plan["points"]
    scored = {c["point"] for r in results["rounds"] for c in r.get("candidates", [])}
    assert "gaussian" in scored and scored <= set(plan["points"])
    assert plan["server_holds"] == results["privacy"]["server_holds"]
    assert plan["baselines"] == "cheap" and plan["device"] == "cpu"
    dp = run_in_process(3, tmp_path / "dp", **{"dp-epsilon": 4.0, "min-good-enough": "0"})["plan"]
    assert dp["server_holds"] == "sums" and "closed-form" not in dp["points"]


def test_a_factor_reply_is_rebuilt_without_a_proof_and_an_overflowing_one_is_refused():
    """A rank-r reply is F F^T + diag(r): PSD by its form, so the server solves no
    Cholesky for it; scales that overflow the factor are refused, naming why."""
    from gems_fl.geometry.gram import from_factor, from_half, half_factor, low_rank_factor, residual_diagonal

    x = np.random.default_rng(0).standard_normal((40, 4))
    g = gram_matrix(x)
    f = low_rank_factor(g, 2)
    kept = from_half(*half_factor(f))
    residual = residual_diagonal(g, kept)

    def reply():
        return wire.encode_reply({"weight": np.zeros((3, 4)), "bias": np.zeros(3)}, None,
                                 radius=2.0, certified_radius=0.5, eps=0.4, num_train_examples=40,
                                 num_val_examples=10, local_val_accuracy=0.9, gram_factor=kept,
                                 gram_residual=residual)

    space, _ = space_replies.decode_reply(reply(), SHAPES, "gram", 2)
    np.testing.assert_allclose(space.gram, from_factor(kept, residual), rtol=1e-6)
    content = reply()
    vectors = content.array_records["gram"]["vectors"].numpy()
    content.array_records["gram"] = wire.array_record({
        "vectors": vectors, "scales": np.full(2, 1e200), "residual": residual})
    with pytest.raises(replies.ReplyError, match="infinite"):
        space_replies.decode_reply(content, SHAPES, "gram", 2)
