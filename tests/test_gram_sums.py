"""server-grams=sums: the server keeps only the sums of the nodes' Gram statistics, and
each node checks h_G against its own space in the evaluate round."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message

from gems_fl.geometry.choices import SUMS_ABOVE_NODES
from gems_fl.geometry.gram import gram_matrix, label_moments
from gems_fl.geometry.gram_merge import gram_center
from gems_fl.geometry.gram_sums import GramSums
from gems_fl.geometry.points import (
    GRAM_POINTS,
    POINTS,
    NodeStatistics,
    SummedStatistics,
    aggregate_gram,
    aggregate_sums,
    auto_points,
)
from gems_fl.geometry.pooled import pooled_lda, pooled_point
from gems_fl.geometry.spaces import GramSpace, SummedGramSpace
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import holds_sums
from tests.helpers import run_in_process

C, D = 4, 6


def _nodes(k: int = 5, seed: int = 0) -> list[tuple]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        n = int(rng.integers(20, 60))
        x = rng.normal(size=(n, D)) * 3.0
        y = rng.integers(0, C, n)
        moments, counts = label_moments(x, y, C)
        out.append((n, rng.normal(size=(C, D + 1)), gram_matrix(x), moments, counts))
    return out


def _summed(nodes) -> GramSums:
    sums = GramSums(C, D + 1)
    for node in nodes:
        sums.add(*node)
    return sums


def _spaces(nodes) -> list[GramSpace]:
    return [GramSpace(w.reshape(-1), g, 1.0, 1.0, m, c) for _, w, g, m, c in nodes]


def test_points_from_sums_equal_the_points_from_every_nodes_matrix():
    nodes = _nodes()
    sums = _summed(nodes)
    counts = [n[0] for n in nodes]
    grams, moments = [n[2] for n in nodes], [n[3] for n in nodes]
    spaces = _spaces(nodes)
    summed = lambda point, value: aggregate_sums(sums, spaces, counts, point=point, ridge=1e-3,
                                                 pooled_ridge=value).point.reshape(C, -1)
    np.testing.assert_allclose(summed("closed-form", None),
                               gram_center([n[1] for n in nodes], grams, counts, 1e-3),
                               rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(summed("pooled", 1e-2), pooled_point(grams, moments, counts, 1e-2),
                               rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(summed("lda", 1e-2), pooled_lda(grams, moments, counts, 1e-2),
                               rtol=1e-7, atol=1e-8)
    assert sums.count == sum(counts) and sums.nodes == len(nodes)
    np.testing.assert_array_equal(sums.class_counts, np.sum([n[4] for n in nodes], axis=0))


@pytest.mark.parametrize("point, value", [("closed-form", None), ("pooled", 1e-2),
                                          ("lda", 1e-2)])
def test_each_registered_point_is_one_solve_over_either_statistics(point, value):
    """The nodes' replies and the running sums behind one interface: one solve per point,
    the same point from both (to the fixed-point sums' resolution)."""
    nodes = _nodes()
    counts = [n[0] for n in nodes]
    spaces = _spaces(nodes)
    from_nodes = aggregate_gram(spaces, counts, point=point, ridge=1e-3, pooled_ridge=value)
    from_sums = aggregate_sums(_summed(nodes), spaces, counts, point=point, ridge=1e-3,
                               pooled_ridge=value)
    assert from_nodes.method == from_sums.method == point
    np.testing.assert_allclose(from_sums.point, from_nodes.point, rtol=1e-7, atol=1e-8)
    assert from_sums.inside == [None] * len(nodes)  # the nodes check membership themselves
    assert len(from_nodes.inside) == len(nodes) and None not in from_nodes.inside


def test_auto_offers_every_point_the_statistics_allow_in_registry_order():
    nodes = _nodes()
    counts = [n[0] for n in nodes]
    spaces = _spaces(nodes)
    assert [p.name for p in auto_points(NodeStatistics(spaces, counts))] == [
        "pooled", "lda", "closed-form"]  # no class Gram matrices were sent
    assert [p.name for p in auto_points(SummedStatistics(_summed(nodes), counts))] == [
        "pooled", "lda", "closed-form"]
    bare = [GramSpace(s.center, s.gram, s.radius) for s in spaces]  # no label moments
    assert [p.name for p in auto_points(NodeStatistics(bare, counts))] == ["closed-form"]
    assert list(POINTS)[-1] == "closed-form" and set(POINTS) == set(GRAM_POINTS) - {"auto"}


def test_the_sums_do_not_depend_on_the_order_replies_arrive_in():
    nodes = _nodes(k=8)
    spaces = _spaces(nodes)
    counts = [n[0] for n in nodes]

    def solved(sums, point, value):
        return aggregate_sums(sums, spaces, counts, point=point, ridge=1e-6,
                              pooled_ridge=value).point

    reference = _summed(nodes)
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(len(nodes))
        other = _summed([nodes[i] for i in order])
        # bit for bit: fixed-point addition is exact
        for point, value in (("closed-form", None), ("pooled", 1e-3)):
            np.testing.assert_array_equal(solved(other, point, value),
                                          solved(reference, point, value))


@pytest.mark.parametrize("bad, match", [
    (lambda n: (0,) + n[1:], "positive count"),
    (lambda n: (n[0], n[1][:, :3]) + n[2:], "do not fit"),
    (lambda n: (n[0], n[1], np.full_like(n[2], np.nan)) + n[3:], "NaN"),
    (lambda n: (n[0], n[1], n[2] * 1e12) + n[3:], "beyond what the fixed-point sums hold"),
    (lambda n: n[:3], "every node adds label moments"),
])
def test_a_node_that_cannot_be_summed_is_refused_and_adds_nothing(bad, match):
    nodes = _nodes(k=3)
    sums = _summed(nodes[:2])
    before = (sums.nodes, sums.count, sums.pooled_gram().copy())
    with pytest.raises(ValueError, match=match):
        sums.add(*bad(nodes[2]))
    assert (sums.nodes, sums.count) == before[:2]
    np.testing.assert_array_equal(sums.pooled_gram(), before[2])


def test_sums_are_refused_for_points_and_models_that_need_every_matrix():
    for bad in ({"gram_point": "mixture"}, {"model": "mlp"}, {"space": "ball"}):
        with pytest.raises(SettingsError, match="server-grams='sums'"):
            Settings(server_grams="sums", **bad)


def test_auto_keeps_the_matrices_up_to_the_threshold_and_sums_beyond():
    auto = Settings()
    assert not holds_sums(auto, SUMS_ABOVE_NODES)
    assert holds_sums(auto, SUMS_ABOVE_NODES + 1)
    assert not holds_sums(Settings(gram_point="mixture"), 1000)
    assert not holds_sums(Settings(server_grams="nodes"), 1000)
    assert holds_sums(Settings(server_grams="sums"), 2)


# class-grams=false: the gaussian point is an iterative fit, which the two paths give only
# to within its tolerance (tests/test_gaussian_point.py compares them by predictions); the
# points solved in closed form must agree here to rounding
COMMON = {"label-division": "classes-per-node:4", "refine-rounds": 2, "class-grams": "false"}


def test_a_run_on_sums_gives_the_model_and_membership_of_a_run_on_every_matrix(tmp_path,
                                                                                strategies):
    full = run_in_process(4, tmp_path / "nodes", **COMMON, **{"server-grams": "nodes"})
    summed = run_in_process(4, tmp_path / "sums", **COMMON, **{"server-grams": "sums"})

    on_sums = strategies[1]
    assert on_sums.sums is not None and on_sums.sums.nodes == 4
    assert all(isinstance(r.space, SummedGramSpace) and not hasattr(r.space, "gram")
               for r in on_sums.outcome.accepted)
    assert strategies[0].sums is None

    models = [np.load(tmp_path / m / "run-1" / "gems_model.npz") for m in ("nodes", "sums")]
    for key in ("weight", "bias"):
        np.testing.assert_allclose(models[0][key], models[1][key], rtol=1e-5, atol=1e-6)
    assert summed["rows"]["GEMS"]["accuracy"] == full["rows"]["GEMS"]["accuracy"]

    # the server's check (every matrix) and the nodes' own checks (sums) agree per node
    a, b = full["intersection"], summed["intersection"]
    assert a["inside"] == b["inside"] and a["found"] == b["found"]
    for name in a["distance"]:
        assert b["distance"][name] == pytest.approx(a["distance"][name], rel=1e-5)
    assert "membership" in b and "membership" not in a
    for row in full["nodes"] + summed["nodes"]:
        assert row["inside_by_node"] == row["inside"]
    per_node = summed["verification"]["per_node"]
    assert all("own_space" in entry for entry in per_node.values())


def test_with_sums_a_node_that_does_not_answer_has_unknown_membership(tmp_path):
    def drop(reply: Message):
        return None if reply.metadata.src_node_id == 1002 else reply

    results = run_in_process(3, tmp_path, evaluate_hook=drop,
                             **{"label-division": "classes-per-node:4", "round-timeout": 5.0,
                                "required-nodes": "2", "server-grams": "sums"})
    inter = results["intersection"]
    assert inter["inside"]["partition-2"] is None and inter["distance"]["partition-2"] is None
    assert inter["inside"]["partition-0"] is not None
    assert inter["found"] is False and inter["objective"] is None
    row = {n["name"]: n for n in results["nodes"]}["partition-2"]
    assert row["inside"] is None and row["inside_by_node"] is None


def test_an_evaluate_answer_without_the_own_space_check_is_refused(tmp_path):
    def strip(reply: Message):
        if reply.metadata.src_node_id == 1001:
            metrics = reply.content["metrics"]
            del metrics["space.distance"]
            del metrics["space.inside"]
        return reply

    results = run_in_process(3, tmp_path, evaluate_hook=strip,
                             **{"label-division": "classes-per-node:4", "required-nodes": "2"})
    missing = results["verification"]["missing"]
    assert [m["node_name"] for m in missing] == ["partition-1"]
    assert "own space check" in missing[0]["reason"]


def test_the_columns_class_grams_sum_like_the_layers_and_a_misfit_is_refused():
    """The kernel model's sums of its leading columns' class Gram matrices give the same
    class moments as the per-node matrices, and a node whose matrices do not fit the
    others' columns is refused before anything of it is added."""
    from gems_fl.geometry.gram import class_grams, gram_matrix, label_moments
    from gems_fl.geometry.gram_sums import GramSums
    from gems_fl.geometry.virtual import pooled_class_moments

    rng = np.random.default_rng(0)
    sums, per_node, counts_of = GramSums(3, 6), [], []
    for n in (40, 60):
        x, y = rng.normal(size=(n, 5)), rng.integers(0, 3, n)
        moments, counts = label_moments(x, y, 3)
        columns = class_grams(x[:, :2], y, 3)
        sums.add(n, np.zeros((3, 6)), gram_matrix(x), moments, counts,
                 column_class_grams=columns)
        per_node.append(columns)
        counts_of.append(counts)
    for got, want in zip(sums.column_class_moments(), pooled_class_moments(per_node, counts_of)):
        np.testing.assert_allclose(got, want, atol=1e-9)
    x, y = rng.normal(size=(30, 5)), np.arange(30) % 3
    moments, counts = label_moments(x, y, 3)
    before = sums.nodes
    with pytest.raises(ValueError, match="do not fit"):
        sums.add(30, np.zeros((3, 6)), gram_matrix(x), moments, counts,
                 column_class_grams=class_grams(x[:, :3], y, 3))
    assert sums.nodes == before


def test_the_sums_are_the_plain_fixed_point_expression_and_leave_the_replies_as_they_were():
    """The fixed-point sums round each node's scaled statistics in place (a kernel
    model's Gram matrix is 145 MB a temporary): the same integers as the plain
    expression, and the arrays a reply decoded to unchanged."""
    from gems_fl.geometry.gram_sums import FRACTION_BITS

    def plain(values):
        return np.rint(np.ldexp(np.asarray(values, dtype=np.float64), FRACTION_BITS)).astype(np.int64)

    nodes = _nodes(4, seed=7)
    releases = [(n, n * g, n * m) for n, _, g, m, _ in nodes]  # float64, the caller's own
    kept = [[np.copy(a) for a in node if isinstance(a, np.ndarray)] for node in nodes]
    kept_releases = [(g.copy(), m.copy()) for _, g, m in releases]
    sums, noised = GramSums(C, D + 1), GramSums(C, D + 1)
    for (n, center, gram, moments, counts), (_, g_sum, m_sum) in zip(nodes, releases):
        sums.add(n, center, gram, moments, counts)
        noised.add_noised(n, g_sum, m_sum)
    for node, before in zip(nodes, kept):
        for now, then in zip([a for a in node if isinstance(a, np.ndarray)], before):
            np.testing.assert_array_equal(now, then)
    for (_, g_sum, m_sum), (g0, m0) in zip(releases, kept_releases):
        np.testing.assert_array_equal(g_sum, g0)
        np.testing.assert_array_equal(m_sum, m0)
    np.testing.assert_array_equal(sums._gram, sum(plain(n * g) for n, _, g, _, _ in nodes))
    np.testing.assert_array_equal(sums._center_gram,
                                  sum(plain(w @ (n * g)) for n, w, g, _, _ in nodes))
    np.testing.assert_array_equal(sums._moments, sum(plain(n * m) for n, _, _, m, _ in nodes))
    np.testing.assert_array_equal(noised._moments, sum(plain(m) for _, _, m in releases))
