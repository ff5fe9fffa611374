"""Class Gram matrices per k-means component (``class-components``): the node's split,
the wire check, the server's mixture, and the sums that add a class's components up."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from gems_fl.geometry.components import (
    MIN_COMPONENT_ROWS,
    check_component_grams,
    class_totals,
    component_grams,
    mixture_moments,
)
from gems_fl.geometry.gram import class_grams, gram_matrix, label_moments, pack_triangle
from gems_fl.geometry.gram_merge import has_class_components
from gems_fl.geometry.kinds import SpaceOptions, build_layer_space
from gems_fl.geometry.points import aggregate_gram
from gems_fl.geometry.spaces import GramSpace
from gems_fl.geometry.virtual import gaussian_point, pooled_class_moments
from gems_fl.protocol import replies, space_replies, wire
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import space_options

C, D = 2, 2
SHAPES = {"weight": (C, D), "bias": (C,)}


def _two_modes(seed: int, num: int = 2000):
    """Class 0 one tight blob at x=-2; class 1 two blobs, 85% at x=0 and 15% at x=12:
    one Gaussian for class 1 is wide and spills over class 0."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, num)
    far = (y == 1) & (rng.random(num) < 0.15)
    x = rng.normal(scale=0.5, size=(num, D))
    x[:, 0] += np.where(y == 0, -2.0, np.where(far, 12.0, 0.0))
    return x, y


def _accuracy(w, x, y):
    return float(np.mean(np.argmax(x @ w[:, :-1].T + w[:, -1], axis=1) == y))


def test_one_component_is_the_class_gram_and_components_add_up_to_it():
    x, y = _two_modes(0)
    grams, parts = component_grams(x, y, C, 1)
    np.testing.assert_allclose(grams, class_grams(x, y, C), rtol=1e-12)
    np.testing.assert_array_equal(parts, [[0, np.sum(y == 0)], [1, np.sum(y == 1)]])

    grams, parts = component_grams(x, y, C, 3, seed=1)
    assert len(parts) == 6 and np.all(np.diff(parts[:, 0]) >= 0)
    np.testing.assert_array_equal(np.bincount(parts[:, 0], weights=parts[:, 1]),
                                  np.bincount(y))
    np.testing.assert_allclose(class_totals(grams, parts), class_grams(x, y, C), atol=1e-10)
    # the far blob of class 1 is a component of its own
    means = grams[:, -1, 0]
    assert np.any((parts[:, 0] == 1) & (np.abs(means - 12.0) < 0.5))
    again = component_grams(x, y, C, 3, seed=1)
    np.testing.assert_array_equal(again[1], parts)
    np.testing.assert_allclose(again[0], grams)


def test_a_class_too_small_to_split_stays_one_component():
    x, y = _two_modes(1, 4 * MIN_COMPONENT_ROWS)
    keep = np.flatnonzero(y == 1)[: MIN_COMPONENT_ROWS + 10]
    rows = np.concatenate([np.flatnonzero(y == 0), keep])
    grams, parts = component_grams(x[rows], y[rows], C, 4)
    assert parts[parts[:, 0] == 1].tolist() == [[1, len(keep)]]
    assert np.sum(parts[:, 0] == 0) == min(4, int(np.sum(y == 0)) // MIN_COMPONENT_ROWS)
    with pytest.raises(ValueError, match="components=0"):
        component_grams(x, y, C, 0)


def test_the_mixture_fits_a_two_mode_class_better_than_one_gaussian():
    x, y = _two_modes(2)
    halves = [np.arange(0, 1000), np.arange(1000, 2000)]
    sent = [component_grams(x[h], y[h], C, 3, seed=0) for h in halves]
    counts, means, covs, classes = mixture_moments([s[0] for s in sent], [s[1] for s in sent])
    mixture = gaussian_point(counts, means, covs, l2=1e-6, seed=0, classes=classes,
                             num_classes=C)
    single = gaussian_point(*pooled_class_moments(
        [class_grams(x[h], y[h], C) for h in halves],
        [label_moments(x[h], y[h], C)[1] for h in halves]), l2=1e-6, seed=0)
    assert _accuracy(mixture, x, y) > 0.96  # two blobs 4 sd apart: the Bayes rate is ~0.977
    assert _accuracy(mixture, x, y) > _accuracy(single, x, y) + 0.02
    with pytest.raises(ValueError, match="classes"):
        gaussian_point(counts, means, covs, classes=classes[:-1], num_classes=C)
    with pytest.raises(ValueError, match="classes"):
        gaussian_point(counts, means, covs, classes=classes + 5, num_classes=C)


def test_the_server_fits_the_mixture_when_nodes_send_components():
    x, y = _two_modes(3)
    halves = [np.arange(0, 1000), np.arange(1000, 2000)]
    options = lambda g: SpaceOptions(kind="gram", eps=0.0, num_directions=8,
                                     label_moments=True, class_grams="true",
                                     class_components=g)
    center = np.zeros((C, D + 1))
    spaces = {g: [build_layer_space(center, (x[h], y[h]), x[h][:50], y[h][:50], options(g),
                                    seed=0).space for h in halves] for g in (1, 3)}
    assert spaces[1][0].class_parts is None and spaces[3][0].class_parts is not None
    assert not has_class_components(spaces[1]) and has_class_components(spaces[3])
    np.testing.assert_allclose(spaces[3][0].per_class_grams, spaces[1][0].class_grams,
                               atol=1e-10)
    fit = lambda g, point: aggregate_gram(spaces[g], [1000, 1000], point=point,
                                          pooled_ridge=1e-6)
    mixture, gaussian, plain = fit(3, "mixture"), fit(3, "gaussian"), fit(1, "gaussian")
    assert mixture.method == "mixture" and gaussian.method == "gaussian"
    assert mixture.details["gaussian_components"] == sum(len(s.class_parts) for s in spaces[3])
    # gaussian adds each class's components up: the point of one matrix per class
    np.testing.assert_allclose(gaussian.point, plain.point, rtol=1e-6, atol=1e-8)
    acc = {r.method: _accuracy(r.point.reshape(C, -1), x, y) for r in (mixture, gaussian)}
    assert acc["mixture"] > acc["gaussian"] + 0.02


def _reply(x, y, components=3):
    center = np.zeros((C, D + 1))
    options = SpaceOptions(kind="gram", eps=0.0, num_directions=8, label_moments=True,
                           class_grams="true", class_components=components)
    space = build_layer_space(center, (x, y), x[:20], y[:20], options, seed=0).space
    return wire.encode_reply({"weight": center[:, :-1], "bias": center[:, -1]}, None,
                             radius=space.radius, certified_radius=1.0, eps=0.0,
                             num_train_examples=len(y), num_val_examples=20,
                             local_val_accuracy=1.0, gram=space.gram,
                             labels=(space.moments, space.class_counts, space.class_grams,
                                     None, space.class_parts)), space


def test_components_travel_and_a_tampered_reply_is_refused_by_what_is_wrong():
    x, y = _two_modes(4, 600)
    content, sent = _reply(x, y)
    space, _ = space_replies.decode_reply(content, SHAPES, "gram", labels=True)
    np.testing.assert_array_equal(space.class_parts, sent.class_parts)
    np.testing.assert_allclose(space.class_grams, sent.class_grams, rtol=1e-5, atol=1e-5)

    def tampered(key, change):
        bad, _ = _reply(x, y)
        value = bad["labels"][key].numpy().copy()
        change(value)
        bad["labels"][key] = Array(value)
        return bad

    cases = [
        ("class-components", lambda p: p.__setitem__((0, 1), p[0, 1] + 1), "components hold"),
        ("class-components", lambda p: p.__setitem__((0, 0), 1), "class order"),
        ("class-grams", lambda t: t.__setitem__((0, D), t[0, D] + 0.5), "class mean"),
        ("class-grams", lambda t: t.__setitem__((1, 0), np.nan), "NaN"),
    ]
    for key, change, message in cases:
        with pytest.raises(replies.ReplyError, match=message):
            space_replies.decode_reply(tampered(key, change), SHAPES, "gram", labels=True)
    short, _ = _reply(x, y)
    short["labels"]["class-components"] = Array(sent.class_parts[:-1].copy())
    with pytest.raises(replies.ReplyError, match="one packed triangle per component"):
        space_replies.decode_reply(short, SHAPES, "gram", labels=True)


def test_the_check_refuses_components_without_rows_or_of_a_class_not_held():
    x, y = _two_modes(5, 600)
    grams, parts = component_grams(x, y, C, 2)
    moments, counts = label_moments(x, y, C)
    tri = np.stack([pack_triangle(g) for g in grams])
    check_component_grams(tri, parts, counts, moments, D + 1)
    empty = parts.copy()
    empty[0, 1], empty[1, 1] = 0, parts[0, 1] + parts[1, 1]
    with pytest.raises(ValueError, match="no rows"):
        check_component_grams(tri, empty, counts, moments, D + 1)
    moments0, counts0 = label_moments(x[y == 0], y[y == 0], C)
    with pytest.raises(ValueError, match="label counts hold"):
        check_component_grams(tri, parts, counts0, moments0, D + 1)


def test_sums_add_a_class_components_up():
    from gems_fl.geometry.gram_sums import GramSums

    x, y = _two_modes(6, 800)
    grams, parts = component_grams(x, y, C, 3)
    moments, counts = label_moments(x, y, C)
    space = GramSpace(np.zeros(C * (D + 1)), gram_matrix(x), 1.0, 0.0, moments, counts,
                      grams, parts)
    sums = GramSums(C, D + 1)
    sums.add(len(y), np.zeros((C, D + 1)), space.gram, moments, counts, space.per_class_grams)
    for a, b in zip(sums.class_moments(),
                    pooled_class_moments([class_grams(x, y, C)], [counts])):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_the_setting_reaches_the_nodes_and_refuses_zero():
    assert Settings.from_run_config({}).class_components == 4
    assert Settings.from_run_config({"class-components": 1}).for_nodes()["class-components"] == 1
    assert space_options(
        Settings.from_run_config({"class-components": 2})).class_components == 2
    with pytest.raises(SettingsError, match="class-components"):
        Settings.from_run_config({"class-components": 0})


def test_a_run_scores_the_mixture_beside_the_gaussian_point(tmp_path):
    from gems_fl.geometry.choices import GAUSSIAN_L2S
    from tests.helpers import run_in_process

    # the MLP's 9-input output layer: digits' classes (~110 rows a node) split in two;
    # the logistic model's 65 inputs would need 130 rows a component
    results = run_in_process(3, tmp_path, **{"model": "mlp", "hidden": "12,8",
                                             "num-directions": 20, "clusters": 6,
                                             "eps-neuron": 0.5})
    table = results["rounds"][-1]["selection"]["candidates"]
    for point in ("gaussian", "mixture"):
        assert [c["gaussian_l2"] for c in table if c["point"] == point] == list(GAUSSIAN_L2S)
    assert results["verification"]["good_enough"] == 3
