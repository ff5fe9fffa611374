"""A small table's landmarks: clusters under the floor are dissolved, not dropped."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import KMeans

from gems_fl.data.kernel_features import (
    MIN_ROWS_PER_LANDMARK,
    absorb_small_clusters,
    class_centres,
)


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32)


def test_every_cluster_left_reaches_the_floor_and_every_row_stays_in_one():
    rows = _rows(203)
    k = len(rows) // MIN_ROWS_PER_LANDMARK
    labels = KMeans(n_clusters=k, n_init=1, random_state=0).fit(rows).labels_
    dropped = (np.bincount(labels, minlength=k) >= MIN_ROWS_PER_LANDMARK).sum()
    merged = absorb_small_clusters(rows, labels, k, MIN_ROWS_PER_LANDMARK)
    counts = np.bincount(merged, minlength=k)
    assert len(merged) == len(rows) and counts[counts > 0].min() >= MIN_ROWS_PER_LANDMARK
    assert (counts > 0).sum() > dropped  # more centres than dropping the small ones kept
    again = absorb_small_clusters(rows, labels, k, MIN_ROWS_PER_LANDMARK)
    np.testing.assert_array_equal(merged, again)
    big = np.repeat(np.arange(4), 10)  # no cluster under the floor: nothing moves
    np.testing.assert_array_equal(absorb_small_clusters(_rows(40), big, 4, 5), big)


def test_a_class_asked_for_more_landmarks_than_its_rows_allow_keeps_more_of_them():
    """A capped class (share above one per 5 rows) dissolves its small clusters: more
    centres, each the mean of at least 5 rows; a class asked for fewer is untouched
    (the k-means centres of the clusters that reach the floor, as before)."""
    x, y = _rows(300, 1), np.repeat([0, 1], 150)
    capped, sizes = class_centres(x, y, share=1.0, seed=0)
    assert sizes.min() >= MIN_ROWS_PER_LANDMARK and sizes.sum() == 300
    plain = []
    for label in (0, 1):
        rows = x[y == label].astype(np.float64)  # as the product clusters them
        fit = KMeans(n_clusters=30, n_init=1, max_iter=100, random_state=0).fit(rows)
        keep = np.bincount(fit.labels_, minlength=30) >= MIN_ROWS_PER_LANDMARK
        plain.append(keep.sum())
    assert len(capped) > sum(plain)
    few, few_sizes = class_centres(x, y, share=0.1, seed=0)  # 15 asked per class, cap 30
    expected = []
    for label in (0, 1):
        rows = x[y == label].astype(np.float64)
        fit = KMeans(n_clusters=15, n_init=1, max_iter=100, random_state=0).fit(rows)
        counts = np.bincount(fit.labels_, minlength=15)
        expected += [rows[fit.labels_ == j].mean(axis=0) for j in np.flatnonzero(counts >= 5)]
    np.testing.assert_array_equal(few, np.stack(expected).astype(np.float32))


def test_the_run_records_how_many_landmarks_it_kept_and_why(tmp_path):
    from tests.helpers import run_in_process

    results = run_in_process(3, tmp_path, model="kernel", **{"kernel-landmarks": 4000})
    report = results["identify"]["map_round"]
    assert report["asked"] == 4000 and report["landmarks"] < 4000
    assert report["why"].startswith(f"{report['landmarks']} of 4000 asked: ")
    assert "at most one per 5 rows of a class" in report["why"]
