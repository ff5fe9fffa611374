"""A verdict needs rows (DESIGN.md 3e): a node with fewer than MIN_VERDICT_ROWS validation
rows judges h_G on its validation and training rows together, and the server counts that
verdict; a node with enough validation rows judges on them alone, as before."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from gems_fl.protocol import wire
from gems_fl.protocol.replies import ReplyError
from gems_fl.protocol.verify import (
    GEMS_KEY,
    MIN_VERDICT_ROWS,
    VERDICT_KEY,
    decode_check,
    encode_evaluate,
    score_models,
)


def _model_predicting(cls: int, features: int = 2, classes: int = 2) -> dict[str, np.ndarray]:
    bias = np.zeros(classes)
    bias[cls] = 5.0
    return {"weight": np.zeros((classes, features)), "bias": bias}


def _check(x_val, y_val, x_train, y_train):
    content = encode_evaluate({}, {GEMS_KEY: _model_predicting(0)})
    reply = score_models(content, 0.5, x_val, y_val, x_train=x_train, y_train=y_train)
    return decode_check(1, "site", reply)


def test_one_validation_row_does_not_decide_the_verdict():
    rng = np.random.default_rng(0)
    x_train, y_train = rng.normal(size=(30, 2)), np.zeros(30, dtype=int)  # all class 0
    check = _check(rng.normal(size=(1, 2)), np.array([1]), x_train, y_train)
    assert check.val[GEMS_KEY] == 0.0  # wrong on its one validation row
    assert check.verdict_rows == 31 and check.verdict == pytest.approx(30 / 31)
    assert check.good_enough  # judged on its 31 rows, not on the one


def test_enough_validation_rows_decide_alone():
    rng = np.random.default_rng(0)
    y_val = np.array([1] * MIN_VERDICT_ROWS)
    check = _check(rng.normal(size=(MIN_VERDICT_ROWS, 2)), y_val,
                   rng.normal(size=(30, 2)), np.zeros(30, dtype=int))
    assert check.verdict is None and check.verdict_rows is None
    assert not check.good_enough  # 0 of its 20 validation rows


def test_a_verdict_without_its_row_count_is_refused():
    content = RecordDict({wire.METRICS_KEY: MetricRecord({
        "eps": 0.5, "num-val-examples": 1, "num-test-examples": 0, f"val.{GEMS_KEY}": 1.0,
        VERDICT_KEY: 1.0})})
    with pytest.raises(ReplyError, match="without the other"):
        decode_check(1, "site", content)
