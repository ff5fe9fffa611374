"""One table, simulated sites: ``gems-fl split`` and ``gems-fl run --table``."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pandas as pd
import pytest
from sklearn.datasets import load_wine

from gems_fl.data.site_files import SiteFileError
from gems_fl.data.table_split import split_table
from gems_fl.running.check_data import check_data
from gems_fl.running.cli import main


@pytest.fixture
def table(tmp_path):
    """scikit-learn's wine as a user's CSV: text labels, an ID column, a category column."""
    frame = load_wine(as_frame=True).frame
    frame.insert(0, "patient_id", [f"P{i:04d}" for i in range(len(frame))])
    frame.insert(3, "cellar", np.where(frame["alcohol"] > 13, "north", "south"))
    frame["target"] = frame["target"].map({0: "barolo", 1: "grignolino", 2: "barbera"})
    path = tmp_path / "wine.csv"
    frame.to_csv(path, index=False)
    return path


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_the_sites_and_the_test_file_hold_every_row_once_with_the_header(table, tmp_path):
    done = split_table(table, 5, tmp_path / "sites", division="dirichlet:0.3", seed=2)
    header, *body = _rows(table)
    parts = [_rows(p) for p in [*done.sites, done.test]]
    assert all(part[0] == header for part in parts)
    held = sorted(tuple(r) for part in parts for r in part[1:])
    assert held == sorted(tuple(r) for r in body)  # every row once, cells as they were
    assert done.test_rows == len(_rows(done.test)) - 1 == pytest.approx(0.2 * len(body), abs=3)
    test_labels = pd.read_csv(done.test)["target"].value_counts()
    assert set(test_labels.index) == set(done.classes)  # per class: stratified
    # Dirichlet(0.3): label skew; the same seed gives the same files, another seed others
    shares = np.array([[c.get(k, 0) for k in done.classes] for c in done.counts], dtype=float)
    assert (shares.max(1) / shares.sum(1)).mean() > 0.6
    again = split_table(table, 5, tmp_path / "again", division="dirichlet:0.3", seed=2)
    assert [_rows(p) for p in again.sites] == parts[:-1]
    other = split_table(table, 5, tmp_path / "other", division="dirichlet:0.3", seed=3)
    assert [_rows(p) for p in other.sites] != parts[:-1]


def test_iid_and_explicit_groups_divide_as_the_bundled_datasets_do(table, tmp_path):
    iid = split_table(table, 3, tmp_path / "iid", division="iid")
    assert all(set(c) == set(iid.classes) for c in iid.counts)
    groups = split_table(table, 2, tmp_path / "g", division="0,1/2")
    assert [sorted(c) for c in groups.counts] == [["barbera", "barolo"], ["grignolino"]]
    with pytest.raises(SiteFileError, match="label-division"):
        split_table(table, 2, tmp_path / "bad", division="dirichlet:-1")
    with pytest.raises(SiteFileError, match="give an existing .csv"):
        split_table(tmp_path / "none.csv", 2, tmp_path / "x")


def test_gems_fl_split_writes_files_check_data_accepts_and_says_what_next(table, tmp_path,
                                                                         capsys):
    out = tmp_path / "sites"
    assert main(["split", str(table), "--sites", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "into 4 sites by dirichlet:0.5 (seed 0)" in text
    assert f"gems-fl check-data {out / 'site-0.csv'}" in text
    assert f"gems-fl predict gems-results/run-<id> {out / 'test.csv'}" in text
    report = io.StringIO()
    files = [str(out / f"site-{k}.csv") for k in range(4)]
    assert check_data(files, out=report) == 0, report.getvalue()
    assert "left out 1 ID-like column(s): patient_id" in report.getvalue()
    assert "category column cellar" in report.getvalue()
    assert main(["split", str(tmp_path / "missing.csv")]) == 2
    assert "give an existing .csv" in capsys.readouterr().err


def test_run_table_refuses_site_files_beside_it(table, capsys):
    assert main(["run", "--table", str(table), "--site", str(table)]) == 2
    assert "--table makes the sites' files" in capsys.readouterr().err


@pytest.mark.slow
def test_one_command_rehearses_a_dirichlet_federation_on_one_table(table, tmp_path):
    """`gems-fl run --table` cuts the table into 5 Dirichlet sites and runs on them as
    --site does; gems-fl predict then scores the model on the held-out test.csv."""
    from tests.test_end_to_end import _gems_fl

    proc = _gems_fl("--table", str(table), "--nodes", "5", "--division", "dirichlet:0.5",
                    tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    (path,) = tmp_path.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert [p["name"] for p in results["participants"]] == [f"site-{k}" for k in range(5)]
    assert results["dataset"]["categories"] == {"cellar": ["north", "south"]}
    test_file = tmp_path / "wine-sites" / "test.csv"
    assert f"gems-fl predict <the run's folder> {test_file}" in proc.stdout
    assert main(["predict", str(path.parent), str(test_file)]) == 0
