"""Tests for gems_fl.geometry.layer_merge: server-side aggregation of one hidden layer."""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from gems_fl.geometry.ball_meet import ball_dual, squared_distances, three_balls_meet
from gems_fl.geometry.intersect import find_intersection
from gems_fl.geometry.layer_merge import LayerMerge, merge_layer
from gems_fl.geometry.spaces import Space


def _nodes(*layers):
    """``[(centers, radii), ...]`` from lists of ``(center, radius)`` per node."""
    return [
        (
            np.array([c for c, _ in layer], dtype=np.float64).reshape(len(layer), -1),
            np.array([r for _, r in layer], dtype=np.float64),
        )
        for layer in layers
    ]


def _min_max_miss(centers, radii, lo, hi, step):
    """Independent check on a 2-D grid: min over w of max_k (||w - c_k|| - r_k)."""
    xs = np.arange(lo, hi + step, step)
    gx, gy = np.meshgrid(xs, xs)
    pts = np.stack([gx.ravel(), gy.ravel()], axis=1)
    miss = np.stack(
        [np.linalg.norm(pts - c, axis=1) - r for c, r in zip(centers, radii)]
    )
    return float(miss.max(axis=0).min())


def _check_invariants(nodes, res: LayerMerge):
    """What every merge must satisfy, whatever the geometry."""
    total = sum(len(r) for _, r in nodes)
    seen = [pair for g in res.groups for pair in g]
    # A partition of the input neurons.
    assert len(seen) == total
    assert sorted(seen) == sorted(
        (k, i) for k, (_, r) in enumerate(nodes) for i in range(len(r))
    )
    assert res.weights.shape == (len(res.groups), nodes[0][0].shape[1])
    for g, w in zip(res.groups, res.weights):
        # At most one neuron per node, like a tuple of the cartesian product.
        assert len({k for k, _ in g}) == len(g)
        # The output neuron lies in every member's ball (the paper's condition).
        for k, i in g:
            assert Space(nodes[k][0][i], nodes[k][1][i]).contains(w)
        if len(g) == 1:
            k, i = g[0]
            assert np.array_equal(w, nodes[k][0][i])
    assert res.num_intersected_groups == sum(len(g) >= 2 for g in res.groups)
    assert res.num_kept_alone == sum(len(g) == 1 for g in res.groups)
    assert res.clusters_visited == res.num_nonempty_clusters
    assert len(set(res.group_clusters)) == res.num_nonempty_clusters
    assert res.width >= res.num_nonempty_clusters
    assert res.width <= total
    # Groups hold one neuron per node: width >= sum_c max_k n_{c,k}.
    assert res.width >= _width_lower_bound(nodes, res)


def _width_lower_bound(nodes, res):
    counts: dict[tuple[int, int], int] = {}
    for g, lab in zip(res.groups, res.group_clusters):
        for k, _ in g:
            counts[(lab, k)] = counts.get((lab, k), 0) + 1
    best: dict[int, int] = {}
    for (lab, _), n in counts.items():
        best[lab] = max(best.get(lab, 0), n)
    return sum(best.values())


# --- every cluster is visited --------------------------------------------------------


def test_single_cluster_label_zero_is_merged():
    """With m_eps = 1 every neuron is in cluster 0: skipping it would merge nothing."""
    nodes = _nodes([([0.0, 0.0], 1.0)], [([0.5, 0.0], 1.0)], [([0.0, 0.5], 1.0)])
    res = merge_layer(nodes, num_clusters=1, seed=0)
    assert res.clusters_visited == 1 == res.num_nonempty_clusters
    assert res.group_clusters == [0]
    assert res.groups == [[(0, 0), (1, 0), (2, 0)]]
    assert res.num_intersected_groups == 1 and res.num_kept_alone == 0


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_cluster_visited_and_label_zero_merges(seed):
    """Two far blobs of overlapping neurons: both clusters, label 0 included, merge."""
    rng = np.random.default_rng(seed)
    blobs = [np.array([10.0, 0.0, 0.0]), np.array([-10.0, 0.0, 0.0])]
    nodes = []
    for _ in range(3):
        centers = np.stack([b + 0.05 * rng.normal(size=3) for b in blobs])
        nodes.append((centers, np.array([1.0, 1.0])))
    res = merge_layer(nodes, num_clusters=2, seed=seed)
    _check_invariants(nodes, res)
    assert res.clusters_visited == 2 == res.num_nonempty_clusters
    assert sorted(res.group_clusters) == [0, 1]
    merged_labels = {
        lab for g, lab in zip(res.groups, res.group_clusters) if len(g) == 3
    }
    assert merged_labels == {0, 1}
    assert res.width == 2


def test_visited_clusters_match_kmeans_labels():
    """Every label k-means assigns gets at least one output neuron."""
    rng = np.random.default_rng(5)
    nodes = [(rng.normal(size=(20, 6)), rng.uniform(0.1, 2.0, 20)) for _ in range(4)]
    res = merge_layer(nodes, num_clusters=12, seed=3)
    _check_invariants(nodes, res)
    stacked = np.concatenate([c for c, _ in nodes])
    with threadpool_limits(limits=1):  # as merge_layer's default threads=1
        labels = KMeans(n_clusters=12, random_state=3, n_init=1).fit(stacked).labels_
    assert set(res.group_clusters) == set(labels.tolist())
    assert res.clusters_visited == len(set(labels.tolist())) == 12


def test_empty_clusters_are_reported_not_visited():
    """Coinciding neurons: k-means leaves clusters empty; width >= non-empty ones."""
    a, b = [0.0, 0.0], [50.0, 50.0]
    nodes = _nodes([(a, 0.0), (a, 0.0), (b, 0.0)], [(a, 0.0), (b, 0.0), (b, 0.0)])
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)  # suppressed inside
        res = merge_layer(nodes, num_clusters=5, seed=0)
    _check_invariants(nodes, res)
    assert res.num_clusters == 5 and res.num_clusters_used == 5
    assert res.num_nonempty_clusters == res.clusters_visited == 2
    # Radius 0 everywhere: equal centers from different nodes still merge (the common
    # point is that center), at most one per node.
    assert res.width == 4
    assert res.num_intersected_groups == 2


# --- a verified common point, not pairwise overlap -----------------------------------


@pytest.mark.parametrize("method", ["dual", "dykstra"])
def test_pairwise_overlap_without_common_point_is_not_merged(method):
    """Three unit disks on an equilateral triangle of side 1.9.

    Pairwise they overlap (1.9 < 1 + 1), but the point nearest to all three centers,
    the circumcenter, is 1.9 / sqrt(3) = 1.097 > 1 from each: no common point. The
    first two merge, the third stays alone.
    """
    side = 1.9
    pts = [(0.0, 0.0), (side, 0.0), (side / 2, side * math.sqrt(3) / 2)]
    centers = np.array(pts)
    radii = np.ones(3)
    # Independent checks of the geometry.
    for i, j in itertools.combinations(range(3), 2):
        assert np.linalg.norm(centers[i] - centers[j]) < radii[i] + radii[j]
    assert side / math.sqrt(3) > 1.0
    assert _min_max_miss(centers, radii, -1.0, 3.0, 0.01) > 0.09
    nodes = _nodes([(pts[0], 1.0)], [(pts[1], 1.0)], [(pts[2], 1.0)])
    res = merge_layer(nodes, num_clusters=1, seed=0, method=method)
    _check_invariants(nodes, res)
    assert res.groups == [[(0, 0), (1, 0)], [(2, 0)]]
    assert res.num_intersected_groups == 1 and res.num_kept_alone == 1
    assert np.array_equal(res.weights[1], centers[2])


def test_three_disks_with_common_point_do_merge():
    """Side 1.7 < sqrt(3): the circumcenter is inside all three: one neuron."""
    side = 1.7
    pts = [(0.0, 0.0), (side, 0.0), (side / 2, side * math.sqrt(3) / 2)]
    assert _min_max_miss(np.array(pts), np.ones(3), -1.0, 3.0, 0.01) < 0
    nodes = _nodes([(pts[0], 1.0)], [(pts[1], 1.0)], [(pts[2], 1.0)])
    res = merge_layer(nodes, num_clusters=1, seed=0)
    _check_invariants(nodes, res)
    assert res.width == 1 and res.groups == [[(0, 0), (1, 0), (2, 0)]]


def test_high_dimensional_pairwise_overlap_without_common_point():
    """Five orthogonal neighbours: every pair and every triple meet, all five don't.

    Centers ``s * e_k`` in R^5, radius r: pairwise distance ``s sqrt 2``; the point
    nearest to all of them is their mean, at ``s sqrt(1 - 1/g)`` from each of ``g``
    centers. With r = 0.85 s: pairs (0.707 s) and triples (0.816 s) meet, four
    (0.866 s) do not, so the greedy groups are the first three and the last two.
    """
    s, r = 1.0, 0.85
    nodes = [(s * np.eye(5)[[k]], np.array([r])) for k in range(5)]
    for method in ("dual", "dykstra"):
        res = merge_layer(nodes, num_clusters=1, seed=0, method=method)
        _check_invariants(nodes, res)
        assert res.groups == [[(0, 0), (1, 0), (2, 0)], [(3, 0), (4, 0)]]
    # Independent check that the four don't meet: the nearest point to all four
    # centers (their mean, by symmetry) is farther than r from each of them.
    four = s * np.eye(5)[:4]
    assert np.linalg.norm(four.mean(axis=0) - four[0]) > r
    assert not find_intersection([Space(c, r) for c in four]).found


# --- unchanged, identical, one per node ----------------------------------------------


def test_non_intersecting_neurons_survive_unchanged():
    rng = np.random.default_rng(1)
    nodes = [(rng.normal(size=(6, 4)) * 100.0, np.full(6, 0.01)) for _ in range(3)]
    res = merge_layer(nodes, num_clusters=4, seed=0)
    _check_invariants(nodes, res)
    assert res.width == 18 and res.num_kept_alone == 18
    assert res.num_intersected_groups == 0
    # Output order: node 0's neurons, node 1's, node 2's.
    assert np.array_equal(res.weights, np.concatenate([c for c, _ in nodes]))
    assert res.groups == [[(k, i)] for k in range(3) for i in range(6)]


def test_identical_neurons_from_different_nodes_merge_into_one():
    w = np.array([[0.3, -1.2, 0.7, 0.05]])
    nodes = [(w.copy(), np.array([0.2])) for _ in range(4)]
    res = merge_layer(nodes, num_clusters=1, seed=0)
    _check_invariants(nodes, res)
    assert res.width == 1
    assert res.groups == [[(0, 0), (1, 0), (2, 0), (3, 0)]]
    assert np.allclose(res.weights[0], w[0], rtol=0, atol=1e-12)


def test_one_neuron_per_node_in_a_group():
    """Node 0 has two copies of the neuron that node 1 also has: two outputs."""
    w = [1.0, 2.0, 3.0]
    nodes = _nodes([(w, 0.5), (w, 0.5)], [(w, 0.5)])
    res = merge_layer(nodes, num_clusters=1, seed=0)
    _check_invariants(nodes, res)
    assert res.groups == [[(0, 0), (1, 0)], [(0, 1)]]


def test_radius_zero_neurons_merge_only_onto_their_center():
    x, y = [0.0, 0.0], [0.6, 0.0]
    # Point neuron x first (seed), then a ball around y containing x: merged at x.
    res = merge_layer(_nodes([(x, 0.0)], [(y, 1.0)]), num_clusters=1, seed=0)
    assert res.width == 1 and np.array_equal(res.weights[0], np.array(x))
    # The other way round (find_intersection decides): merged at x too.
    nodes = _nodes([(y, 1.0)], [(x, 0.0)])
    res = merge_layer(nodes, num_clusters=1, seed=0)
    _check_invariants(nodes, res)
    assert res.width == 1 and np.allclose(res.weights[0], x, atol=1e-12)
    # A ball not containing the point: nothing merges.
    nodes = _nodes([(x, 0.0)], [(y, 0.5)])
    res = merge_layer(nodes, num_clusters=1, seed=0)
    _check_invariants(nodes, res)
    assert res.width == 2


def test_merged_point_is_in_every_ball_of_its_group():
    rng = np.random.default_rng(7)
    protos = rng.normal(size=(5, 30))
    nodes = []
    for _ in range(6):
        centers = protos[rng.integers(0, 5, 15)] + 0.1 * rng.normal(size=(15, 30))
        nodes.append((centers, rng.uniform(0.2, 0.8, 15)))
    for method in ("dual", "dykstra"):
        res = merge_layer(nodes, num_clusters=6, seed=0, method=method)
        _check_invariants(nodes, res)  # includes Space.contains for every member
        assert res.num_intersected_groups > 0
        assert res.to_dict()["largest_group"] >= 3


# --- model size: eps, m_eps and the width --------------------------------------------


def _random_layer(seed, scale):
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(4, 3))
    nodes = []
    for _ in range(int(rng.integers(2, 6))):
        h = int(rng.integers(2, 8))
        centers = protos[rng.integers(0, 4, h)] + 0.5 * rng.normal(size=(h, 3))
        nodes.append((centers, scale * rng.uniform(0.2, 1.0, h)))
    return nodes


@pytest.mark.parametrize("seed", range(12))
def test_width_bounds_across_radius_scales(seed):
    """What is true for every eps: L <= width <= N, with both ends attained.

    ``L = sum over clusters of max_k n_{c,k}`` (groups hold one neuron per node). At
    radius 0 with distinct centers nothing merges (width N); with radii larger than
    every cluster's diameter every candidate joins and the width is exactly L.
    """
    widths = []
    for scale in (0.0, 0.3, 1.0, 3.0, 1e6):
        nodes = _random_layer(seed, scale)
        res = merge_layer(nodes, num_clusters=3, seed=0)
        _check_invariants(nodes, res)
        widths.append((res.width, _width_lower_bound(nodes, res), res.num_inputs))
    assert widths[0][0] == widths[0][2]  # radius 0: nothing merges
    assert widths[-1][0] == widths[-1][1]  # huge radii: the lower bound L
    assert all(lo <= w <= n for w, lo, n in widths)


def test_larger_eps_can_widen_the_greedy_layer():
    """Larger balls (larger eps) do NOT always give a narrower layer.

    Node 0 has A0 = (-1.4, -0.5) and A1 = (0.5, 1.3), node 1 has B = (-0.9, 1.3),
    node 2 has C = (-1.1, -1.8). At scale 1 (radii 0.5, 1.0, 1.1, 0.9) the seed A0
    cannot reach B (1.87 > 1.6) and takes C; A1 takes B: width 2. At scale 1.5 A0 now
    reaches B (1.87 <= 2.4) and takes it first (nearest); C is then blocked
    (|B - C| = 3.11 > 3.0), and A1 has no partner left: width 3. The true relation is
    the bound ``L <= width <= N`` (test above), plus "usually narrower": widening is
    rare on random layers (2 of 300 small random layers over radius scales 0 to 100
    when this was written; none of the 40 checked below).
    """
    def layer(scale):
        return _nodes(
            [((-1.4, -0.5), 0.5 * scale), ((0.5, 1.3), 1.0 * scale)],
            [((-0.9, 1.3), 1.1 * scale)],
            [((-1.1, -1.8), 0.9 * scale)],
        )

    small = merge_layer(layer(1.0), num_clusters=1, seed=0)
    large = merge_layer(layer(1.5), num_clusters=1, seed=0)
    _check_invariants(layer(1.0), small)
    _check_invariants(layer(1.5), large)
    assert small.groups == [[(0, 0), (2, 0)], [(0, 1), (1, 0)]]
    assert large.groups == [[(0, 0), (1, 0)], [(0, 1)], [(2, 0)]]
    assert large.width > small.width
    # Rare on random layers: few non-monotone sequences over 40 layers.
    widened = 0
    for seed in range(40):
        ws = [
            merge_layer(_random_layer(seed, s), num_clusters=2, seed=0).width
            for s in (0.5, 1.0, 2.0)
        ]
        widened += any(b > a for a, b in zip(ws, ws[1:]))
    assert widened <= 4


def test_each_nonempty_cluster_yields_an_output_neuron():
    """width >= non-empty clusters; with huge radii it equals sum_c max_k n_{c,k}."""
    rng = np.random.default_rng(11)
    nodes = [(rng.normal(size=(10, 5)), np.full(10, 1e6)) for _ in range(3)]
    for m in (1, 4, 10, 30):
        res = merge_layer(nodes, num_clusters=m, seed=0)
        _check_invariants(nodes, res)
        assert res.width >= res.num_nonempty_clusters
        assert res.width == _width_lower_bound(nodes, res)
    # m_eps capped at N.
    res = merge_layer(nodes, num_clusters=1000, seed=0)
    assert res.num_clusters == 1000 and res.num_clusters_used == 30


# --- determinism, dict, validation ---------------------------------------------------


def test_deterministic_for_a_seed():
    nodes = _random_layer(3, 1.0)
    a = merge_layer(nodes, num_clusters=3, seed=4)
    b = merge_layer(nodes, num_clusters=3, seed=4)
    assert np.array_equal(a.weights, b.weights)
    assert a.groups == b.groups and a.group_clusters == b.group_clusters
    assert a.to_dict() == b.to_dict()


def test_to_dict_is_json_friendly_counts():
    import json

    res = merge_layer(_random_layer(2, 1.0), num_clusters=2, seed=0)
    d = res.to_dict()
    json.dumps(d)
    assert all(isinstance(v, int) for v in d.values())
    assert d["width"] == res.width and d["clusters_visited"] == res.clusters_visited


@pytest.mark.parametrize(
    "nodes, kwargs, exc, match",
    [
        ([], {}, ValueError, "empty"),
        ([(np.zeros((2, 3)), np.ones(2)), (np.zeros((2, 4)), np.ones(2))], {},
         ValueError, "d=4"),
        ([(np.zeros((2, 3)), np.array([1.0, -0.1]))], {}, ValueError, ">= 0"),
        ([(np.zeros((2, 3)), np.array([1.0, np.nan]))], {}, ValueError, "non-finite"),
        ([(np.array([[0.0, np.inf, 0.0]]), np.ones(1))], {}, ValueError, "non-finite"),
        ([(np.zeros((2, 3)), np.ones(3))], {}, ValueError, "one radius per neuron"),
        ([(np.zeros(3), np.ones(1))], {}, ValueError, "2-D"),
        ([(np.zeros((0, 3)), np.ones(0))], {}, ValueError, "no neurons"),
        ([(np.zeros((2, 3)), np.ones(2))], {"num_clusters": 0}, ValueError, ">= 1"),
        ([(np.zeros((2, 3)), np.ones(2))], {"num_clusters": 1.5}, TypeError, "int"),
        ([(np.zeros((2, 3)), np.ones(2))], {"method": "x"}, ValueError, "method"),
        ([np.zeros((3, 3))], {}, TypeError, "pair"),
    ],
)
def test_input_validation(nodes, kwargs, exc, match):
    kw = {"num_clusters": 1, "seed": 0, **kwargs}
    with pytest.raises(exc, match=match):
        merge_layer(nodes, **kw)


# --- the closed-form tests against independent checks --------------------------------


def test_three_balls_meet_matches_a_grid_search():
    """Against an independent grid search of min_w max_k (||w - c_k|| - r_k) in 2-D.

    Near-equilateral triples with radii around the circumradius give both answers,
    including many that overlap pairwise without a common point.
    """
    rng = np.random.default_rng(0)
    base = np.array([[0.0, 0.0], [1.8, 0.0], [0.9, 1.8 * math.sqrt(3) / 2]])
    step = 0.02
    meets = disjoint_pairwise = 0
    for _ in range(100):
        centers = base + 0.25 * rng.normal(size=(3, 2))
        radii = rng.uniform(0.85, 1.25, size=3)
        d2, err2 = squared_distances(centers)
        meet = bool(
            three_balls_meet(
                d2[0, 1], d2[0, 2], d2[1, 2], radii[0], radii[1], radii[2],
                err2.max(),
            )
        )
        truth = _min_max_miss(centers, radii, -1.5, 3.5, step)
        if truth < -step:  # clearly meet (grid point inside all): must say so
            assert meet
            meets += 1
        elif truth > step:  # clearly no common point
            pairwise = all(
                np.linalg.norm(centers[i] - centers[j]) <= radii[i] + radii[j]
                for i, j in itertools.combinations(range(3), 2)
            )
            if pairwise:  # the case the test exists for: exact when not collinear
                assert not meet
                disjoint_pairwise += 1
    assert meets > 10 and disjoint_pairwise > 5


def test_ball_dual_agrees_with_find_intersection():
    """'empty' is never wrong, and a 'point' is inside every ball."""
    rng = np.random.default_rng(1)
    verdicts = []
    for _ in range(80):
        g, d = int(rng.integers(2, 7)), int(rng.integers(2, 12))
        centers = rng.normal(size=(g, d))
        radii = math.sqrt(d) * rng.uniform(0.6, 1.2, size=g)
        d2, err2 = squared_distances(centers)
        lam0 = np.zeros(g)
        lam0[0] = 1.0
        verdict, lam, _ = ball_dual(d2, radii**2, lam0, float(err2.max()), 5000)
        verdicts.append(verdict)
        spaces = [Space(c, r) for c, r in zip(centers, radii)]
        if verdict == "point":
            w = lam @ centers
            assert all(s.contains(w) for s in spaces)
        elif verdict == "empty":
            res = find_intersection(spaces, max_iter=2000, fallback="mean")
            assert not res.found
    assert verdicts.count("point") > 10 and verdicts.count("empty") > 10


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    seed=st.integers(0, 10_000),
    num_nodes=st.integers(1, 5),
    max_h=st.integers(1, 6),
    d=st.integers(1, 6),
    m=st.integers(1, 6),
    scale=st.sampled_from([0.0, 0.2, 0.7, 2.0]),
)
def test_invariants_on_random_layers(seed, num_nodes, max_h, d, m, scale):
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(3, d))
    nodes = []
    for _ in range(num_nodes):
        h = int(rng.integers(0, max_h + 1))
        centers = protos[rng.integers(0, 3, h)] + 0.4 * rng.normal(size=(h, d))
        radii = scale * rng.uniform(0.0, 1.0, h)
        radii[rng.random(h) < 0.1] = 0.0
        nodes.append((centers.reshape(h, d), radii))
    if sum(len(r) for _, r in nodes) == 0:
        nodes[0] = (protos[:1].copy(), np.array([scale]))
    res = merge_layer(nodes, num_clusters=m, seed=seed % 7)
    _check_invariants(nodes, res)


def _in_some_ball(row, nodes) -> bool:
    return any(np.any(np.linalg.norm(c - row, axis=1) <= r * (1 + 1e-9) + 1e-12)
               for c, r in nodes)


def test_bound_width_keeps_verified_groups_and_represents_the_rest_by_their_own_neurons():
    from gems_fl.geometry.layer_merge import bound_width

    rng = np.random.default_rng(3)
    shared = rng.standard_normal((4, 6))
    nodes = []
    for k in range(3):  # 4 neurons every node shares (big radii) + 10 of its own
        own = rng.standard_normal((10, 6)) * 5 + 20 * k
        centers = np.concatenate([shared + 1e-3 * k, own])
        radii = np.concatenate([np.full(4, 0.5), np.full(10, 1e-3)])
        nodes.append((centers, radii))
    merged = merge_layer(nodes, num_clusters=6, seed=0)
    assert merged.num_intersected_groups >= 1 and merged.num_kept_alone >= 30
    weights, report = bound_width(merged, 12, seed=0)
    groups = np.array([len(g) for g in merged.groups])
    assert len(weights) == 12 == report["width"]
    # every output neuron is a row of the merged layer, so it lies in a node's ball
    rows = {tuple(r) for r in merged.weights}
    assert all(tuple(r) in rows for r in weights)
    assert all(_in_some_ball(r, nodes) for r in weights)
    for kept in merged.weights[groups > 1]:  # verified groups all fit and stay
        assert any(np.array_equal(kept, r) for r in weights)
    assert report["kept_alone"] == merged.num_kept_alone and report["unverified"] == 0
    assert report["reduced_to"] == 12 - int(np.sum(groups > 1))
    assert report["dropped"] == merged.num_kept_alone - report["reduced_to"]
    same, report = bound_width(merged, merged.width, seed=0)
    assert same is merged.weights and report["unverified"] == 0 and report["dropped"] == 0
    # Fewer rows than verified groups: the largest group stays, the rest get one medoid.
    tight, report = bound_width(merged, 2, seed=0)
    largest = merged.weights[int(np.argmax(groups))]
    assert len(tight) == 2 and report["width"] == 2
    assert any(np.array_equal(largest, r) for r in tight)
    assert all(_in_some_ball(r, nodes) for r in tight)
    assert report["unverified"] == 0 and report["reduced_to"] == 1
    assert report["groups_reduced"] == merged.num_intersected_groups - 1
    with pytest.raises((TypeError, ValueError)):
        bound_width(merged, 0, seed=0)


def test_max_width_bounds_the_merged_layer_and_the_downlink_is_float32(tmp_path):
    from tests.helpers import run_in_process

    results, grid = run_in_process(3, tmp_path, model="mlp", return_grid=True,
                                   **{"max-width": 40, "label-division": "classes-per-node:4",
                                      "public-samples": 0})
    layer = results["rounds"][0]
    assert layer["width"] <= 40 and results["hidden_widths"] == [layer["width"]]
    bound = layer["merge"]["max_width"]
    assert bound["unverified"] == 0 and bound["dropped"] > 0
    # Round 2 carries the merged layer in float32: 4 bytes per weight.
    down = [e for e in grid.exchanges if e["type"] == "train"][1]["down"]
    assert down < 3 * layer["width"] * 65 * 8
