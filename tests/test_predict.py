"""``gems-fl predict``: a finished run's model scored on a user's own file."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from gems_fl.api import GEMSModel, load_model
from gems_fl.data.scoring_rows import read_scoring_rows
from gems_fl.data.site_files import SiteFileError
from gems_fl.running.cli import main
from gems_fl.running.predict import predict_file
from tests.helpers import run_in_process
from tests.sitegen import blobs, write_csv

OWN = {"dataset": "node-files", "evaluate-on-server": False, "space": "ball", "eps": 0.5,
       "standardize": "federated"}


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_predict_scores_a_site_s_test_file_as_the_run_did(tmp_path, sites, capsys):
    results = run_in_process(3, tmp_path / "out", node_configs=sites, **OWN)
    folder = tmp_path / "out" / "run-1"
    test_file = tmp_path / "sites" / "site-0_test.csv"
    # the columns in another order and an ID column: matched by name, the ID left out
    header, *body = list(csv.reader(open(test_file)))
    order = [*reversed(range(len(header) - 1)), len(header) - 1]
    shuffled = tmp_path / "mine.csv"
    with shuffled.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rownames", *(header[i] for i in order)])
        w.writerows([[k + 1, *(row[i] for i in order)] for k, row in enumerate(body)])
    assert main(["predict", str(folder), str(shuffled)]) == 0
    out = capsys.readouterr().out
    expected = results["verification"]["per_node"]["site-0"]["accuracy"]["gems"]
    assert f"accuracy {expected:.4f}" in out, out
    assert "left out 1 column(s) the model does not take: rownames" in out
    assert "label column: species" in out and "confusion counts" in out
    written = _rows(folder / "predictions-mine.csv")
    assert len(written) == len(body)
    model = load_model(folder)
    probs = np.array([[float(r[f"p_{c}"]) for c in model.classes] for r in written])
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)
    assert [r["predicted"] for r in written] == [model.classes[i] for i in probs.argmax(1)]
    accuracy = np.mean([r["predicted"] == r["label"] for r in written])
    assert accuracy == pytest.approx(expected)


def _model(names=("a", "b", "c")) -> GEMSModel:
    rng = np.random.default_rng(0)
    return GEMSModel([(rng.normal(size=(2, 3)), rng.normal(size=2))], ["no", "yes"],
                     feature_names=None if names is None else list(names))


def test_predict_proba_is_the_softmax_of_the_logits_and_agrees_with_predict():
    model = _model()
    x = np.random.default_rng(1).normal(size=(7, 3))
    p = model.predict_proba(x)
    z = model.logits(x)
    np.testing.assert_allclose(p, np.exp(z) / np.exp(z).sum(1, keepdims=True))
    assert list(model.predict(x)) == [model.classes[i] for i in p.argmax(1)]


def _csv(path, header, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return path


def test_a_missing_text_or_empty_column_is_named(tmp_path):
    names = ["a", "b", "c"]
    with pytest.raises(SiteFileError, match=r"lacks column\(s\) c that the model takes"):
        read_scoring_rows(_csv(tmp_path / "m.csv", ["a", "b", "y"], [[1, 2, "no"]]), names, 3)
    with pytest.raises(SiteFileError, match=r"'b' is empty, NaN or infinite in 1 row\(s\) "
                       r"\(first: data row 2\)"):
        read_scoring_rows(_csv(tmp_path / "n.csv", ["c", "b", "a"], [[1, 2, 3], [1, "", 3]]),
                          names, 3)
    with pytest.raises(SiteFileError, match=r"'a' holds text \('x'\)"):
        read_scoring_rows(_csv(tmp_path / "t.csv", ["a", "b", "c"], [["x", 2, 3]]), names, 3)
    with pytest.raises(SiteFileError, match="name the label column with --label-column"):
        read_scoring_rows(_csv(tmp_path / "two.csv", ["a", "b", "c", "y", "z"],
                               [[1, 2, 3, "no", 4.5], [1, 2, 3, "yes", 2.5],
                                [1, 2, 3, "no", 2.5]]), names, 3)
    picked = read_scoring_rows(tmp_path / "two.csv", names, 3, label_column="y")
    assert list(picked.labels) == ["no", "yes", "no"] and picked.ignored == ["z"]


def test_files_without_names_are_taken_by_position_with_or_without_labels(tmp_path):
    plain = read_scoring_rows(_csv(tmp_path / "p.csv", None, [[1, 2, 3], [4, 5, 6]]), None, 3)
    assert plain.labels is None and plain.x.tolist() == [[1, 2, 3], [4, 5, 6]]
    labelled = read_scoring_rows(_csv(tmp_path / "l.csv", None, [["no", 1, 2, 3]]), None, 3,
                                 label_column="0")
    assert list(labelled.labels) == ["no"] and labelled.x.tolist() == [[1, 2, 3]]
    with pytest.raises(SiteFileError, match="has 5 columns; the model takes 3"):
        read_scoring_rows(_csv(tmp_path / "w.csv", None, [[1, 2, 3, 4, 5]]), None, 3)
    np.savez(tmp_path / "t.npz", x_test=np.ones((4, 3)), y_test=np.array([0, 1, 1, 0]),
             columns=np.array(["c", "a", "b"]))
    rows = read_scoring_rows(tmp_path / "t.npz", ["a", "b", "c"], 3)
    assert list(rows.labels) == ["0", "1", "1", "0"] and rows.x.shape == (4, 3)


def test_rows_without_labels_get_predictions_only(tmp_path):
    model = _model().save(tmp_path / "model")
    x, _ = blobs(5, 3, seed=0)
    path = write_csv(tmp_path / "new.csv", x, ["?"] * 5, names=["a", "b", "c"])
    rows = [r[:-1] for r in csv.reader(open(path))]
    _csv(path, None, rows)  # the header row stays first; the label column goes
    buffer = io.StringIO()
    assert predict_file(model, path, out=buffer) == 0
    assert "no label column: predictions only" in buffer.getvalue()
    written = _rows(model / "predictions-new.csv")
    assert len(written) == 5 and "label" not in written[0]


def test_a_bad_file_exits_2_with_the_reason(tmp_path, capsys):
    model = _model().save(tmp_path / "model")
    missing = _csv(tmp_path / "m.csv", ["a", "b", "y"], [[1, 2, "no"]])
    assert main(["predict", str(model), str(missing)]) == 2
    assert "lacks column(s) c" in capsys.readouterr().err
    assert main(["predict", str(tmp_path / "nowhere"), str(missing)]) == 2
    assert "pass the folder of a finished run" in capsys.readouterr().err
