"""Logit-space (Gram) good-enough spaces: packing, validation, sampling, the radius
search, the certified radius, and the server's closed-form and minimax points."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gems_fl.geometry.certify import certified_gram_radius, certified_radius_in_metric
from gems_fl.geometry.eps import pass_count
from gems_fl.geometry.gram import (
    check_gram,
    from_factor,
    gram_distance,
    gram_distances,
    gram_matrix,
    low_rank_factor,
    pack_triangle,
    relative_error,
    unpack_triangle,
)
from gems_fl.geometry.gram_merge import gram_center, membership, minimax_gram_point
from gems_fl.geometry.gram_search import DEFAULT_R_MAX, sample_gram_directions, search_gram_radius


def _aug(x):
    return np.c_[x, np.ones(len(x))]


def _accuracies(center, directions, radius, x, y):
    """Reference: evaluate every perturbed model explicitly (argmax of its logits)."""
    xa = _aug(x)
    models = center[None] + radius * directions  # (p, C, n)
    logits = np.einsum("nd,pcd->pnc", xa, models)
    return (logits.argmax(axis=2) == y[None]).mean(axis=1)


@pytest.fixture(scope="module")
def problem():
    """A linear problem with a noisy-label trained-ish model; G from training inputs."""
    rng = np.random.default_rng(0)
    d, c = 12, 4
    w_true = rng.normal(size=(c, d + 1))
    x_tr, x_val = rng.normal(size=(600, d)), rng.normal(size=(300, d))

    def labels(x):
        y = (_aug(x) @ w_true.T).argmax(1)
        flip = rng.random(len(x)) < 0.15
        y[flip] = rng.integers(0, c, flip.sum())
        return y

    y_tr, y_val = labels(x_tr), labels(x_val)
    # Least squares on one-hot targets: a "trained-ish" softmax layer.
    center = np.linalg.lstsq(_aug(x_tr), np.eye(c)[y_tr] * 4 - 2, rcond=None)[0].T
    return {"center": center, "g": gram_matrix(x_tr), "x_tr": x_tr, "x_val": x_val,
            "y_val": y_val}


# ------------------------------------------------------------------ Gram, packing


def test_gram_matrix_is_mean_of_outer_products():
    x = np.random.default_rng(1).normal(size=(7, 3))
    ref = sum(np.outer(v, v) for v in _aug(x)) / 7
    g = gram_matrix(x)
    np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-12)
    assert g[-1, -1] == 1.0 and np.array_equal(g, g.T)


def test_pack_unpack_roundtrip(problem):
    g = problem["g"]
    vec = pack_triangle(g)
    assert vec.dtype == np.float32 and vec.shape == (13 * 14 // 2,)
    back = unpack_triangle(vec, 13)
    assert back.dtype == np.float64 and np.array_equal(back, back.T)
    np.testing.assert_allclose(back, g, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(unpack_triangle(vec), back)  # n inferred
    with pytest.raises(ValueError, match="entries"):
        unpack_triangle(vec[:-1], 13)


def test_low_rank_factor_exact_at_full_rank_and_best_below(problem):
    g = problem["g"]
    f = low_rank_factor(g, 13)
    assert f.dtype == np.float32 and f.shape == (13, 13)
    assert relative_error(g, from_factor(f)) < 1e-6
    lam = np.linalg.eigvalsh(g)
    err3 = relative_error(g, from_factor(low_rank_factor(g, 3)))
    # Eckart-Young: the Frobenius error of the best rank-3 approximation.
    np.testing.assert_allclose(err3, np.sqrt((lam[:-3] ** 2).sum() / (lam ** 2).sum()),
                               rtol=1e-5)


def test_check_gram_accepts_float32_packed_rank_deficient():
    x = np.random.default_rng(2).random((30, 80))  # N < d + 1: singular Gram
    g = unpack_triangle(pack_triangle(gram_matrix(x)), 81)
    out = check_gram(g, 81, unit_bias_tol=1e-5)
    assert out.shape == (81, 81)
    check_gram(from_factor(low_rank_factor(gram_matrix(x), 10)), 81)


@pytest.mark.parametrize("bad, match", [
    ("shape", "shape"),
    ("nan", "NaN"),
    ("asym", "not symmetric"),
    ("neg", "not positive semidefinite"),
    ("bias", "bias entry"),
])
def test_check_gram_rejects(problem, bad, match):
    g = problem["g"].copy()
    if bad == "shape":
        g = g[:-1]
    elif bad == "nan":
        g[2, 3] = np.nan
    elif bad == "asym":
        g[0, 1] += 1e-3
    elif bad == "neg":
        v = np.linalg.eigh(g)[1][:, 0]
        g = g - 5.0 * np.outer(v, v)
    elif bad == "bias":
        g = g * 10
    with pytest.raises(ValueError, match=match):
        check_gram(g, 13, unit_bias_tol=1e-4)


# --------------------------------------------------------------------- distances


def test_gram_distance_is_rms_logit_change(problem):
    rng = np.random.default_rng(3)
    w = problem["center"] + rng.normal(size=problem["center"].shape)
    change = _aug(problem["x_tr"]) @ (w - problem["center"]).T
    rms = np.sqrt((change ** 2).sum(1).mean())
    assert gram_distance(w, problem["center"], problem["g"]) == pytest.approx(rms, rel=1e-10)
    stack = np.stack([w, problem["center"], 2 * w - problem["center"]])
    np.testing.assert_allclose(gram_distances(stack, problem["center"], problem["g"]),
                               [rms, 0.0, 2 * rms], rtol=1e-10)


# -------------------------------------------------------------------- directions


def test_directions_unit_in_metric_and_in_range():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 9))  # rank 6 < n = 10
    g = gram_matrix(x)
    d = sample_gram_directions(50, (3, 10), g, seed=7)
    assert d.shape == (50, 3, 10)
    np.testing.assert_allclose(gram_distances(d, np.zeros((3, 10)), g), 1.0, rtol=1e-9)
    null = np.linalg.eigh(g)[1][:, :4]  # the 4 null eigenvectors
    assert np.abs(d @ null).max() < 1e-8 * np.abs(d).max()
    np.testing.assert_array_equal(d, sample_gram_directions(50, (3, 10), g, seed=7))
    assert not np.allclose(d, sample_gram_directions(50, (3, 10), g, seed=8))


# ------------------------------------------------------------------ radius search


def test_search_radius_brackets_failure_and_matches_explicit_models(problem):
    p = problem
    eps = 0.6
    res = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], eps=eps,
                             num_directions=200, delta=0.01, seed=5)
    assert res.center_passes and not res.saturated and 0 < res.radius < DEFAULT_R_MAX
    assert 0 < res.failed_radius - res.radius <= 0.01 and res.rank == 13
    dirs = sample_gram_directions(200, p["center"].shape, p["g"], seed=5)
    at = _accuracies(p["center"], dirs, res.radius, p["x_val"], p["y_val"])
    assert at.min() >= eps and at.min() == pytest.approx(res.min_accuracy_at_radius)
    above = _accuracies(p["center"], dirs, res.failed_radius, p["x_val"], p["y_val"])
    assert above.min() < eps


def test_search_deterministic_and_seed_dependent(problem):
    p = problem
    kw = {"eps": 0.6, "num_directions": 100, "seed": 9}
    a = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], **kw)
    b = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], **kw)
    assert a == b
    c = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], **{**kw, "seed": 10})
    assert c.radius != a.radius


def test_search_center_failing_and_saturation(problem):
    p = problem
    fail = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], eps=0.99,
                              num_directions=20)
    assert fail.radius == 0.0 and not fail.center_passes and fail.steps == 0
    sat = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], eps=0.0,
                             num_directions=20, r_max=5.0)
    assert sat.saturated and sat.radius == 5.0
    with pytest.raises(ValueError, match="shape"):
        search_gram_radius(p["center"][:, :-1], p["g"], p["x_val"], p["y_val"], eps=0.5)


def test_search_not_below_certified_radius(problem):
    p = problem
    cert = certified_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], 0.6,
                                 within_range=True)
    res = search_gram_radius(p["center"], p["g"], p["x_val"], p["y_val"], eps=0.6,
                             num_directions=100, seed=1)
    assert 0 < cert and res.radius >= cert - 0.01


# -------------------------------------------------------------- certified radius


def test_pass_count_float_edge():
    assert pass_count(0.7, 10) == 7  # 0.7 * 10 == 7.000000000000001
    assert pass_count(0.0, 10) == 0 and pass_count(1.0, 10) == 10
    assert pass_count(0.41, 100) == 41 and pass_count(0.405, 100) == 41


@pytest.fixture(scope="module")
def small_val():
    """N = 15 validation samples in d + 1 = 21 dimensions: the x~ are independent."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(15, 20))
    w = rng.normal(size=(4, 21))
    y = (_aug(x) @ w.T).argmax(1)
    y[:2] = (y[:2] + 1) % 4  # two wrong samples
    return w, x, y


def _cheapest_flip(w, x, y, subset, scale):
    """Minimum-norm D moving each sample in ``subset`` by ``scale * m_n / sqrt(2)``
    toward its runner-up class, and no other sample's logits at all."""
    xa = _aug(x)
    z = xa @ w.T
    targets = np.zeros_like(z)
    for n in subset:
        others = z[n].copy()
        others[y[n]] = -np.inf
        c = others.argmax()
        half = scale * (z[n, y[n]] - z[n, c]) / 2
        targets[n, y[n]], targets[n, c] = -half, half
    return np.linalg.lstsq(xa, targets, rcond=None)[0].T  # D xa^T = targets^T


def test_certified_radius_sound_on_both_sides(small_val):
    w, x, y = small_val
    eps = 0.6  # 13 correct of 15; below eps means <= 8 correct: flip 5
    rho = certified_radius_in_metric(w, x, y, eps)
    g_val = gram_matrix(x)
    z = _aug(x) @ w.T
    margin = z[np.arange(15), y] - np.where(np.eye(4)[y] > 0, -np.inf, z).max(1)
    correct = np.flatnonzero(margin >= 0)
    assert len(correct) == 13 and pass_count(eps, 15) == 9
    cheapest = correct[np.argsort(margin[correct])][:5]
    assert rho == pytest.approx(math.sqrt((margin[cheapest] ** 2 / 2).sum() / 15), rel=1e-12)

    def acc(d):
        return ((_aug(x) @ (w + d).T).argmax(1) == y).mean()

    above = _cheapest_flip(w, x, y, cheapest, 1 + 1e-6)
    below = _cheapest_flip(w, x, y, cheapest, 1 - 1e-6)
    assert gram_distance(w + above, w, g_val) == pytest.approx(rho * (1 + 1e-6), rel=1e-9)
    assert acc(above) < eps <= acc(below)
    # Any other subset of 5 flips, scaled down to the certified size, flips nothing enough.
    rng = np.random.default_rng(7)
    for _ in range(50):
        sub = rng.choice(correct, 5, replace=False)
        d = _cheapest_flip(w, x, y, sub, 1.0)
        d *= rho * (1 - 1e-6) / gram_distance(w + d, w, g_val)
        assert acc(d) >= eps
    # Random directions at the certified size.
    dirs = sample_gram_directions(2000, w.shape, g_val, seed=3)
    assert _accuracies(w, dirs, rho * (1 - 1e-6), x, y).min() >= eps


def test_certified_radius_in_other_metric_is_sound(small_val, problem):
    w, x, y = small_val
    rho_val = certified_radius_in_metric(w, x, y, 0.6)
    assert certified_gram_radius(w, None, x, y, 0.6) == rho_val
    assert certified_gram_radius(w, gram_matrix(x), x, y, 0.6) == pytest.approx(rho_val)
    # A training Gram from other (smaller) inputs, so that mu > 1: every perturbation
    # that pushes accuracy below eps must be longer than the converted radius in the G
    # metric. Check the minimum-G-norm flip of many 5-sample subsets (other samples'
    # logits held fixed): D = T^T (Xa G^-1 Xa^T)^-1 Xa G^-1.
    g = gram_matrix(np.random.default_rng(8).normal(size=(200, 20)) * 0.3)
    rho_g = certified_gram_radius(w, g, x, y, 0.6)
    assert 0 < rho_g < rho_val
    xa = _aug(x)
    z = xa @ w.T
    margin = z[np.arange(15), y] - np.where(np.eye(4)[y] > 0, -np.inf, z).max(1)
    correct = np.flatnonzero(margin >= 0)
    ginv_xt = np.linalg.solve(g, xa.T)
    rng = np.random.default_rng(9)
    lengths = []
    for _ in range(200):
        sub = rng.choice(correct, 5, replace=False)
        t = _aug(x) @ _cheapest_flip(w, x, y, sub, 1 + 1e-9).T  # target logit changes
        d = t.T @ np.linalg.solve(xa @ ginv_xt, ginv_xt.T)
        assert ((xa @ (w + d).T).argmax(1) == y).mean() < 0.6
        lengths.append(gram_distance(w + d, w, g))
    assert min(lengths) > rho_g
    dirs = sample_gram_directions(2000, w.shape, g, seed=4)
    assert _accuracies(w, dirs, rho_g * (1 - 1e-9), x, y).min() >= 0.6
    # A training Gram blind to a feature the validation inputs use: no sound radius
    # for the whole (unbounded) ellipsoid, but one within G's range.
    x_tr = np.random.default_rng(10).normal(size=(200, 20))
    x_tr[:, 3] = 0.0
    assert certified_gram_radius(w, gram_matrix(x_tr), x, y, 0.6) == 0.0
    assert certified_gram_radius(w, gram_matrix(x_tr), x, y, 0.6, within_range=True) > 0


def test_certified_radius_edge_cases(small_val):
    w, x, y = small_val
    assert certified_radius_in_metric(w, x, y, 0.95) == 0.0  # center fails
    assert certified_radius_in_metric(w, x, y, 0.0) == math.inf


# -------------------------------------------------------------------- server side


def _objective(w, centers, grams, weights, ridge):
    return sum(lam * np.trace((w - c) @ g @ (w - c).T)
               for c, g, lam in zip(centers, grams, weights)) + ridge * (w ** 2).sum()


def test_gram_center_equals_direct_least_squares():
    rng = np.random.default_rng(10)
    cls, n, k = 3, 6, 4
    centers = [rng.normal(size=(cls, n)) for _ in range(k)]
    grams = [gram_matrix(rng.normal(size=(4, n - 1))) for _ in range(k)]  # each singular
    counts = [4.0, 10.0, 1.0, 7.0]
    ridge = 0.05
    w = gram_center(centers, grams, counts, ridge)
    # Stacked least squares: rows sqrt(l_k) G_k^(1/2) (w - W_k)^T, plus sqrt(ridge) w^T.
    lw = np.array(counts) / sum(counts)
    blocks, rhs = [], []
    for c, g, share in zip(centers, grams, lw):
        lam, v = np.linalg.eigh(g)
        half = (v * np.sqrt(lam.clip(0))) @ v.T
        blocks.append(np.sqrt(share) * half)
        rhs.append(np.sqrt(share) * half @ c.T)
    blocks.append(np.sqrt(ridge) * np.eye(n))
    rhs.append(np.zeros((n, cls)))
    direct = np.linalg.lstsq(np.vstack(blocks), np.vstack(rhs), rcond=None)[0].T
    np.testing.assert_allclose(w, direct, rtol=1e-9, atol=1e-10)
    base = _objective(w, centers, grams, lw, ridge)
    for _ in range(5):
        assert _objective(w + 1e-3 * rng.normal(size=w.shape), centers, grams, lw, ridge) > base


def test_gram_center_singular_without_ridge_is_min_norm():
    rng = np.random.default_rng(11)
    x1, x2 = rng.normal(size=(20, 4)), rng.normal(size=(20, 4))
    x1[:, 2] = x2[:, 2] = 0.0  # feature 2 never varies: sum of Grams singular
    c1, c2 = rng.normal(size=(2, 5)), rng.normal(size=(2, 5))
    w = gram_center([c1, c2], [gram_matrix(x1), gram_matrix(x2)])
    np.testing.assert_allclose(w[:, 2], 0.0, atol=1e-12)
    close = gram_center([c1, c2], [gram_matrix(x1), gram_matrix(x2)], ridge=1e-9)
    np.testing.assert_allclose(w, close, atol=1e-6)
    with pytest.raises(ValueError, match="one of each"):
        gram_center([c1, c2], [gram_matrix(x1)])


def test_minimax_known_answers():
    rng = np.random.default_rng(12)
    eye = np.eye(4)
    a, b = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
    gap = np.linalg.norm(a - b)
    w, s = minimax_gram_point([a, b], [eye, eye], [1.0, 1.0])
    np.testing.assert_allclose(w, (a + b) / 2, atol=1e-5 * gap)
    assert s == pytest.approx(gap / 2, rel=1e-5)
    w, s = minimax_gram_point([a, b], [eye, eye], [1.0, 3.0])
    np.testing.assert_allclose(w, a + 0.25 * (b - a), atol=1e-5 * gap)
    assert s == pytest.approx(gap / 4, rel=1e-5)
    # Obtuse triangle: the enclosing-ball center is the midpoint of the longest side.
    pts = [np.array([[0.0, 0.0]]), np.array([[4.0, 0.0]]), np.array([[2.0, 0.5]])]
    w, s, info = minimax_gram_point(pts, [np.eye(2)] * 3, [1.0] * 3, return_info=True)
    np.testing.assert_allclose(w, [[2.0, 0.0]], atol=1e-5)
    assert info["converged"] and info["lower_bound"] <= 2.0 <= s <= 2.0 * (1 + 1e-6)


def _minimax_problem(seed: int, cls: int, n: int, k: int, rows: int):
    """k random nodes: (cls, n) centers, Gram matrices of ``rows`` inputs, radii."""
    rng = np.random.default_rng(seed)
    centers = [rng.normal(size=(cls, n)) for _ in range(k)]
    grams = [gram_matrix(rng.normal(size=(rows, n - 1))) for _ in range(k)]
    return centers, grams, rng.uniform(0.5, 2.0, k)


def test_minimax_matches_generic_solver():
    scipy_opt = pytest.importorskip("scipy.optimize")
    cls, n, k = 2, 4, 4
    centers, grams, radii = _minimax_problem(13, cls, n, k, rows=10)
    _, s, info = minimax_gram_point(centers, grams, radii, return_info=True)
    cons = [{"type": "ineq", "fun": lambda v, i=i: v[-1] - np.trace(
        (v[:-1].reshape(cls, n) - centers[i]) @ grams[i]
        @ (v[:-1].reshape(cls, n) - centers[i]).T) / radii[i] ** 2} for i in range(k)]
    res = scipy_opt.minimize(lambda v: v[-1], np.r_[centers[0].ravel(), 100.0],
                             constraints=cons, method="SLSQP",
                             options={"ftol": 1e-12, "maxiter": 1000})
    opt = math.sqrt(res.x[-1])
    assert info["lower_bound"] <= opt * (1 + 1e-8) and s == pytest.approx(opt, rel=1e-5)
    np.testing.assert_allclose(info["scaled_distances"].max(), s)


def test_minimax_decides_at_a_threshold_and_stops_early():
    centers, grams, radii = _minimax_problem(21, cls=3, n=6, k=8, rows=20)
    _, opt, full = minimax_gram_point(centers, grams, radii, return_info=True)
    assert "decided" not in full and full["lower_bound"] <= opt
    # A threshold above the optimum: a point with maximum <= it is returned.
    w, s, above = minimax_gram_point(centers, grams, radii, return_info=True,
                                     decide_at=1.5 * opt)
    assert above["decided"] and s <= 1.5 * opt and above["iterations"] <= full["iterations"]
    assert max(m.distance / m.radius for m in membership(w, centers, grams, radii)) <= 1.5 * opt
    # Below it: the certified lower bound is above the threshold, so no point reaches it.
    _, s, below = minimax_gram_point(centers, grams, radii, return_info=True,
                                     decide_at=0.5 * opt)
    assert below["decided"] and below["lower_bound"] > 0.5 * opt and s >= opt * (1 - 1e-9)


def test_minimax_zero_and_infinite_radius():
    eye = np.eye(3)
    a, b, c = np.zeros((1, 3)), np.ones((1, 3)), np.full((1, 3), 5.0)
    w, s, info = minimax_gram_point([a, b, c], [eye] * 3, [1.0, 1.0, 0.0], return_info=True)
    np.testing.assert_allclose(w, (a + b) / 2, atol=1e-5)  # node 2 left out
    assert s == math.inf and info["excluded"] == [2]
    w, s = minimax_gram_point([a, b, c], [eye] * 3, [1.0, 1.0, math.inf])
    assert s == pytest.approx(math.sqrt(3) / 2, rel=1e-5)
    w, s = minimax_gram_point([a, b], [eye] * 2, [0.0, 0.0])  # nothing to optimise
    assert s == math.inf and np.all(np.isfinite(w))


def test_membership():
    eye = np.eye(2)
    centers = [np.zeros((1, 2)), np.array([[3.0, 4.0]])]
    w = np.array([[0.0, 1.0]])
    m = membership(w, centers, [eye, 4 * eye], [2.0, 1.0])
    assert m[0].inside and m[0].distance == pytest.approx(1.0) and m[0].miss == 0.0
    assert not m[1].inside
    assert m[1].distance == pytest.approx(2 * math.sqrt(18)) and m[1].radius == 1.0
    assert m[1].miss == pytest.approx(2 * math.sqrt(18) - 1.0)
    # The minimax point with scaled distance <= 1 is inside every space.
    w, s = minimax_gram_point(centers, [eye, eye], [3.0, 3.0])
    assert s <= 1.0 and all(v.inside for v in membership(w, centers, [eye, eye], [3.0, 3.0]))


def test_a_half_factor_is_exact_idempotent_and_safe_at_any_scale():
    """The factor as it travels: float16 vectors in [-1, 1] times power-of-two scales.
    The node keeps the split's own product, which splits again into the same arrays (so
    both ends build one matrix), and data far beyond float16's range still fit."""
    from gems_fl.geometry.gram import from_half, half_factor, sent_factor

    rng = np.random.default_rng(3)
    for scale in (1e-3, 1.0, 1e6):
        g = gram_matrix(rng.normal(size=(200, 30)) * scale)
        f = low_rank_factor(g, 8)
        assert np.abs(f).max() > 65504 or scale < 1e6  # float16 alone would overflow
        kept = sent_factor(g, 8)
        vectors, scales = half_factor(kept)
        assert vectors.dtype == np.float16 and np.abs(vectors).max() <= 1
        assert np.all(np.log2(scales) == np.round(np.log2(scales)))
        np.testing.assert_array_equal(from_half(vectors, scales), kept)
        assert relative_error(from_factor(f), from_factor(kept)) < 2e-3
    with pytest.raises(ValueError, match="finite 2-D"):
        half_factor(np.array([1.0, np.nan]))


def test_a_factor_from_fewer_rows_than_inputs_is_the_eigen_factor():
    """A node with fewer rows than inputs gets its factor from the thin SVD of its rows:
    the same matrix as the eigen-decomposition of G gives, zero columns past its rank."""
    rng = np.random.default_rng(5)
    x = rng.normal(size=(20, 50)) * rng.uniform(0.1, 3, size=50)
    g = gram_matrix(x)
    for rank in (5, 21, 30):
        thin, full = low_rank_factor(g, rank, x), low_rank_factor(g, rank)
        assert thin.shape == full.shape == (51, rank)
        np.testing.assert_allclose(from_factor(thin), from_factor(full), atol=1e-5)
    assert np.all(low_rank_factor(g, 30, x)[:, 20:] == 0)  # rank of G is at most 20
    with pytest.raises(ValueError, match="rows have 49 features"):
        low_rank_factor(g, 5, x[:, :49])


def test_a_large_factored_gram_is_built_and_factored_in_float32_to_what_the_wire_keeps():
    """From TOP_EIGEN_MIN_SIZE inputs a Gram matrix that travels as a factor is built by
    float32 BLAS and factored by its top eigenpairs alone: the same matrix as float64 to
    float32 rounding, and the factor's product within what its float16 form keeps."""
    from gems_fl.geometry.gram import TOP_EIGEN_MIN_SIZE, float32_gram, from_half, half_factor

    rng = np.random.default_rng(2)
    x = (rng.normal(size=(300, 40)) * rng.uniform(0.1, 3, size=40)).astype(np.float32)
    g64, g32 = gram_matrix(x), float32_gram(x)
    np.testing.assert_array_equal(g32, g32.T)
    np.testing.assert_allclose(g32, g64, rtol=0, atol=1e-5 * np.abs(g64).max())
    assert g32[-1, -1] == 1.0
    n = TOP_EIGEN_MIN_SIZE + 1
    basis = np.linalg.qr(rng.normal(size=(n, 60)))[0]
    big = (basis * np.linspace(1, 100, 60)) @ basis.T + 1e-3 * np.eye(n)
    top = low_rank_factor(big, 60)
    assert top.shape == (n, 60)
    wire = from_half(*half_factor(top))
    best = (basis * np.linspace(1, 100, 60)) @ basis.T  # the best rank-60 approximation
    assert np.abs(from_factor(top) - best).max() < 1e-4 * 100
    assert np.abs(from_factor(wire) - from_factor(top)).max() > np.abs(from_factor(top) - best).max()


def test_the_top_eigenpairs_of_a_large_matrix_are_near_best_and_the_same_every_time():
    """From TOP_EIGEN_MIN_SIZE inputs the factor comes from randomized subspace iteration:
    its error is within a few percent of the best rank-r approximation's on a matrix whose
    spectrum decays slowly past the rank, and a seeded draw gives the same bits again."""
    from gems_fl.geometry.gram import TOP_EIGEN_MIN_SIZE

    rng = np.random.default_rng(5)
    n, rank = TOP_EIGEN_MIN_SIZE + 10, 40
    basis = np.linalg.qr(rng.normal(size=(n, 200)))[0]
    spectrum = 0.97 ** np.arange(200)
    g = (basis * spectrum) @ basis.T
    best = np.sqrt((spectrum[rank:] ** 2).sum())
    f = low_rank_factor(g, rank)
    error = np.linalg.norm(g - from_factor(f))
    assert best < error < 1.05 * best
    np.testing.assert_array_equal(f, low_rank_factor(g, rank))


def test_a_factored_gram_measures_what_its_matrix_measures():
    """The evaluate round checks h_G through the factor a node kept, never forming the
    matrix: the same quadratic form, distance and verdict as the matrix from_factor builds."""
    from gems_fl.geometry.gram import FactoredGram, residual_diagonal
    from gems_fl.protocol.verify import GEMS_KEY, check_own_space, encode_evaluate

    rng = np.random.default_rng(3)
    x = rng.normal(size=(400, 12)) @ rng.normal(size=(12, 12))
    g = gram_matrix(x)
    f = low_rank_factor(g, 4)
    residual = residual_diagonal(g, f)
    means = rng.normal(size=(13, 2))
    for parts in ((f,), (f, residual), (f, residual, means)):
        whole = from_factor(*parts)
        factored = FactoredGram(*parts)
        diff = rng.normal(size=(3, 13))
        assert factored.quadratic(diff) == pytest.approx(np.trace(diff @ whole @ diff.T), rel=1e-10)

    center = rng.normal(size=(3, 13))
    gems = center + 0.05 * rng.normal(size=(3, 13))
    whole = from_factor(f, residual)
    radius = math.sqrt(np.trace((gems - center) @ whole @ (gems - center).T))
    for r in (radius * 1.01, radius * 0.99):
        content = encode_evaluate({}, {GEMS_KEY: {"weight": gems[:, :-1], "bias": gems[:, -1]}},
                                  own=({"weight": center[:, :-1], "bias": center[:, -1]}, r))
        by_factor = check_own_space(content, x, 0, gram=FactoredGram(f, residual))
        by_matrix = check_own_space(content, x, 0, gram=whole)
        assert by_factor["space.inside"] == by_matrix["space.inside"] == int(r > radius)
        assert by_factor["space.distance"] == pytest.approx(by_matrix["space.distance"], rel=1e-6)
