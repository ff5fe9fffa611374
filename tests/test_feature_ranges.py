"""Declared feature ranges (``feature-ranges``, ``standardize='ranges'``): a scaling known
without the rows, the one a differentially private run on own files can use."""

from __future__ import annotations

import numpy as np
import pytest

from gems_fl.data.feature_ranges import FeatureRangesError, read_feature_ranges
from gems_fl.settings import Settings, SettingsError
from tests.helpers import run_in_process
from tests.sitegen import site_config

NAMES = [f"f{i}" for i in range(13)]


def _write(path, rows, header="feature,min,max"):
    path.write_text(header + "\n" + "\n".join(",".join(map(str, r)) for r in rows) + "\n")
    return path


def test_ranges_map_min_and_max_to_minus_one_and_one_by_name_or_position(tmp_path):
    ranges = read_feature_ranges(_write(tmp_path / "r.csv", [("b", 0, 10), ("a", -4, 4), ("c", 3, 3)]))
    centre, half = ranges.scaling(["a", "b", "c"], 3)
    np.testing.assert_array_equal(centre, [0.0, 5.0, 3.0])
    np.testing.assert_array_equal(half, [4.0, 5.0, 1.0])  # a constant feature keeps scale 1
    x = np.array([[-4.0, 0.0, 3.0], [4.0, 10.0, 3.0]])
    np.testing.assert_array_equal((x - centre) / half, [[-1, -1, 0], [1, 1, 0]])
    numbered = read_feature_ranges(_write(tmp_path / "n.csv", [(1, 0, 2), (0, 0, 4)]))
    centre, half = numbered.scaling(None, 2)
    np.testing.assert_array_equal(centre, [2.0, 1.0])
    with pytest.raises(FeatureRangesError, match=r"no row for the sites' column\(s\) d"):
        ranges.scaling(["a", "d"], 2)
    with pytest.raises(FeatureRangesError, match=r"has 2 row\(s\) for 3 features"):
        numbered.scaling(None, 3)


@pytest.mark.parametrize("rows, header, message", [
    ([("a", 0, 1)], "name,lo,hi", "first line must be the header 'feature,min,max'"),
    ([("a", "low", 1)], "feature,min,max", "line 2: min and max must be numbers"),
    ([("a", 2, 1)], "feature,min,max", r"line 2 \(a\): need finite min <= max"),
    ([("a", 0, 1), ("a", 0, 2)], "feature,min,max", "line 3: feature 'a' is named twice"),
    ([], "feature,min,max", "no feature rows below the header"),
])
def test_a_malformed_ranges_file_says_what_is_wrong(tmp_path, rows, header, message):
    with pytest.raises(FeatureRangesError, match=message):
        read_feature_ranges(_write(tmp_path / "r.csv", rows, header))
    with pytest.raises(FeatureRangesError, match="cannot read it"):
        read_feature_ranges(tmp_path / "missing.csv")


def test_auto_is_ranges_when_declared_also_under_dp_and_the_two_settings_come_together(tmp_path):
    path = str(_write(tmp_path / "r.csv", [("f0", 0, 1)]))
    own = {"dataset": "node-files", "evaluate-on-server": False}
    assert Settings(**{"feature_ranges": path}, **{k.replace("-", "_"): v for k, v in own.items()}
                    ).standardize == "ranges"
    private = Settings(dataset="node-files", evaluate_on_server=False, dp_epsilon=4.0,
                       feature_ranges=path)
    assert private.standardize == "ranges"
    assert Settings(dataset="node-files", evaluate_on_server=False, dp_epsilon=4.0).standardize == "off"
    with pytest.raises(SettingsError, match="standardize='ranges' scales with declared ranges"):
        Settings.from_run_config({"dataset": "node-files", "evaluate-on-server": False,
                                  "standardize": "ranges"})
    with pytest.raises(SettingsError, match="is read only with standardize 'ranges' or 'auto'"):
        Settings.from_run_config({"dataset": "node-files", "evaluate-on-server": False,
                                  "standardize": "federated", "feature-ranges": path})
    with pytest.raises(SettingsError, match="declare the features' ranges with feature-ranges"):
        Settings.from_run_config({"dataset": "node-files", "evaluate-on-server": False,
                                  "standardize": "federated", "dp-epsilon": 4.0})


def test_a_dp_run_on_own_files_scales_with_the_declared_ranges_matched_by_name(tmp_path):
    """Every site, one with its columns reversed, scales with the declared ranges in the
    run's column order; the results record it; the scaling spent nothing of epsilon (the
    identity round carries no feature sums)."""
    sites = [site_config(tmp_path / "sites", f"site-{k}", seed=k) for k in range(2)]
    sites.append(site_config(tmp_path / "rev", "site-2", seed=2, order=list(reversed(range(13)))))
    low = [-50.0 - 10 * i for i in range(13)]
    high = [60.0 + 20 * i for i in range(13)]
    path = _write(tmp_path / "ranges.csv", reversed(list(zip(NAMES, low, high))))  # any order
    results = run_in_process(3, tmp_path / "out", node_configs=sites, space="gram",
                             dataset="node-files", **{"evaluate-on-server": False,
                                                      "feature-ranges": str(path),
                                                      "dp-epsilon": 8.0, "dp-seeded-noise": True,
                                                      "min-good-enough": "0"})
    assert results["dataset"]["standardize"] == "ranges"
    assert results["dataset"]["columns"] == NAMES
    np.testing.assert_allclose(results["dataset"]["scale"]["mean"],
                               (np.array(low) + np.array(high)) / 2)
    np.testing.assert_allclose(results["dataset"]["scale"]["std"],
                               (np.array(high) - np.array(low)) / 2)
    assert results["privacy"]["dp"]["epsilon"] == 8.0
    assert not results["notes"] or all("not scaled" not in n for n in results["notes"])
