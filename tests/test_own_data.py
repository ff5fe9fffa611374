"""Own data on the nodes (dataset='node-files'): agreement, label mapping, scaling,
node-side evaluation, check-data. In-process, through the real apps."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gems_fl.data.agreement import DataAgreement
from gems_fl.data.nodes import NodeDataError, load_node_data
from gems_fl.data.site_files import SiteFileError, combine_stats, feature_stats, read_site_file
from gems_fl.settings import Settings, SettingsError
from gems_fl.settings.options import node_data_options
from tests.helpers import run_in_process
from tests.sitegen import CLASSES, blobs, site_config, write_csv

OWN = {"dataset": "node-files", "evaluate-on-server": False, "space": "ball", "eps": 0.5}


# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def test_three_csv_sites_with_string_labels_run_and_report_per_node_and_pooled(tmp_path, sites):
    odd = site_config(tmp_path / "sites", "site-odd", seed=9, num_features=11)
    results = run_in_process(4, tmp_path / "out", node_configs=[*sites, odd],
                             **OWN, standardize="federated", **{"required-nodes": "3"})
    assert results["attendance"]["line"] == (  # headers: the missing columns by name
        "completed with 3 of 4 sites; left out: site-odd (node 'site-odd' lacks column(s) f11, "
        "f12 that the run has (columns are matched by name) (held by 3 of 4 nodes with a "
        "header: site-0, site-1, site-2))")
    assert results["dataset"]["num_features"] == 13
    assert results["dataset"]["classes"] == list(CLASSES)
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1", "site-2"]
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-odd"
    assert "lacks column(s) f11, f12" in rejected["reason"]
    assert "site-0, site-1, site-2" in rejected["reason"]
    ver = results["verification"]
    assert set(ver["per_node"]) == {"site-0", "site-1", "site-2"}
    for entry in ver["per_node"].values():
        assert entry["split"] == "test" and entry["samples"] == 48
        assert {"gems", "averaged", "local.site-0", "local.site-1", "local.site-2"} <= set(entry["accuracy"])
    pooled = ver["pooled"]
    manual = np.mean([e["accuracy"]["gems"] for e in ver["per_node"].values()])
    assert pooled["gems"] == pytest.approx(manual)  # equal sample counts
    assert pooled["gems"] > 0.8 and pooled["averaged"] > 0.5
    assert set(results["dataset"]["scale"]) == {"mean", "std"}


def test_sites_are_matched_by_column_name_whatever_their_order(tmp_path, sites):
    """A site whose CSV holds the same columns in another order trains on the run's order:
    the run is bit-identical to one where every site has the same order (federated
    scaling included); a site with other column names is left out, naming them."""
    same = run_in_process(3, tmp_path / "same", node_configs=sites, **OWN, **NO_CHECK,
                          standardize="federated")
    shuffled = [*sites[:2], site_config(tmp_path / "shuffled", "site-2", seed=2,
                                        order=list(reversed(range(13))))]
    assert read_site_file(shuffled[2]["data-path"]).columns[0] == "f12"
    other = run_in_process(3, tmp_path / "other", node_configs=shuffled, **OWN, **NO_CHECK,
                           standardize="federated")
    assert other["dataset"]["columns"] == [f"f{i}" for i in range(13)]
    model = lambda root: (root / "run-1" / "gems_model.npz").read_bytes()
    assert model(tmp_path / "same") == model(tmp_path / "other")
    assert other["rows"] == same["rows"] and other["dataset"]["scale"] == same["dataset"]["scale"]
    renamed = site_config(tmp_path / "renamed", "site-renamed", seed=3,
                          names=[f"f{i}" for i in range(12)] + ["weight"])
    results = run_in_process(4, tmp_path / "left", node_configs=[*sites, renamed], **OWN,
                             **NO_CHECK, **{"required-nodes": "3"})
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-renamed"
    assert ("has column(s) weight that the run lacks; lacks column(s) f12 that the run has "
            "(columns are matched by name) (held by 3 of 4 nodes with a header: site-0, "
            "site-1, site-2)") in rejected["reason"]


def test_a_companion_file_is_read_in_the_training_files_column_order(tmp_path):
    x, y = blobs(40, 4, 0)
    write_csv(tmp_path / "s.csv", x, y)
    write_csv(tmp_path / "s_val.csv", x[:10], y[:10], order=[2, 0, 3, 1])
    site = read_site_file(tmp_path / "s.csv")
    assert site.columns == ["f0", "f1", "f2", "f3"]
    np.testing.assert_array_equal(site.x["val"], x[:10])
    write_csv(tmp_path / "s_val.csv", x[:10], y[:10], names=["f0", "f1", "f2", "size"])
    with pytest.raises(SiteFileError, match="has column.s. size that the training file lacks"):
        read_site_file(tmp_path / "s.csv")


def test_a_text_feature_column_is_named_with_its_values_and_what_to_do(tmp_path):
    path = tmp_path / "t.csv"
    rows = ["a,colour,b,species"] + [f"{i},{c},{i * 2},x{i % 2}"  # text among numbers
                                     for i, c in enumerate(["red", "blue", "red", "green", 4] * 3)]
    path.write_text("\n".join(rows) + "\n")
    (tmp_path / "t_val.csv").write_text(path.read_text())
    with pytest.raises(SiteFileError) as error:
        read_site_file(path)
    message = str(error.value)
    assert "column 'colour' (column 1, counted from 0) holds text in 12 row(s) ('red', 'blue', 'green'; 3 distinct)" in message
    assert "id-columns (e.g. --id-columns <name>)" in message and "else drop it" in message


def _fails_in_training(node_id: int):
    """A reply hook: node ``node_id`` answers every train message with an error (a site
    that dies after the identity round)."""
    from flwr.app import Error, Message, RecordDict

    def hook(reply):
        if reply.metadata.src_node_id != node_id:
            return reply
        request = Message(RecordDict(), dst_node_id=node_id,
                          message_type=reply.metadata.message_type, group_id=reply.metadata.group_id)
        request.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
        return Message(Error(code=7, reason="killed"), reply_to=request)
    return hook


def test_the_same_surviving_sites_give_the_same_model_whenever_the_others_left(tmp_path, sites):
    """A site that dies after the identity round took part in the agreement (its sums in
    the federated scaling): the rounds run again without it, so the model is the one the
    survivors give alone, whether the lost site never came, was rejected at the identity
    round, or died in training, and whatever node it was."""
    fourth = site_config(tmp_path / "sites", "site-3", seed=3)
    odd = site_config(tmp_path / "sites", "site-odd", seed=3, num_features=9)
    fewer = {**OWN, **NO_CHECK, "standardize": "federated", "required-nodes": "3"}
    runs = {
        "alone": run_in_process(3, tmp_path / "alone", node_configs=sites, **fewer),
        "rejected": run_in_process(4, tmp_path / "rejected", node_configs=[*sites, odd], **fewer),
        "died": run_in_process(4, tmp_path / "died", node_configs=[*sites, fourth],
                               reply_hook=_fails_in_training(1003), **fewer),
        "died-first": run_in_process(4, tmp_path / "died-first", node_configs=[fourth, *sites],
                                     reply_hook=_fails_in_training(1000), **fewer),
    }
    model = lambda name: (tmp_path / name / "run-1" / "gems_model.npz").read_bytes()
    assert len({model(name) for name in runs}) == 1
    assert len({str(r["dataset"]["scale"]) for r in runs.values()}) == 1
    died = runs["died"]
    assert died["attendance"]["line"] == "completed with 3 of 4 sites; left out: site-3 (killed)"
    (attempt,) = died["abandoned_attempts"]
    assert attempt["lost"] == ["site-3"] and attempt["rounds"]  # its bytes are kept
    assert "abandoned_attempts" not in runs["alone"]


def test_label_mapping_is_shared_even_when_a_node_lacks_a_class(tmp_path):
    x, y = blobs(120, 5, 0)
    only_two = y != "gentoo"
    write_csv(tmp_path / "a.csv", x[only_two], y[only_two])
    write_csv(tmp_path / "a_val.csv", x[only_two][:10], y[only_two][:10])
    settings = Settings(dataset="node-files", evaluate_on_server=False)
    agreement = DataAgreement(5, list(CLASSES))
    data = load_node_data(node_data_options(settings), {"data-path": str(tmp_path / "a.csv")}, agreement)
    assert data.num_classes == 3 and data.classes == list(CLASSES)
    expected = np.array([CLASSES.index(v) for v in y[only_two]])
    np.testing.assert_array_equal(data.y_train, expected)
    # Without the agreement (the identity query) the node reports what it holds.
    alone = load_node_data(node_data_options(settings), {"data-path": str(tmp_path / "a.csv")})
    assert alone.present_classes == ["adelie", "chinstrap"]


def test_federated_standardisation_equals_pooled_statistics(tmp_path, sites):
    settings = Settings(dataset="node-files", evaluate_on_server=False, standardize="federated")
    raw = [read_site_file(c["data-path"]).x["train"] for c in sites]
    mean, std = combine_stats([feature_stats(x) for x in raw])
    pooled = np.concatenate(raw)
    np.testing.assert_allclose(mean, pooled.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(std, pooled.std(axis=0), rtol=1e-6)
    agreement = DataAgreement(13, list(CLASSES), mean, std)
    scaled = [load_node_data(node_data_options(settings), c, agreement) for c in sites]
    for data, x in zip(scaled, raw):
        np.testing.assert_allclose(data.x_train, (x - mean) / std, rtol=1e-9)
        np.testing.assert_array_equal(data.scale[0], mean)
    everything = np.concatenate([d.x_train for d in scaled])
    np.testing.assert_allclose(everything.mean(axis=0), 0, atol=1e-9)
    np.testing.assert_allclose(everything.std(axis=0), 1, atol=1e-9)


def test_the_run_sends_every_node_the_same_scaling(tmp_path, sites):
    results, grid = run_in_process(3, tmp_path / "out", node_configs=sites, return_grid=True,
                                   **OWN, standardize="federated")
    raw = np.concatenate([read_site_file(c["data-path"]).x["train"] for c in sites])
    np.testing.assert_allclose(results["dataset"]["scale"]["mean"], raw.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(results["dataset"]["scale"]["std"], raw.std(axis=0), rtol=1e-6)


def test_own_files_are_scaled_by_default_and_the_run_records_it(tmp_path, sites):
    """standardize='auto' (the default) is federated scaling for sites' own files, off for
    a named dataset and under dp-epsilon (the sums would leave unnoised); a node whose
    model fails on unscaled features is told to scale them first."""
    from gems_fl.geometry.eps import zero_radius_reason

    results = run_in_process(3, tmp_path / "out", node_configs=sites, **OWN, **NO_CHECK)
    assert results["settings"]["standardize"] == "federated"
    assert results["dataset"]["standardize"] == "federated" and "scale" in results["dataset"]
    assert Settings().standardize == "off"
    assert Settings(dataset="node-files", evaluate_on_server=False, dp_epsilon=4.0).standardize == "off"
    assert "standardize='federated'" in zero_radius_reason(0.25, 0.5, unscaled=True)
    assert "scale" not in zero_radius_reason(0.25, 0.5)


def test_pinned_classes_and_features_leave_out_nodes_that_disagree(tmp_path, sites):
    x, y = blobs(60, 13, 5)
    y = np.where(y == "gentoo", "emperor", y)
    bad = tmp_path / "bad.csv"
    write_csv(bad, x, y)
    write_csv(tmp_path / "bad_val.csv", x[:10], y[:10])
    results = run_in_process(4, tmp_path / "out", node_configs=[*sites, {
        "data-path": str(bad), "node-name": "site-emperor"}], **OWN,
        classes=",".join(CLASSES), **{"num-features": 13, "required-nodes": "site-0,site-1,site-2"})
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-emperor" and "emperor" in rejected["reason"]


def test_malformed_files_are_rejected_at_the_identity_round_with_the_node_name(tmp_path, sites):
    x, y = blobs(40, 13, 1)
    np.savez(tmp_path / "noval.npz", x_train=x, y_train=y, x_val=x[:5])
    x_nan = x.copy()
    x_nan[3, 2] = np.nan
    np.savez(tmp_path / "nan.npz", x_train=x_nan, y_train=y, x_val=x[:5], y_val=y[:5])
    configs = [*sites, {"data-path": str(tmp_path / "noval.npz"), "node-name": "site-noval"},
               {"data-path": str(tmp_path / "nan.npz"), "node-name": "site-nan"}]
    results = run_in_process(5, tmp_path / "out", node_configs=configs, **OWN,
                             **{"required-nodes": "3"})
    by_name = {r["node_name"]: r["reason"] for r in results["rejected"]}
    assert set(by_name) == {"site-noval", "site-nan"}
    assert "node 'site-noval'" in by_name["site-noval"] and "y_val" in by_name["site-noval"]
    assert "node 'site-nan'" in by_name["site-nan"] and "1 NaN" in by_name["site-nan"]


def test_csv_header_label_column_and_test_fraction(tmp_path):
    x, y = blobs(50, 4, 0)
    path = tmp_path / "s.csv"
    with path.open("w") as f:
        f.write("species,a,b,c,d\n")
        for row, label in zip(x, y):
            f.write(",".join([label, *map(str, row)]) + "\n")
    (tmp_path / "s_val.csv").write_text(path.read_text())
    site = read_site_file(path, "species")
    np.testing.assert_allclose(site.x["train"], x)
    assert list(site.y["train"]) == list(y)
    assert read_site_file(path, "0").x["train"].shape == (50, 4)
    settings = Settings(dataset="node-files", evaluate_on_server=False, label_column="species")
    data = load_node_data(node_data_options(settings), {"data-path": str(path), "test-fraction": 0.2})
    assert len(data.y_test) == 10 and len(data.y_train) == 40
    again = load_node_data(node_data_options(settings), {"data-path": str(path), "test-fraction": 0.2})
    np.testing.assert_array_equal(data.x_test, again.x_test)  # seeded by the node


def test_node_files_settings_say_what_to_do():
    with pytest.raises(SettingsError, match="evaluate-on-server=false"):
        Settings(dataset="node-files")
    with pytest.raises(SettingsError, match="standardize"):
        Settings(standardize="global")
    with pytest.raises(SettingsError, match="num-features=5 but dataset='digits' has 64"):
        Settings(num_features=5)
    assert Settings(dataset="node-files", public_data="/x.npz").public_data == "/x.npz"
    with pytest.raises(NodeDataError, match="node 'p'"):
        load_node_data(node_data_options(Settings(dataset="node-files", evaluate_on_server=False)),
                       {"partition-id": 0, "num-partitions": 2, "node-name": "p"})


def test_public_data_tunes_gems_and_raw_and_the_nodes_evaluate_them(tmp_path, sites):
    x, y = blobs(90, 13, 7)
    np.savez(tmp_path / "public.npz", x=x, y=y)
    results = run_in_process(3, tmp_path / "out", node_configs=sites, **OWN, baselines="all",
                             standardize="federated", **{"public-data": str(tmp_path / "public.npz")})
    pooled = results["verification"]["pooled"]
    assert {"gems", "averaged", "gems-tuned", "raw"} <= set(pooled)
    assert results["dataset"]["public_data"]["samples"] == 90
    assert results["rows"]["Raw"]["accuracy"] == pooled["raw"]  # the sites' figure, pooled
    assert "the server holds no test set" in results["rows"]["Raw"]["evaluated_on"]


def test_a_test_only_public_file_is_the_servers_test_set_without_tuning(tmp_path, sites):
    """The held-out set an operator has: an .npz with x_test/y_test only, or a
    <stem>_test.csv. The server evaluates on it; GEMS tuned and Raw are skipped, saying why."""
    x, y = blobs(120, 13, 8)
    np.savez(tmp_path / "heldout.npz", x_test=x, y_test=y)
    write_csv(tmp_path / "heldout_test.csv", x, y)
    for name in ("heldout.npz", "heldout_test.csv"):
        results = run_in_process(3, tmp_path / f"out-{name}", node_configs=sites,
                                 **{**OWN, "evaluate-on-server": True, "standardize": "federated",
                                    "baselines": "all",
                                    "public-data": str(tmp_path / name)})
        rows = results["rows"]
        assert rows["GEMS"]["accuracy"] is not None and rows["Averaged"]["accuracy"] is not None
        for skipped in ("GEMS tuned", "Raw"):
            assert rows[skipped]["accuracy"] is None
            assert "test split only" in rows[skipped]["skipped"]
        assert results["dataset"]["public_data"] == {"path": str(tmp_path / name),
                                                     "samples": 0, "test": 120}


def test_public_data_takes_the_file_or_its_stem(tmp_path):
    """An operator may name the held-out file or its stem: ``/srv/heldout`` and
    ``/srv/heldout.csv`` find ``heldout_test.csv``; a name with no such file is refused
    before anything starts, saying which files were looked for."""
    from gems_fl.data.site_files import public_data_path
    from gems_fl.serverapp.preflight import PreflightError

    x, y = blobs(60, 13, 8)
    write_csv(tmp_path / "heldout_test.csv", x, y)
    np.savez(tmp_path / "pool.npz", x=x, y=y)
    for given in ("heldout", "heldout.csv", "heldout_test.csv"):
        assert public_data_path(str(tmp_path / given)) == tmp_path / "heldout_test.csv"
        _check_public_data(Settings.from_run_config(
            {**OWN, "evaluate-on-server": True, "public-data": str(tmp_path / given)}))
    assert public_data_path(str(tmp_path / "pool")) == tmp_path / "pool.npz"
    assert public_data_path(str(tmp_path / "absent")) is None
    with pytest.raises(PreflightError, match="nor the stem of one"):
        _check_public_data(Settings.from_run_config({**OWN, "public-data": str(tmp_path / "x")}))


def _check_public_data(settings: Settings) -> None:
    from gems_fl.serverapp.preflight import check_public_data
    from gems_fl.settings import DataSettings

    check_public_data(settings.part(DataSettings), settings.evaluate_on_server)


def test_a_public_file_is_checked_before_any_node_is_contacted(tmp_path, sites):
    from gems_fl.serverapp.preflight import PreflightError

    x, y = blobs(40, 13, 9)
    x[5, 3] = np.nan
    np.savez(tmp_path / "nan.npz", x=x, y=y)
    np.savez(tmp_path / "wide.npz", x=np.ones((10, 20)), y=np.zeros(10))
    np.savez(tmp_path / "train_only.npz", x=x[6:], y=y[6:])
    cases = [("nan.npz", {}, "1 NaN"),
             ("wide.npz", {"dataset": "digits"}, "20 features"),
             ("train_only.npz", {"dataset": "node-files", "evaluate-on-server": True},
              "no test split")]
    for name, extra, message in cases:
        settings = Settings.from_run_config({**OWN, **extra, "public-data": str(tmp_path / name)})
        with pytest.raises(PreflightError, match=message):
            _check_public_data(settings)
    calls = []
    with pytest.raises(PreflightError, match="1 NaN"):
        run_in_process(3, tmp_path / "out", node_configs=sites, reply_hook=calls.append,
                       **{**OWN, "public-data": str(tmp_path / "nan.npz")})
    assert calls == []  # no node was asked anything


def test_a_dead_node_is_rejected_once_by_name_and_is_no_participant(tmp_path, sites):
    """Flower answers for a dead node with NODE_UNAVAILABLE from the SuperLink's own id."""
    from tests.helpers import node_unavailable

    results = run_in_process(3, tmp_path / "out", **NO_CHECK, node_configs=sites,
                             reply_hook=node_unavailable(1002),
                             **OWN, **{"required-nodes": "0"})
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-2" and rejected["node_id"] == 1002
    assert "node unavailable" in rejected["reason"]
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1"]


def _check(*args):
    import subprocess
    import sys

    from tests.helpers import ROOT

    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "check-data", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    return proc.returncode, proc.stdout + proc.stderr


def test_check_data_reports_and_rejects_with_clear_messages(tmp_path, sites):
    code, out = _check(sites[0]["data-path"], "--features", 13, "--classes", ",".join(CLASSES))
    assert code == 0, out
    assert "train: x (144, 13)" in out and "test: x (48, 13)" in out and "OK" in out
    assert "classes (3): adelie, chinstrap, gentoo" in out
    x, y = blobs(30, 13, 3)
    x[4, 1] = np.nan
    x[5, 2] = np.inf
    np.savez(tmp_path / "nan.npz", x_train=x, y_train=y, x_val=x[:5], y_val=y[:5])
    code, out = _check(tmp_path / "nan.npz")
    assert code == 1 and "REJECTED: x_train holds 1 NaN and 1 infinite value(s) in 2 row(s)" in out
    assert "(first: data row 5, counted from 1)" in out  # x[4]: the fifth row, as a CSV reader counts
    np.savez(tmp_path / "noval.npz", x_train=x, y_train=y, y_val=y[:5])
    code, out = _check(tmp_path / "noval.npz")
    assert code == 1 and "lacks array(s) x_val" in out
    code, out = _check(sites[1]["data-path"], "--classes", "adelie,gentoo")
    assert code == 1 and "holds label(s) chinstrap that are not among" in out
    code, out = _check(sites[1]["data-path"], "--features", 12)
    assert code == 1 and "x_train has 13 features but the run has 12" in out


def test_check_data_on_several_files_checks_them_against_each_other(tmp_path, sites):
    """Without --features, two or more files are checked as a run matches them: by count,
    and by column name where they have header rows (another order is a note, not a fault)."""
    paths = [c["data-path"] for c in sites]
    shuffled = site_config(tmp_path / "s", "site-shuffled", seed=4, order=list(reversed(range(13))))
    code, out = _check(*paths, shuffled["data-path"])
    assert code == 0, out
    assert "holds the columns of" in out and "in another order; a run matches them by name" in out
    assert "OK: the 4 files agree on 13 features by column name" in out
    narrow = site_config(tmp_path / "s", "site-narrow", seed=5, num_features=12)
    renamed = site_config(tmp_path / "s", "site-renamed", seed=6,
                          names=[f"f{i}" for i in range(12)] + ["weight"])
    code, out = _check(*paths, narrow["data-path"], renamed["data-path"])
    assert code == 1
    assert f"REJECTED: {narrow['data-path']} has 12 features; 4 of 5 files have 13" in out
    assert f"REJECTED: {renamed['data-path']} has column(s) weight that {paths[0]} lacks" in out


def test_run_site_checks_the_files_as_the_identity_round_would(tmp_path, sites):
    """`gems-fl run --site` puts the files through the server's agreement before anything
    starts: a required site that would be left out stops it with the reason (exit 2);
    one that required-nodes lets go is a warning; reordered columns are fine."""
    from gems_fl.running.site_check import SitesDoNotFit, check_sites

    odd = site_config(tmp_path / "s", "site-odd", seed=5, num_features=9)
    shuffled = site_config(tmp_path / "s", "site-shuffled", seed=6, order=list(reversed(range(13))))
    files = ",".join(c["data-path"] for c in [*sites, odd, shuffled])
    settings = Settings(dataset="node-files", site_files=files, evaluate_on_server=False,
                        standardize="federated")
    with pytest.raises(SitesDoNotFit, match=r"site-odd: node 'site-odd' lacks column\(s\) f9, "
                       r"f10, f11, f12 that the run has"):
        check_sites(settings)
    assert check_sites(replace(settings, required_nodes="4")) == [
        "--site: site-odd will be left out: node 'site-odd' lacks column(s) f9, f10, f11, f12 "
        "that the run has (columns are matched by name) (held by 4 of 5 nodes with a header: "
        "site-0, site-1, site-2, site-shuffled)"]
    fitting = files.rsplit(",", 2)[0] + "," + shuffled["data-path"]
    assert check_sites(replace(settings, site_files=fitting)) == []


def test_site_files_in_a_simulation_are_the_nodes_a_deployment_would_have(tmp_path, sites):
    """`gems-fl run --site ...` gives simulated node k site file k (named by its stem):
    the same agreement, scaling and node-side results as SuperNodes started with those
    files as their data-path."""
    from gems_fl.data.nodes import own_node_config

    files = ",".join(c["data-path"] for c in sites)
    assert own_node_config({"partition-id": 1, "num-partitions": 3}, files) == {
        "data-path": sites[1]["data-path"], "node-name": "site-1"}
    assert own_node_config({"data-path": "/own.csv"}, files) == {"data-path": "/own.csv"}
    own = {**OWN, "standardize": "federated"}
    simulated = run_in_process(3, tmp_path / "sim", **own, **{"site-files": files})
    deployed = run_in_process(3, tmp_path / "dep", node_configs=sites, **own)
    assert [p["name"] for p in simulated["participants"]] == ["site-0", "site-1", "site-2"]
    assert simulated["dataset"]["scale"] == deployed["dataset"]["scale"]
    assert simulated["verification"]["pooled"] == deployed["verification"]["pooled"]
    assert [n["radius"] for n in simulated["nodes"]] == [n["radius"] for n in deployed["nodes"]]


def test_site_options_of_gems_fl_run_are_checked_before_anything_starts(tmp_path, sites, capsys):
    from gems_fl.running.cli import main
    from gems_fl.running.prepare import site_overrides

    paths = [c["data-path"] for c in sites]
    assert site_overrides(paths, {}) == {"dataset": "node-files", "site-files": ",".join(paths),
                                         "evaluate-on-server": False}
    assert "evaluate-on-server" not in site_overrides(paths, {"public-data": "/p.npz"})
    with pytest.raises(ValueError, match="sets dataset='digits'"):
        site_overrides(paths, {"dataset": "digits"})
    with pytest.raises(FileNotFoundError, match="no such file"):
        site_overrides([*paths, str(tmp_path / "nope.csv")], {})
    assert main(["run", "--nodes", "2", *(a for p in paths for a in ("--site", p))]) == 2
    assert "--nodes 2 but 3 --site files" in capsys.readouterr().err
    assert main(["run", "--run-config", "dataset='node-files' evaluate-on-server=false",
                 "--output-dir", str(tmp_path / "o")]) == 2
    assert "gems-fl run --site" in capsys.readouterr().err


def test_a_site_with_too_few_rows_is_left_out_by_name(tmp_path, sites):
    """A site holding 3 training rows (min-rows 10) is left out at the identity round with
    the reason; the default required-nodes='all' then stops the run before any training,
    and a count lets the others go on."""
    from gems_fl.protocol.attendance import RequiredNodesMissing

    tiny = site_config(tmp_path / "sites", "site-tiny", seed=7, n=6)
    with pytest.raises(RequiredNodesMissing, match=r"missing: site-tiny \(rejected: node "
                       r"'site-tiny' holds 3 training row\(s\); the run needs at least 10"):
        run_in_process(4, tmp_path / "all", node_configs=[*sites, tiny], **OWN)
    results = run_in_process(4, tmp_path / "three", node_configs=[*sites, tiny], **OWN,
                             **NO_CHECK, **{"required-nodes": "3"})
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1", "site-2"]
    assert "site-tiny (node 'site-tiny' holds 3 training row(s)" in results["attendance"]["line"]


def test_check_data_and_the_identity_round_break_a_column_tie_alike(tmp_path):
    """Two files hold one set of column names and two another: the set with more training
    rows wins in both (check-data rejects the same two files the run leaves out)."""
    import io

    from gems_fl.protocol.identity_replies import Identity
    from gems_fl.protocol.options import AgreementRule
    from gems_fl.protocol.roster import agree
    from gems_fl.running.check_data import check_data

    paths, identities = [], {}
    for k, (names, n) in enumerate([(["f0", "f1", "f2"], 40), (["f0", "f1", "f2"], 40),
                                    (["f0", "f1", "g2"], 90), (["f0", "f1", "g2"], 90)]):
        x, y = blobs(n, 3, seed=k)
        paths.append(str(write_csv(tmp_path / f"site-{k}.csv", x, y, names=names)))
        write_csv(tmp_path / f"site-{k}_val.csv", x[:10], y[:10], names=names)
        identities[1000 + k] = Identity(name=f"site-{k}", source=paths[-1],
                                        counts={"num-train-examples": n, "num-val-examples": 5, "num-features": 3},
                                        labels=list(CLASSES), columns=names)
    agreement, refused = agree(identities, AgreementRule(dataset="node-files"))
    assert agreement.columns == ["f0", "f1", "g2"]
    assert sorted(refused) == [1000, 1001]
    out = io.StringIO()
    assert check_data(paths, out=out) == 1
    together = out.getvalue().split("together:")[1]
    rejected = [line for line in together.splitlines() if "REJECTED" in line]
    assert [line.split()[1] for line in rejected] == paths[:2], out.getvalue()


def test_under_dp_the_kernel_model_takes_its_landmarks_from_the_public_data_file(tmp_path, sites):
    """Sites' own files under dp-epsilon: the kernel map's landmarks are the server's
    public-data rows (scaled as the sites' rows are), not the sites' centres."""
    x, y = blobs(60, 13, 7)
    np.savez(tmp_path / "public.npz", x=x, y=y)
    results = run_in_process(3, tmp_path / "out", node_configs=sites,
                             **{**OWN, "space": "gram", "eps": 0.4}, model="kernel",
                             **{"public-data": str(tmp_path / "public.npz"), "dp-epsilon": 8.0,
                                "dp-seeded-noise": True, "kernel-landmarks": 100,
                                "standardize": "node"})
    fmap = results["dataset"]["feature_map"]
    assert fmap["landmarks-from"] == "the server's public rows" and fmap["landmarks"] == 60
    assert results["identify"].get("map_round") is None
    assert results["privacy"]["dp"]["epsilon"] == 8.0 and len(results["participants"]) == 3


def test_check_data_names_a_disagreement_without_a_majority_and_blames_no_file(tmp_path, sites):
    """Two files that differ in their column count (55 against 56 in a user's try): no
    count is the majority, so neither file is called wrong; both counts and the columns
    that differ are named, with the fix."""
    narrow = site_config(tmp_path / "s", "site-narrow", seed=5, num_features=12)
    code, out = _check(sites[0]["data-path"], narrow["data-path"])
    assert code == 1
    assert "no count is held by most of them" in out
    assert f"{sites[0]['data-path']} has 13" in out and f"{narrow['data-path']} has 12" in out
    assert f"REJECTED: {narrow['data-path']} has 12 features" not in out
    assert "set num-features" in out


def test_an_eps_at_or_below_chance_is_noted_with_the_fix(tmp_path, sites):
    """Three classes: eps=0.3 asks less than chance (1/3) of h_G, so the run says so;
    eps=0.5 asks more and gets no such note."""
    low = run_in_process(3, tmp_path / "low", node_configs=sites, **{**OWN, "eps": 0.3})
    assert any("eps=0.3 asks no more than chance of h_G (0.33 for 3 classes)" in note
               and "choosing eps" in note for note in low["notes"]), low["notes"]
    high = run_in_process(3, tmp_path / "high", node_configs=sites, **OWN)
    assert not any("chance" in note for note in high["notes"])
