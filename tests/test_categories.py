"""Category columns: a text column of a few values, encoded one 0/1 column per value with
the values agreed across sites by name; the saved model encodes a raw table the same way."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pandas as pd
import pytest

from gems_fl.api import load_model
from gems_fl.data.categories import CategoryError, parse_categories
from gems_fl.data.site_files import SiteFileError, read_site_file
from gems_fl.protocol.attendance import RequiredNodesMissing
from gems_fl.running.check_data import check_data
from gems_fl.running.cli import main
from tests.helpers import run_in_process
from tests.sitegen import blobs

OWN = {"dataset": "node-files", "evaluate-on-server": False, "space": "ball", "eps": 0.5,
       "standardize": "federated"}
PLANS = {"adelie": "basic", "chinstrap": "premium", "gentoo": "gold"}


def _site(folder, name, seed, plans=None, n=150):
    """A site whose 'plan' column names its class (a few rows off), 'region' none;
    ``plans`` limits the plan values it holds (rows of the others become 'basic')."""
    x, y = blobs(n, 4, seed)
    rng = np.random.default_rng(seed)
    plan = [PLANS[c] if rng.random() > 0.1 else "basic" for c in y]
    if plans is not None:
        plan = [p if p in plans else "basic" for p in plan]
    region = rng.choice(["north", "south"], n)
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in (("", slice(0, 90)), ("_val", slice(90, 120)), ("_test", slice(120, n))):
        with (folder / f"{name}{split}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["f0", "plan", "f1", "region", "f2", "f3", "species"])
            for i in range(n)[rows]:
                w.writerow([x[i, 0], plan[i], x[i, 1], region[i], x[i, 2], x[i, 3], y[i]])
    return folder / f"{name}.csv"


def test_a_site_s_text_columns_of_a_few_values_become_0_1_columns(tmp_path):
    site = read_site_file(_site(tmp_path, "a", 0))
    assert site.categories == {"plan": ["basic", "gold", "premium"], "region": ["north", "south"]}
    assert site.columns == ["f0", "f1", "f2", "f3", "plan=basic", "plan=gold", "plan=premium",
                            "region=north", "region=south"]
    for x in site.x.values():
        np.testing.assert_array_equal(x[:, 4:7].sum(1), 1.0)
    assert site.positions == [0, 2, 4, 5, 1, 1, 1, 3, 3]  # messages name the file's column
    declared = read_site_file(tmp_path / "a.csv", categories="plan=basic|gold|premium|silver")
    assert declared.categories["plan"] == ["basic", "gold", "premium", "silver"]
    with pytest.raises(SiteFileError, match=r"'plan' holds value\(s\) 'gold' that are not among"):
        read_site_file(tmp_path / "a.csv", categories="plan=basic|premium")


def test_a_text_column_of_many_values_is_refused_with_both_fixes(tmp_path):
    path = tmp_path / "t.csv"
    rows = ["a,note,species"] + [f"{i},note {i % 40},x{i % 2}" for i in range(80)]
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(SiteFileError) as error:
        read_site_file(path)
    message = str(error.value)
    assert "column 'note' (column 1, counted from 0) holds text" in message
    assert "40 distinct" in message and "at most 32 values" in message
    assert "id-columns" in message and "drop it" in message


def test_categories_setting_is_checked():
    assert parse_categories("plan=basic|gold; region=n|s") == {
        "plan": ["basic", "gold"], "region": ["n", "s"]}
    for bad in ("plan", "plan=a|a", "plan=a||b"):
        with pytest.raises(CategoryError, match="must read column=value"):
            parse_categories(bad)


def test_sites_holding_different_values_agree_on_every_value_by_name(tmp_path, capsys):
    """site-0 never saw 'gold': it gets a column of zeros there; the run keeps all three
    sites, the saved model encodes a raw table, and predict scores a site's raw file."""
    configs = [{"data-path": str(_site(tmp_path / "s", f"site-{k}", k,
                                       plans={"basic", "premium"} if k == 0 else None)),
                "node-name": f"site-{k}"} for k in range(3)]
    results = run_in_process(3, tmp_path / "out", node_configs=configs, **OWN)
    assert len(results["participants"]) == 3, results["rejected"]
    assert results["dataset"]["categories"] == {"plan": ["basic", "gold", "premium"],
                                                "region": ["north", "south"]}
    assert results["dataset"]["num_features"] == 9
    model = load_model(tmp_path / "out" / "run-1")
    raw = pd.read_csv(tmp_path / "s" / "site-1_test.csv")
    table = raw.drop(columns="species")
    predicted = model.predict(table)
    accuracy = float(np.mean(predicted == raw["species"].to_numpy()))
    expected = results["verification"]["per_node"]["site-1"]["accuracy"]["gems"]
    assert accuracy == pytest.approx(expected)
    assert main(["predict", str(tmp_path / "out" / "run-1"),
                 str(tmp_path / "s" / "site-1_test.csv")]) == 0
    assert f"accuracy {expected:.4f}" in capsys.readouterr().out
    unseen = table.copy()
    unseen.loc[0, "plan"] = "platinum"
    with pytest.raises(ValueError, match=r"'plan' holds value\(s\) 'platinum'"):
        model.predict(unseen)


def test_check_data_gives_every_file_every_value(tmp_path):
    a = _site(tmp_path, "a", 0, plans={"basic", "premium"})
    b = _site(tmp_path, "b", 1)
    out = io.StringIO()
    assert check_data([str(a), str(b)], out=out) == 0, out.getvalue()
    text = out.getvalue()
    assert "category column plan: 3 value(s) over the files (basic, gold, premium)" in text
    assert "OK: the 2 files agree on 9 features by column name" in text


def test_under_dp_undeclared_categories_leave_the_site_out_with_the_fix(tmp_path):
    configs = [{"data-path": str(_site(tmp_path / "s", f"site-{k}", k)), "node-name": f"site-{k}"}
               for k in range(3)]
    dp = {**OWN, "space": "gram", "standardize": "off", "dp-epsilon": 8.0, "dp-seeded-noise": True,
          "min-good-enough": "0", "required-nodes": "1"}
    with pytest.raises(RequiredNodesMissing, match=r"site-0 \(rejected: node 'site-0'"):
        run_in_process(3, tmp_path / "out", node_configs=configs, **dp)
    stopped = json.loads((tmp_path / "out" / "run-1" / "results.json").read_text())
    assert {r["node_name"] for r in stopped["rejected"]} == {"site-0", "site-1", "site-2"}
    assert all("categories='plan=basic|gold|premium; region=north|south'" in r["reason"]
               for r in stopped["rejected"])
    declared = "plan=basic|gold|premium; region=north|south"
    results = run_in_process(3, tmp_path / "out2", node_configs=configs, **dp,
                             categories=declared)
    assert len(results["participants"]) == 3
    assert results["dataset"]["categories"]["plan"] == ["basic", "gold", "premium"]
