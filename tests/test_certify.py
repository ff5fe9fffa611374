"""Certified radii (gems_fl.geometry.certify) and the one eps rule (gems_fl.geometry.eps).

A model strictly inside a certified radius keeps validation accuracy >= eps whatever the
direction; on problems where the bound is tight (the validation inputs, with their bias
1, orthogonal for the ball, linearly independent for the Gram metric) a model built to
flip the cheapest samples just outside the radius drops below eps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gems_fl.geometry.certify import certified_radius, certified_radius_in_metric, flips_needed
from gems_fl.geometry.eps import check_eps, pass_count, passes
from gems_fl.geometry.gram import gram_distance, gram_matrix

# ---- the eps rule -----------------------------------------------------------------------


@pytest.mark.parametrize("eps, num, need", [(0.7, 10, 7), (0.4, 1000, 400), (0.0, 5, 0),
                                            (1.0, 5, 5), (0.5, 3, 2), (1 / 3, 3, 1)])
def test_pass_count_at_its_boundaries(eps, num, need):
    assert pass_count(eps, num) == need
    assert passes(need, num, eps)
    assert need == 0 or not passes(need - 1, num, eps)


@given(st.floats(0.0, 1.0), st.integers(1, 5000))
def test_pass_count_is_the_float_accuracy_rule(eps, num):
    # "correct / num >= eps", as every search compares accuracies, decided on counts
    k = pass_count(eps, num)
    assert k == next(c for c in range(num + 2) if c > num or c / num >= eps)


@given(st.floats(0.0, 1.0), st.integers(1, 300), st.data())
def test_flips_needed_is_the_smallest_drop_below_eps(eps, num, data):
    correct = data.draw(st.integers(0, num))
    f = flips_needed(correct, num, eps)
    if correct / num < eps:
        assert f == 0
    elif f <= correct:
        assert (correct - f) / num < eps <= (correct - f + 1) / num
    else:  # eps == 0: no number of flips goes below it
        assert eps == 0.0


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "high"])
def test_eps_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="eps is the minimum accuracy"):
        check_eps(bad)


# ---- problems ---------------------------------------------------------------------------


def _accuracy(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    z = np.hstack([x, np.ones((len(x), 1))]) @ w.T
    true = z[np.arange(len(y)), y]
    z[np.arange(len(y)), y] = -np.inf
    return float(np.mean(true >= z.max(axis=1)))  # ties count as correct


def _margins(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's margin and its runner-up class."""
    z = np.hstack([x, np.ones((len(x), 1))]) @ w.T
    true = z[np.arange(len(y)), y].copy()
    z[np.arange(len(y)), y] = -np.inf
    return true - z.max(axis=1), z.argmax(axis=1)


def _orthogonal_inputs(num: int, rng: np.random.Generator) -> np.ndarray:
    """``num`` inputs whose augmented rows ``[x, 1]`` are pairwise orthogonal: the
    vertices of a regular simplex centred at 0 with ``x_i . x_j = -1`` (dimension num - 1),
    rotated at random and padded with one unused feature."""
    e = np.eye(num) - 1.0 / num  # centred simplex vertices, |v|^2 = (n-1)/n
    basis = np.linalg.svd(e)[2][: num - 1]  # orthonormal basis of their span
    x = (e @ basis.T) * math.sqrt(num)  # x_i . x_j = -1, |x_i|^2 = n - 1
    rot = np.linalg.qr(rng.normal(size=(num - 1, num - 1)))[0]
    return np.hstack([x @ rot, np.zeros((num, 1))])


problem = st.tuples(st.integers(3, 7), st.integers(2, 4), st.integers(0, 2**31 - 1))


def _labelled(num: int, classes: int, seed: int, x: np.ndarray):
    """A center, labels it gets mostly right, and the eps at which one flip fails it."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(classes, x.shape[1] + 1))
    z = np.hstack([x, np.ones((num, 1))]) @ w.T
    y = z.argmax(axis=1)
    y[0] = (y[0] + 1) % classes  # one wrong sample: flips must come from the correct ones
    correct = int(round(_accuracy(w, x, y) * num))
    return w, y, correct / num


# ---- balls: sound, and tight on orthogonal inputs ---------------------------------------


@settings(max_examples=60, deadline=None)
@given(problem)
def test_ball_certified_radius_is_sound_and_tight(args):
    num, classes, seed = args
    x = _orthogonal_inputs(num, np.random.default_rng(seed))
    w, y, eps = _labelled(num, classes, seed, x)
    radius = certified_radius(w, x, y, eps)
    if radius == 0.0 or not math.isfinite(radius):
        return
    margin, runner = _margins(w, x, y)
    xa = np.hstack([x, np.ones((num, 1))])
    # the cheapest sample to flip: t_n = m_n / (sqrt(2) |x~_n|)
    t = np.where(margin >= 0, margin / (math.sqrt(2) * np.linalg.norm(xa, axis=1)), np.inf)
    n = int(np.argmin(t))
    assert math.isclose(t[n], radius, rel_tol=1e-12)
    direction = np.zeros_like(w)
    direction[runner[n]] += xa[n] / np.linalg.norm(xa[n]) / math.sqrt(2)
    direction[y[n]] -= xa[n] / np.linalg.norm(xa[n]) / math.sqrt(2)  # unit Frobenius norm
    assert _accuracy(w + (1 + 1e-6) * radius * direction, x, y) < eps  # just outside: fails
    assert _accuracy(w + (1 - 1e-6) * radius * direction, x, y) >= eps  # just inside: holds
    rng = np.random.default_rng(seed + 1)
    for u in rng.normal(size=(200, *w.shape)):
        assert _accuracy(w + (1 - 1e-9) * radius * u / np.linalg.norm(u), x, y) >= eps


@settings(max_examples=40, deadline=None)
@given(problem, st.floats(0.05, 1.0))
def test_ellipsoid_certified_radius_is_sound(args, floor):
    num, classes, seed = args
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3 * num, 4))
    w, y, eps = _labelled(3 * num, classes, seed, x)
    axes = rng.uniform(floor, 1.0, size=w.shape)
    radius = certified_radius(w, x, y, eps, axes)
    if radius == 0.0 or not math.isfinite(radius):
        return
    for u in rng.normal(size=(300, *w.shape)):
        # the ellipsoid's surface: w + axes * U with |U| = radius (just inside)
        assert _accuracy(w + axes * ((1 - 1e-9) * radius * u / np.linalg.norm(u)), x, y) >= eps


# ---- Gram metric: tight on linearly independent inputs ----------------------------------


@settings(max_examples=60, deadline=None)
@given(problem, st.data())
def test_gram_certified_radius_is_sound_and_tight(args, data):
    num, classes, seed = args
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, num + 2))  # N <= d + 1: the rows [x, 1] are independent
    w, y, _ = _labelled(num, classes, seed, x)
    correct = int(round(_accuracy(w, x, y) * num))
    need = data.draw(st.integers(1, correct))
    eps = need / num  # flips_needed = correct - need + 1 samples must flip
    rho = certified_radius_in_metric(w, x, y, eps)
    margin, runner = _margins(w, x, y)
    f = flips_needed(correct, num, eps)
    cheapest = [n for n in np.argsort(np.where(margin >= 0, margin, np.inf))][:f]
    assert math.isclose(rho, math.sqrt(sum(margin[n] ** 2 / 2 for n in cheapest) / num),
                        rel_tol=1e-12)
    xa = np.hstack([x, np.ones((num, 1))])
    g_val = gram_matrix(x)

    def attack(scale: float) -> np.ndarray:
        # logit changes (N, C): move the f cheapest samples half their margin each way
        target = np.zeros((num, classes))
        for n in cheapest:
            target[n, runner[n]] += scale * margin[n] / 2
            target[n, y[n]] -= scale * margin[n] / 2
        return target.T @ np.linalg.pinv(xa).T  # D with D x~_n = target_n exactly

    outside, inside = w + attack(1 + 1e-6), w + attack(1 - 1e-6)
    assert math.isclose(gram_distance(outside, w, g_val), (1 + 1e-6) * rho, rel_tol=1e-6)
    assert _accuracy(outside, x, y) < eps
    assert _accuracy(inside, x, y) >= eps
    for u in rng.normal(size=(200, *w.shape)):
        d = gram_distance(w + u, w, g_val)
        if d > 0:
            assert _accuracy(w + (1 - 1e-9) * rho / d * u, x, y) >= eps


def test_a_center_that_fails_eps_has_radius_0_and_eps_0_has_no_bound():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(10, 3))
    w = rng.normal(size=(3, 4))
    y = (np.hstack([x, np.ones((10, 1))]) @ w.T).argmin(axis=1)  # all wrong
    assert certified_radius(w, x, y, 0.5) == 0.0
    assert certified_radius_in_metric(w, x, y, 0.5) == 0.0
    assert certified_radius(w, x, y, 0.0) == math.inf


def test_a_zero_radius_is_explained_by_what_caused_it():
    """Radius 0 means the node's model fails its eps, or passes it with no room: the
    note says which (a node with one validation row and accuracy 1.000 is the second)."""
    from gems_fl.geometry.eps import zero_radius_reason

    assert "0.300 < its eps=0.4" in zero_radius_reason(0.3, 0.4)
    passing = zero_radius_reason(1.0, 0.4)
    assert "passes its eps=0.4" in passing and "<" not in passing
    assert "not reported" in zero_radius_reason(0.5, None)
