"""Class Gram matrices in factor form (gems_fl.geometry.class_factors): what a node sends
above 257 inputs + 1 with gram-rank, what the server rebuilds, and the reply checks."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from gems_fl.geometry import choices
from gems_fl.geometry.class_factors import class_factors, class_grams_from_factors, class_means
from gems_fl.geometry.gram import class_grams, label_moments
from gems_fl.geometry.kinds import SpaceOptions, build_layer_space
from gems_fl.protocol import replies, space_replies, wire
from gems_fl.protocol.node import encode_layer_space

C, D = 3, 300  # 301 > CLASS_GRAMS_AUTO_MAX: the factor form; gram-rank=auto gives rank 32
SHAPES = {"weight": (C, D), "bias": (C,)}


def _data(seed: int, num: int = 900, rank: int = 12, noise: float = 0.0):
    """Rows whose class covariances have rank ``rank`` (plus ``noise`` on the diagonal)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, num)
    bases = rng.normal(size=(C, rank, D))
    x = np.einsum("nr,nrd->nd", rng.normal(size=(num, rank)), bases[y]) \
        + rng.normal(size=(C, D))[y] * 2.0 + noise * rng.normal(size=(num, D))
    return x, y


def _layer(x, y, **options):
    opts = SpaceOptions(kind="gram", eps=0.0, num_directions=8, gram_rank="auto",
                        label_moments=True, class_grams="auto", **options)
    return build_layer_space(np.zeros((C, D + 1)), (x, y), x[:60], y[:60], opts, seed=0)


def _reply(layer):
    return encode_layer_space(layer, D, C, eps=0.0, num_train=900, num_val=60,
                              val_accuracy=0.5)


def test_auto_sends_class_grams_in_factor_form_only_where_a_gram_rank_applies():
    assert choices.class_gram_rank_for("auto", 785) == 50
    assert choices.class_gram_rank_for("auto", 257) == 0  # small layers: whole
    assert choices.class_gram_rank_for(0, 785) == 0
    assert choices.class_gram_rank_for(900, 785) == 784  # at most the covariance's size
    assert choices.class_grams_for("auto", 785, "auto")
    assert not choices.class_grams_for("auto", 785, 0)  # whole 785 x 785 per class: no
    assert choices.class_grams_for("auto", 65, 0)
    assert not choices.class_grams_for("false", 785, "auto")


def test_a_low_rank_covariance_travels_exactly_and_the_server_builds_the_nodes_matrices():
    x, y = _data(0)
    layer = _layer(x, y)
    assert layer.class_factors is not None
    vectors, scales, residual = layer.class_factors
    assert vectors.dtype == np.float16 and vectors.shape == (C, D, 32)
    assert scales.shape == (C, 32) and residual.shape == (C, D)
    exact = class_grams(x, y, C)
    # covariances of rank 12 < 32: the factor keeps them to float16's precision
    rel = np.linalg.norm(layer.space.class_grams - exact) / np.linalg.norm(exact)
    assert rel < 2e-3
    reply = _reply(layer)
    assert set(reply["labels"].keys()) == {"moments", "counts", *wire.CLASS_FACTOR_KEYS}
    sent = sum(a.numpy().nbytes for a in reply["labels"].values())
    assert sent < C * (D + 1) * (D + 2) // 2 * 4 / 4  # under a quarter of the triangles
    space, _ = space_replies.decode_reply(reply, SHAPES, "gram", "auto", labels=True)
    np.testing.assert_array_equal(space.class_grams, layer.space.class_grams)
    # a covariance of full rank loses only what its top 32 directions leave out, and each
    # feature keeps its own variance through the residual diagonal
    xn, yn = _data(1, noise=0.5)
    full = _layer(xn, yn).space.class_grams
    exact = class_grams(xn, yn, C)
    np.testing.assert_allclose(np.diagonal(full, axis1=1, axis2=2),
                               np.diagonal(exact, axis1=1, axis2=2), rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(full[:, -1], exact[:, -1], rtol=1e-5, atol=1e-5)
    assert np.all(np.linalg.eigvalsh(full).min(axis=1) > -1e-8)


def test_a_node_holding_some_classes_sends_one_factor_per_class_it_holds():
    x, y = _data(2)
    keep = y != 1
    layer = _layer(x[keep], y[keep])
    assert layer.class_factors[0].shape[0] == 2
    reply = encode_layer_space(layer, D, C, eps=0.0, num_train=int(keep.sum()), num_val=60,
                               val_accuracy=0.5)
    space, _ = space_replies.decode_reply(reply, SHAPES, "gram", "auto", labels=True)
    assert space.class_grams.shape == (2, D + 1, D + 1)
    moments, counts = label_moments(x[keep], y[keep], C)
    np.testing.assert_allclose(space.class_grams[:, -1, :-1], class_means(moments, counts),
                               rtol=1e-12)


@pytest.mark.parametrize("key,change,match", [
    ("class-vectors", lambda a: np.where(np.arange(a.size).reshape(a.shape) == 0, np.nan, a),
     "NaN"),
    ("class-vectors", lambda a: a[:, :, :-1], "shape"),
    ("class-scales", lambda a: -a, "> 0"),
    ("class-residual", lambda a: a - 1.0, ">= 0"),
    ("class-vectors", lambda a: (a.astype(np.float32) * 3), r"\[-1, 1\]"),
])
def test_a_malformed_factor_reply_is_rejected_naming_what_is_wrong(key, change, match):
    x, y = _data(3)
    reply = _reply(_layer(x, y))
    reply["labels"][key] = Array(np.ascontiguousarray(change(reply["labels"][key].numpy())))
    with pytest.raises(replies.ReplyError, match=match):
        space_replies.decode_reply(reply, SHAPES, "gram", "auto", labels=True)


def test_whole_class_grams_where_the_factor_form_is_due_are_rejected():
    x, y = _data(4)
    layer = _layer(x, y)
    reply = _reply(layer)
    labels = reply["labels"]
    for key in wire.CLASS_FACTOR_KEYS:
        del labels[key]
    labels["class-grams"] = Array(np.stack([np.ones(3, np.float32)] * C))
    with pytest.raises(replies.ReplyError, match="class-vectors"):
        space_replies.decode_reply(reply, SHAPES, "gram", "auto", labels=True)


def test_factors_round_trip_by_the_functions_alone():
    x, y = _data(5, noise=0.1)
    grams = class_grams(x, y, C)
    moments, counts = label_moments(x, y, C)
    means = class_means(moments, counts)
    sent = class_factors(grams, means, 20)
    again = class_grams_from_factors(*sent, means)
    assert again.shape == grams.shape and np.all(again[:, -1, -1] == 1.0)
    with pytest.raises(ValueError, match="rank must be"):
        class_factors(grams, means, D + 1)
    with pytest.raises(ValueError, match="must be"):
        class_factors(grams, means[:1], 5)


def test_a_class_of_few_rows_takes_the_same_factor_from_its_rows():
    x, y = _data(6, num=90, noise=0.3)  # about 30 rows per class, fewer than D
    grams = class_grams(x, y, C)
    moments, counts = label_moments(x, y, C)
    means = class_means(moments, counts)
    rows = [x[y == c] for c in range(C)]
    from_rows = class_grams_from_factors(*class_factors(grams, means, 20, rows), means)
    from_matrix = class_grams_from_factors(*class_factors(grams, means, 20), means)
    np.testing.assert_allclose(from_rows, from_matrix, rtol=2e-3, atol=2e-3 * np.abs(grams).max())
    with pytest.raises(ValueError, match="rows of 2 classes"):
        class_factors(grams, means, 20, rows[:2])
