"""The gaussian point: class Gram matrices on the node, their wire check, and the softmax
layer fitted to virtual rows of each class's pooled Gaussian."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from gems_fl.geometry.gram import class_grams, gram_matrix, label_moments
from gems_fl.geometry.kinds import SpaceOptions, build_layer_space
from gems_fl.geometry.points import aggregate_gram
from gems_fl.geometry.spaces import GramSpace
from gems_fl.geometry.virtual import fit_softmax, gaussian_point, pooled_class_moments
from gems_fl.protocol import replies, space_replies, wire
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import space_options

C, D = 3, 4
SHAPES = {"weight": (C, D), "bias": (C,)}


def _data(seed: int, num: int = 600):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, num)
    # class-specific covariances: a shared-covariance model (LDA, least squares) is wrong
    scales = np.array([[3.0, 0.3, 1, 1], [0.3, 3.0, 1, 1], [1, 1, 0.3, 3.0]])
    x = rng.normal(size=(num, D)) * scales[y] + np.eye(C, D)[y] * 1.5
    return x, y


def _accuracy(w, x, y):
    return float(np.mean(np.argmax(x @ w[:, :-1].T + w[:, -1], axis=1) == y))


def test_class_grams_sum_to_the_gram_matrix_and_hold_the_class_means():
    x, y = _data(0)
    y[y == 1] = 0  # class 1 absent: no matrix for it
    per_class = class_grams(x, y, C)
    counts = label_moments(x, y, C)[1]
    assert per_class.shape == (2, D + 1, D + 1)
    held = np.flatnonzero(counts)
    np.testing.assert_allclose(np.einsum("c,cij->ij", counts[held] / len(y), per_class),
                               gram_matrix(x), rtol=1e-12, atol=1e-12)
    for g, c in zip(per_class, held):
        np.testing.assert_allclose(g[-1, :-1], x[y == c].mean(axis=0), rtol=1e-12)
        assert g[-1, -1] == pytest.approx(1.0)


def test_pooled_class_moments_do_not_depend_on_the_split():
    x, y = _data(1)
    one = pooled_class_moments([class_grams(x, y, C)], [label_moments(x, y, C)[1]])
    zero = np.flatnonzero(y == 0)
    parts = [zero[:10], zero[10:], np.flatnonzero(y > 0)[::2], np.flatnonzero(y > 0)[1::2]]
    split = pooled_class_moments([class_grams(x[p], y[p], C) for p in parts],
                                 [label_moments(x[p], y[p], C)[1] for p in parts])
    for a, b in zip(one, split):
        np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-12)
    for c in range(C):
        rows = x[y == c]
        np.testing.assert_allclose(one[1][c], rows.mean(axis=0), rtol=1e-10)
        np.testing.assert_allclose(one[2][c], np.cov(rows.T, bias=True), rtol=1e-8, atol=1e-10)


def _logistic(x, y, l2):
    """The softmax layer fitted to the real rows (the point the virtual rows stand for)."""
    import torch

    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    w = torch.zeros(C, D + 1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=500, line_search_fn="strong_wolfe")

    def loss():
        opt.zero_grad()
        value = torch.nn.functional.cross_entropy(xt @ w[:, :-1].T + w[:, -1], yt) \
            + l2 * (w[:, :-1] ** 2).sum()
        value.backward()
        return value

    opt.step(loss)
    return w.detach().numpy()


def test_gaussian_point_is_the_logistic_fit_of_gaussian_classes_and_is_seeded():
    x, y = _data(2, 3000)
    xt, yt = _data(3, 3000)
    parts = [np.flatnonzero(y == c) for c in range(C)]  # each node one class
    spaces = []
    for p in parts:
        moments, counts = label_moments(x[p], y[p], C)
        spaces.append(GramSpace(np.zeros(C * (D + 1)), gram_matrix(x[p]), 1.0, 0.0, moments,
                                counts, class_grams(x[p], y[p], C)))
    n = [len(p) for p in parts]
    gaussian = aggregate_gram(spaces, n, point="gaussian", pooled_ridge=1e-6, seed=0)
    assert gaussian.method == "gaussian" and gaussian.details["gaussian_l2"] == 1e-6
    w = gaussian.point.reshape(C, D + 1)
    real = _logistic(x, y, 1e-6)
    agree = np.mean(np.argmax(xt @ w[:, :-1].T + w[:, -1], 1)
                    == np.argmax(xt @ real[:, :-1].T + real[:, -1], 1))
    assert agree > 0.97
    assert _accuracy(w, xt, yt) > _accuracy(real, xt, yt) - 0.01
    # no node holds two classes, so no node's own model could separate them: the point
    # comes from the pooled class statistics alone
    again = aggregate_gram(spaces, n, point="gaussian", pooled_ridge=1e-6, seed=0)
    np.testing.assert_array_equal(again.point, gaussian.point)
    other_seed = aggregate_gram(spaces, n, point="gaussian", pooled_ridge=1e-6, seed=1)
    assert not np.array_equal(other_seed.point, gaussian.point)


def _objective(w, x, y, l2):
    import torch

    logits = torch.as_tensor(x @ w[:, :-1].T + w[:, -1])
    return float(torch.nn.functional.cross_entropy(logits, torch.as_tensor(y))
                 + l2 * (w[:, :-1] ** 2).sum())


def test_the_preconditioned_fit_reaches_the_penalised_optimum_of_correlated_features():
    """The fit runs in whitened coordinates with the penalty mapped along: the minimiser
    is the one of the stated objective in the caller's coordinates, even where strongly
    correlated features leave an unpreconditioned L-BFGS far from it."""
    import torch

    rng = np.random.default_rng(0)
    x, y = _data(4, 2000)
    mix = np.eye(D) + 0.98 * rng.normal(size=(D, D))  # correlated, badly scaled features
    x = x @ mix * np.array([1.0, 30.0, 0.05, 3.0])
    l2 = 1e-3
    w = fit_softmax(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y), C, l2=l2)
    real = _logistic(x, y, l2)  # float64, 500 iterations
    assert _objective(w, x, y, l2) <= _objective(real, x, y, l2) + 1e-4
    np.testing.assert_allclose(w, real, atol=2e-2 * np.abs(real).max())


def test_the_gaussian_point_needs_every_nodes_class_grams():
    x, y = _data(4)
    moments, counts = label_moments(x, y, C)
    space = GramSpace(np.zeros(C * (D + 1)), gram_matrix(x), 1.0, 0.0, moments, counts)
    with pytest.raises(ValueError, match="class Gram matrices"):
        aggregate_gram([space], [len(y)], point="gaussian")
    with pytest.raises(ValueError, match="l2"):
        gaussian_point(*pooled_class_moments([class_grams(x, y, C)], [counts]), l2=-1.0)


def _reply(x, y, class_grams_setting="true"):
    center = np.zeros((C, D + 1))
    options = SpaceOptions(kind="gram", eps=0.0, num_directions=8, label_moments=True,
                           class_grams=class_grams_setting)
    layer = build_layer_space(center, (x, y), x[:20], y[:20], options, seed=0)
    space = layer.space
    return wire.encode_reply({"weight": center[:, :-1], "bias": center[:, -1]}, None,
                             radius=space.radius, certified_radius=1.0, eps=0.0,
                             num_train_examples=len(y), num_val_examples=20,
                             local_val_accuracy=1.0, gram=space.gram,
                             labels=(space.moments, space.class_counts, space.class_grams))


def test_class_grams_travel_and_are_checked_against_the_label_moments():
    x, y = _data(5, 200)
    y[y == 2] = 1
    space, _ = space_replies.decode_reply(_reply(x, y), SHAPES, "gram", labels=True)
    np.testing.assert_allclose(space.class_grams, class_grams(x, y, C), rtol=1e-5, atol=1e-5)
    without, _ = space_replies.decode_reply(_reply(x, y, "false"), SHAPES, "gram", labels=True)
    assert without.class_grams is None

    bad = _reply(x, y)
    tri = bad["labels"]["class-grams"].numpy().copy()
    tri[0, D] += 0.5  # class 0's mean entry no longer matches its label moments
    bad["labels"]["class-grams"] = Array(tri)
    with pytest.raises(replies.ReplyError, match="class mean"):
        space_replies.decode_reply(bad, SHAPES, "gram", labels=True)
    short = _reply(x, y)
    short["labels"]["class-grams"] = Array(tri[:1])  # two classes held, one matrix
    with pytest.raises(replies.ReplyError, match="one packed triangle per class"):
        space_replies.decode_reply(short, SHAPES, "gram", labels=True)
    nan = _reply(x, y)
    tri = nan["labels"]["class-grams"].numpy().copy()
    tri[1, 0] = np.nan
    nan["labels"]["class-grams"] = Array(tri)
    with pytest.raises(replies.ReplyError, match="NaN"):
        space_replies.decode_reply(nan, SHAPES, "gram", labels=True)


def test_class_grams_auto_follows_the_layer_size():
    from gems_fl.geometry.choices import class_grams_for

    assert class_grams_for("auto", 65) and class_grams_for("auto", 257)
    assert not class_grams_for("auto", 785)
    assert Settings.from_run_config({"gram-point": "gaussian"}).for_nodes()["class-grams"] == "true"
    assert Settings.from_run_config({}).for_nodes()["class-grams"] == "auto"
    assert class_grams_for("true", 785) and not class_grams_for("false", 65)


def test_settings_refuse_a_gaussian_point_without_class_grams_and_class_grams_under_dp():
    with pytest.raises(SettingsError, match="class-grams"):
        Settings.from_run_config({"gram-point": "gaussian", "class-grams": "false"})
    with pytest.raises(SettingsError, match="class-grams=true"):
        Settings.from_run_config({"dp-epsilon": 1.0, "class-grams": "true"})
    options = space_options(Settings.from_run_config({"dp-epsilon": 1.0}))
    assert options.class_grams == "false"
    # secure aggregation sums them per class through SecAgg+ (tests/test_secure.py)
    secure = Settings.from_run_config({"secure-aggregation": True, "class-grams": "true"})
    assert space_options(secure).class_grams == "true"


def test_the_api_offers_the_gaussian_point():
    from gems_fl.api import aggregate, node_space

    x, y = _data(6, 900)
    parts = [np.flatnonzero(y == c) for c in range(C)]
    zeros = np.zeros((C, D + 1))
    with_grams = [node_space(zeros, x[p], y[p], x[p], y[p], eps=0.0, num_directions=8,
                             class_grams=True) for p in parts]
    merged = aggregate(with_grams, gram_point="gaussian", pooled_ridge=1e-6)
    direct = aggregate_gram([s.space for s in with_grams], [len(p) for p in parts],
                            point="gaussian", pooled_ridge=1e-6)
    np.testing.assert_allclose(merged.weights.reshape(-1), direct.point)
    without = [node_space(zeros, x[p], y[p], x[p], y[p], eps=0.0, num_directions=8)
               for p in parts]
    with pytest.raises(ValueError, match="class Gram matrices"):
        aggregate(without, gram_point="gaussian")


def test_sums_of_class_grams_give_the_gaussian_point_of_every_nodes_matrices():
    from gems_fl.geometry.gram_sums import GramSums
    from gems_fl.geometry.points import aggregate_sums

    x, y = _data(7, 900)
    parts = [np.flatnonzero(y == 0), np.flatnonzero(y > 0)[:200], np.flatnonzero(y > 0)[200:]]
    spaces, sums = [], GramSums(C, D + 1)
    for p in parts:
        moments, counts = label_moments(x[p], y[p], C)
        per_class = class_grams(x[p], y[p], C)
        space = GramSpace(np.zeros(C * (D + 1)), gram_matrix(x[p]), 1.0, 0.0, moments,
                          counts, per_class)
        spaces.append(space)
        sums.add(len(p), np.zeros((C, D + 1)), space.gram, moments, counts, per_class)
    assert sums.has_class_grams
    for a, b in zip(sums.class_moments(), pooled_class_moments(
            [s.class_grams for s in spaces], [s.class_counts for s in spaces])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)
    n = [len(p) for p in parts]
    from_sums = aggregate_sums(sums, spaces, n, point="gaussian", ridge=1e-6, pooled_ridge=1e-5)
    from_nodes = aggregate_gram(spaces, n, point="gaussian", pooled_ridge=1e-5)
    agree = np.mean(np.argmax(x @ from_sums.point.reshape(C, -1)[:, :-1].T, 1)
                    == np.argmax(x @ from_nodes.point.reshape(C, -1)[:, :-1].T, 1))
    assert from_sums.method == "gaussian" and agree > 0.99
    with pytest.raises(ValueError, match="every node adds class Gram matrices"):
        sums.add(len(parts[0]), np.zeros((C, D + 1)), spaces[0].gram, spaces[0].moments,
                 spaces[0].class_counts)


def test_a_run_on_sums_scores_the_gaussian_points_from_the_summed_class_grams(tmp_path):
    from gems_fl.geometry.choices import GAUSSIAN_L2S
    from tests.helpers import run_in_process

    results = run_in_process(3, tmp_path, **{"server-grams": "sums",
                                             "label-division": "classes-per-node:4"})
    table = results["rounds"][1]["candidates"]
    assert [c["gaussian_l2"] for c in table if c["point"] == "gaussian"] == list(GAUSSIAN_L2S)
    assert results["verification"]["good_enough"] == 3


def test_the_written_out_gradient_is_autograds():
    import torch

    from gems_fl.geometry.virtual import softmax_loss_and_gradient

    gen = torch.Generator().manual_seed(0)
    n, d, c = 300, 6, 4
    z = torch.randn(n, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, c, (n,), generator=gen)
    s = torch.rand(d, generator=gen, dtype=torch.float64) + 0.5
    penalty = 1e-2 * s ** 2
    u = torch.randn(c, d + 1, generator=gen, dtype=torch.float64, requires_grad=True)
    onehot = torch.nn.functional.one_hot(y, c).double()
    value, grad = softmax_loss_and_gradient(u.detach().clone(), z, onehot, s, penalty)
    expected = torch.nn.functional.cross_entropy(z @ (u[:, :-1] * s).T + u[:, -1], y) \
        + (u[:, :-1] ** 2 * penalty).sum()
    expected.backward()
    assert float(value) == pytest.approx(float(expected.detach()), rel=1e-12)
    torch.testing.assert_close(grad, u.grad, rtol=1e-10, atol=1e-12)


def test_the_l2_candidates_share_one_draw_and_each_fit_is_a_fresh_one(monkeypatch):
    """The selection round asks for the point at every L2 from the same statistics: the
    virtual rows are drawn once, and each fit equals the fit on a fresh draw."""
    from gems_fl.geometry import virtual

    x, y = _data(5, 900)
    moments = pooled_class_moments([class_grams(x, y, C)], [label_moments(x, y, C)[1]])
    prepared = []
    real_prepare = virtual._prepare
    monkeypatch.setattr(virtual, "_prepare",
                        lambda *a, **k: prepared.append(1) or real_prepare(*a, **k))
    fits = {l2: gaussian_point(*moments, l2=l2, seed=3, rows=2000) for l2 in (1e-4, 1e-6)}
    assert len(prepared) == 1
    virtual.forget_draw()
    np.testing.assert_array_equal(gaussian_point(*moments, l2=1e-6, seed=3, rows=2000), fits[1e-6])
    assert len(prepared) == 2
    other = gaussian_point(*moments, l2=1e-6, seed=4, rows=2000)  # another draw
    assert len(prepared) == 3 and not np.array_equal(other, fits[1e-6])


def test_the_l2_candidates_fitted_at_once_equal_those_fitted_one_after_another(monkeypatch):
    """The selection round fits a point's values on the free cores at once: the same
    candidates, bit for bit, and the virtual rows still drawn once."""
    from gems_fl.geometry import virtual
    from gems_fl.geometry.choices import GAUSSIAN_L2S
    from gems_fl.geometry.kinds import AggregateOptions
    from gems_fl.geometry.points import NodeStatistics
    from gems_fl.protocol import selection_round

    x, y = _data(11, 900)
    parts = [np.flatnonzero(y < 2), np.flatnonzero(y >= 2)]
    spaces = []
    for p in parts:
        moments, counts = label_moments(x[p], y[p], C)
        spaces.append(GramSpace(np.zeros(C * (D + 1)), gram_matrix(x[p]), 1.0, 0.0, moments,
                                counts, class_grams(x[p], y[p], C)))
    stats = NodeStatistics(spaces, [len(p) for p in parts])
    options = AggregateOptions(gram_point="auto", seed=2)
    made = []
    real_prepare = virtual._prepare
    monkeypatch.setattr(virtual, "_prepare",
                        lambda *a, **k: made.append(1) or real_prepare(*a, **k))
    runs = {}
    for workers in (1, 2):
        monkeypatch.setattr(selection_round, "concurrent_workers", lambda n, w=workers: min(n, w))
        virtual.forget_draw()
        runs[workers] = selection_round._solve_values(stats, spaces, "gaussian",
                                                      list(GAUSSIAN_L2S), options)
    assert len(made) == 2  # one draw per pass, shared by its four fits
    for one, two in zip(runs[1], runs[2]):
        np.testing.assert_array_equal(one.point, two.point)
        assert one.details == two.details


def test_each_l2_gives_the_same_point_asked_alone_or_with_the_grid():
    """The L2 grid is fitted by continuation (chains of two, the first from zero): an L2's
    point is fixed by the L2 alone, so a run naming the point and one L2 reproduces the
    selection round's candidate; a chain's first L2 is the fit from zero."""
    from gems_fl.geometry import virtual
    from gems_fl.geometry.choices import GAUSSIAN_L2S

    x, y = _data(5, 900)
    counts, means, covs = pooled_class_moments([class_grams(x, y, C)], [np.bincount(y, minlength=C)])
    together = virtual.gaussian_points(counts, means, covs, list(GAUSSIAN_L2S), seed=1, rows=4000,
                                       workers=2)
    for l2, layer in zip(GAUSSIAN_L2S, together):
        alone = virtual.gaussian_points(counts, means, covs, [l2], seed=1, rows=4000)[0]
        np.testing.assert_array_equal(alone, layer)
    for l2 in (1e-3, 1e-5):  # the chains' first: the point from zero
        cold = gaussian_point(counts, means, covs, l2=l2, seed=1, rows=4000)
        np.testing.assert_array_equal(cold, together[GAUSSIAN_L2S.index(l2)])
    warm = together[GAUSSIAN_L2S.index(1e-4)]
    assert _accuracy(warm, x, y) >= _accuracy(gaussian_point(counts, means, covs, l2=1e-4, seed=1,
                                                             rows=4000), x, y) - 0.01


def test_the_virtual_rows_drawn_as_logits_have_the_law_of_rows_drawn_as_rows():
    """A Gaussian's rows have Gaussian logits: the loss on rows drawn as their ``C - 1``
    logit directions is the cross-entropy of rows drawn in all ``d`` and mapped by the
    layer (to Monte Carlo error), and its gradient is autograd's of ``a S a^T`` itself."""
    import torch

    from gems_fl.geometry import virtual

    x, y = _data(7, 3000)
    counts, means, covs = pooled_class_moments([class_grams(x, y, C)], [np.bincount(y, minlength=C)])
    virtual.forget_draw()
    g = virtual._prepared(counts, means, covs, seed=0, rows=40_000, shrinkage=1e-3,
                          classes=None, num_classes=None)
    gen = torch.Generator().manual_seed(1)
    s = torch.rand(D, generator=gen, dtype=torch.float64) + 0.5
    penalty = 1e-2 * s ** 2
    u = torch.randn(C, D + 1, generator=gen, dtype=torch.float64).requires_grad_(True)
    value = virtual._expected_loss(u, g, s, penalty)
    value.backward()

    # the same loss with the covariance's quadratic form left to autograd
    v = u.detach().clone().requires_grad_(True)
    a = (v[:, :-1] * s) @ g.basis.T
    means_logits = v[:, -1] + g.offsets @ a.T
    cov = g.contrasts.T @ (a @ g.covariances.double() @ a.T) @ g.contrasts
    jitter = 1e-10 * cov.detach().diagonal(dim1=1, dim2=2).mean(1) + 1e-30
    root = torch.linalg.cholesky(cov + jitter[:, None, None] * torch.eye(C - 1, dtype=cov.dtype))
    total = sum(torch.nn.functional.cross_entropy(
        means_logits[m] + noise @ root[m].T @ g.contrasts.T,
        torch.full((len(noise),), g.classes[m]), reduction="sum") for m, noise in enumerate(g.noise))
    expected = total / g.rows + (v[:, :-1] ** 2 * penalty).sum()
    expected.backward()
    # (the module forms a S in float32)
    assert float(value) == pytest.approx(float(expected), rel=1e-6)
    torch.testing.assert_close(u.grad, v.grad, rtol=1e-5, atol=1e-8)

    # rows drawn in all d dimensions from each class's (shrunk) Gaussian, mapped by the layer
    rng = np.random.default_rng(2)
    rows, labels = [], []
    for m, noise in enumerate(g.noise):
        cov_m = g.covariances[m].double().numpy()
        rows.append(rng.multivariate_normal(g.offsets[m].numpy(), cov_m, size=len(noise)))
        labels.append(np.full(len(noise), g.classes[m]))
    z = torch.as_tensor(np.concatenate(rows))
    a = (u.detach()[:, :-1] * s) @ g.basis.T
    drawn = torch.nn.functional.cross_entropy(z @ a.T + u.detach()[:, -1],
                                              torch.as_tensor(np.concatenate(labels)))
    assert float(value) - float((u.detach()[:, :-1] ** 2 * penalty).sum()) \
        == pytest.approx(float(drawn), rel=0.02)


def test_the_point_is_fitted_where_the_covariances_are_only_semidefinite():
    """Fewer inputs than classes leave every layer's logit covariance singular, and sums
    through SecAgg+'s quantisation can leave a class covariance indefinite: the fit still
    gives a finite layer that separates the classes."""
    rng = np.random.default_rng(8)
    classes, d = 10, 3  # d < C - 1: a S a^T has rank 3 of 9
    means = rng.normal(size=(classes, d)) * 4.0
    covs = np.stack([np.eye(d) * 0.2 for _ in range(classes)])
    counts = np.full(classes, 100.0)
    layer = gaussian_point(counts, means, covs, l2=1e-4, seed=0, rows=5000)
    assert np.all(np.isfinite(layer))
    assert _accuracy(layer, means, np.arange(classes)) >= 0.9

    x, y = _data(9, 900)
    counts, means, covs = pooled_class_moments([class_grams(x, y, C)], [np.bincount(y, minlength=C)])
    lam, vecs = np.linalg.eigh(covs[0])
    covs[0] = (vecs * np.r_[-0.5 * lam[-1], lam[1:]]) @ vecs.T  # one negative eigenvalue
    layer = gaussian_point(counts, means, covs, l2=1e-4, seed=0, rows=4000)
    assert np.all(np.isfinite(layer)) and _accuracy(layer, x, y) > 0.6
