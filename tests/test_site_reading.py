"""Own files without ceremony: validation rows split off on the node, ID-like columns left
out, a one-class site noted, and every error naming the file, the row and the column the
way label-column counts; the run's screen output and the tools around a finished run."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from gems_fl.data.nodes import site_notes
from gems_fl.data.site_files import SiteFileError, read_site_file, site_problems, split_validation
from gems_fl.running.check_data import check_data
from tests.helpers import run_in_process
from tests.sitegen import blobs, write_csv

OWN = {"dataset": "node-files", "evaluate-on-server": False}


def _check(*paths, **kwargs) -> tuple[int, str]:
    out = io.StringIO()
    code = check_data([str(p) for p in paths], out=out, **kwargs)
    return code, out.getvalue()


def _table(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_a_site_without_validation_rows_gets_a_seeded_stratified_split(tmp_path):
    x, y = blobs(200, 4, seed=0)
    path = write_csv(tmp_path / "site.csv", x, y)  # no site_val.csv
    site = read_site_file(path)
    assert "val" not in site.x
    assert split_validation(site, 0.2, seed=3)
    counts = {c: int((y == c).sum()) for c in set(y)}
    for c, n in counts.items():  # per class its share, rounded
        assert int((site.y["val"] == c).sum()) == round(0.2 * n)
        assert int((site.y["train"] == c).sum()) == n - round(0.2 * n)
    again = read_site_file(path)
    split_validation(again, 0.2, seed=3)
    np.testing.assert_array_equal(again.x["val"], site.x["val"])  # seeded
    assert not split_validation(site, 0.2, seed=3)  # it has validation rows now
    assert "20%" in " ".join(site_notes(site))
    code, out = _check(path)
    assert code == 0 and "val: x (" in out and "were set aside" in out, out


def test_a_run_on_sites_without_validation_rows_states_the_split(tmp_path):
    configs = []
    for k in range(2):
        x, y = blobs(150, 5, seed=k)
        path = write_csv(tmp_path / f"site-{k}.csv", x, y)
        configs.append({"data-path": str(path), "node-name": f"site-{k}"})
    results = run_in_process(2, tmp_path / "out", node_configs=configs, **OWN, eps=0.5,
                             **{"val-fraction": 0.3})
    for part in results["participants"]:
        assert part["num-val-examples"] == round(0.3 * 150) or abs(part["num-val-examples"] - 45) <= 2
        assert any("(30%, val-fraction" in note for note in part["notes"])
    assert results["attendance"]["line"] == "completed with 2 of 2 sites"


def test_id_like_columns_are_left_out_and_named_unless_told_otherwise(tmp_path):
    x, y = blobs(40, 3, seed=0)
    rows = [[i + 1, f"P{i:03d}", *row, label] for i, (row, label) in enumerate(zip(x, y))]
    path = _table(tmp_path / "site.csv", ["rownames", "patient", "a", "b", "c", "species"], rows)
    _table(tmp_path / "site_val.csv", ["rownames", "patient", "a", "b", "c", "species"], rows[:8])
    site = read_site_file(path)
    assert site.columns == ["a", "b", "c"] and site.dropped == ["rownames", "patient"]
    assert site.x["val"].shape == (8, 3)
    code, out = _check(path)
    assert code == 0 and "left out 2 ID-like column(s): rownames, patient" in out, out
    # named columns add to what detection finds: naming one ID column keeps no other
    named = read_site_file(path, id_columns="patient")
    assert named.columns == ["a", "b", "c"] and named.dropped == ["rownames", "patient"]
    named = read_site_file(path, id_columns="a")
    assert named.columns == ["b", "c"] and named.dropped == ["rownames", "patient", "a"]
    with pytest.raises(SiteFileError, match=r"column 'patient' \(column 1, counted from 0\) holds text"):
        read_site_file(path, id_columns="none")
    with pytest.raises(SiteFileError, match="id-columns names 'visit', which is not one of"):
        read_site_file(path, id_columns="visit")
    # a numeric column with distinct values but a measurement's name stays a feature
    plain = _table(tmp_path / "p.csv", ["count", "a", "species"],
                   [[i, float(r[0]), lab] for i, (r, lab) in enumerate(zip(x, y))])
    assert read_site_file(plain).columns == ["count", "a"]


def test_a_one_class_site_gets_a_note(tmp_path):
    x, _ = blobs(30, 3, seed=0)
    path = write_csv(tmp_path / "one.csv", x, ["adelie"] * 30)
    code, out = _check(path)
    assert code == 0 and "note: holds one class (adelie)" in out, out


def test_errors_name_the_column_as_label_column_counts_it(tmp_path):
    """The label in column 0: the feature 'b' is column 2 of the file, as label-column
    would name it, and the NaN's row is the file's data row."""
    x, y = blobs(20, 3, seed=0)
    rows = [[label, *row] for label, row in zip(y, x)]
    rows[6][2] = "nan"
    path = _table(tmp_path / "s.csv", ["species", "a", "b", "c"], rows)
    site = read_site_file(path, "0")
    split_validation(site, 0.25, seed=0)
    (problem,) = site_problems(site)
    assert "'b' (column 2)" in problem and "counted from 0, as label-column counts" in problem
    assert "data row 7" in problem, problem
    rows[6][2] = "n/a"
    _table(path, ["species", "a", "b", "c"], rows)
    with pytest.raises(SiteFileError, match=r"column 'b' \(column 2, counted from 0\) holds text"):
        read_site_file(path, "0")


def test_a_site_missing_a_column_is_refused_naming_it(tmp_path):
    configs = []
    for k, names in enumerate([["a", "b", "entropy"], ["a", "b", "entropy"], ["a", "b"]]):
        x, y = blobs(80, len(names), seed=k)
        path = write_csv(tmp_path / f"site-{k}.csv", x, y, names=names)
        write_csv(tmp_path / f"site-{k}_val.csv", x[:20], y[:20], names=names)
        configs.append({"data-path": str(path), "node-name": f"site-{k}"})
    results = run_in_process(3, tmp_path / "out", node_configs=configs, **OWN,
                             **{"required-nodes": "2"})
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-2"
    assert "lacks column(s) entropy" in rejected["reason"], rejected


def test_a_site_refusal_is_shown_whole_without_an_unrelated_hint(tmp_path):
    from gems_fl.running.site_check import SitesDoNotFit, check_sites
    from gems_fl.settings import Settings

    files = []
    for k in range(2):
        rows = [[float(i), "xyz"[i % 3] if i % 2 else i, "ab"[i % 2]] for i in range(30)]
        files.append(str(_table(tmp_path / f"s{k}.csv", ["a", "kind", "label"], rows)))
    settings = Settings(dataset="node-files", site_files=",".join(files), evaluate_on_server=False)
    with pytest.raises(SitesDoNotFit) as caught:
        check_sites(settings)
    text = str(caught.value)
    assert "or name it as the label with label-column" in text  # the reason's end, whole
    assert "required-nodes to a count" not in text  # no site fits: fewer sites would not help


def test_flowers_notes_on_its_default_federation_size_stay_out_of_the_log(tmp_path, capsys):
    """Flower warns on every simulation that its default size changed, a note for its own
    CLI users: a gems-fl run sets the size (--nodes), so neither the screen nor the kept
    log carries it; one line in the log says it was left out."""
    from gems_fl.running.runlog import RunLog

    text = ("WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.\n"
            "INFO :      Federation `local` (5 simulated SuperNodes)\n"
            "INFO :      To change federation size, use the following command:\n"
            "INFO :        flwr federation simulation-config --num-supernodes N\n"
            "WARNING :   Node 3 ('site-a'): a real warning\n")
    log = RunLog(tmp_path / "run.log", None, verbose=True)
    for line in text.splitlines(True):
        log.add(line)
    log.file.close()
    kept = (tmp_path / "run.log").read_text()
    shown = capsys.readouterr().out
    for gone in ("changed from 10 to 2", "To change federation size", "--num-supernodes N"):
        assert gone not in kept and gone not in shown
    assert kept.count("left out: this run's size is gems-fl run's --nodes") == 1
    assert "(5 simulated SuperNodes)" in kept and "a real warning" in kept + shown


def test_info_lines_go_to_the_log_file_unless_verbose_and_no_colour_codes_in_it(tmp_path, capsys):
    from gems_fl.running.runlog import RAY_SHUTDOWN_NOTE, RunLog

    text = ("\x1b[92mINFO \x1b[0m:      [ROUND 1/2]\n"
            "\x1b[93mWARNING \x1b[0m:   Node 3 ('site-a'): a real warning\n"
            "INFO :      Results written to /tmp/out/run-1/results.json (model: m)\n"
            "(ClientAppActor pid=77) WARNING :   Manually terminating ClientAppActor\n")
    log = RunLog(tmp_path / "run.log", None)
    for line in text.splitlines(True):
        log.add(line)
    log.close()
    shown = capsys.readouterr().out
    assert shown == "WARNING :   Node 3 ('site-a'): a real warning\n", shown
    assert RAY_SHUTDOWN_NOTE not in shown  # Flower's own notice is no crash
    kept = (tmp_path / "run.log").read_text()
    assert "\x1b" not in kept and "[ROUND 1/2]" in kept and "Manually terminating" in kept
    log = RunLog(tmp_path / "v.log", None, verbose=True)
    for line in text.splitlines(True):
        log.add(line)
    log.close()
    assert "[ROUND 1/2]" in capsys.readouterr().out


def test_show_takes_a_run_folder_and_the_plot_holds_each_site_and_the_test_figure(tmp_path, capsys):
    from gems_fl.evaluation.result_plot import good_enough_text, plot_run, server_test_accuracy
    from gems_fl.running.cli import main

    run_in_process(3, tmp_path, eps=0.3)
    folder = tmp_path / "run-1"
    assert main(["show", str(folder)]) == 0
    assert "Per site: its verdict on h_G" in capsys.readouterr().out
    results = json.loads((folder / "results.json").read_text())
    assert server_test_accuracy(results) == results["rows"]["GEMS"]["accuracy"]
    assert good_enough_text(results).endswith("of 3 sites")
    for count in (3, 20):  # readable at both: one bar group per site, the figure capped
        many = dict(results)
        entry = next(iter(results["verification"]["per_node"].values()))
        many["verification"] = {**results["verification"], "per_node": {
            f"hospital-{k:02d}": entry for k in range(count)}}
        path = plot_run(many, tmp_path / f"plot-{count}.png")
        from PIL import Image

        width, height = Image.open(path).size
        assert 640 <= width <= 1400 and height == 440


def test_a_run_that_exits_4_still_says_which_sites_it_expected_and_heard_from(tmp_path, capsys):
    """The round-by-round log is off the screen, so the sites line comes from gems-fl
    itself, on exit 4 as on success."""
    from gems_fl.running.cli import report
    from gems_fl.running.outcome import RunNotGoodEnough

    roll = "expected 2 site(s) (required-nodes='all'); heard from 2 site(s) (site-0, site-1)"
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"status": "not-good-enough", "attendance": {"roll": roll}}))

    def work():
        raise RunNotGoodEnough("h_G is good enough on 0 of 2 site(s)", path)

    assert report(work) == 4
    err = capsys.readouterr().err
    assert f"gems-fl: sites: {roll}\n" in err and "status not-good-enough" in err


def test_every_exit_writes_the_same_timing_fields(tmp_path):
    """A run that ends not-good-enough (exit 4) or incomplete (exit 3) gets the same
    ``timing_s`` fields (``wall`` among them) as one that completes."""
    import time
    from types import SimpleNamespace

    import pytest

    from gems_fl.running.outcome import RunIncomplete, RunNotGoodEnough
    from gems_fl.running.watch import conclude

    for run_id, (status, error) in enumerate([("not-good-enough", RunNotGoodEnough),
                                              ("incomplete", RunIncomplete)], start=1):
        folder = tmp_path / f"run-{run_id}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps({
            "status": status, "started_unix": time.time() - 5, "timing_s": {"total": 4.0}}))
        log = tmp_path / f"run-{run_id}.log"
        log.write_text("the round-by-round log\n")
        with pytest.raises(error):
            conclude(run_id, "finished:failed", tmp_path,
                     SimpleNamespace(path=log, close=lambda: None), time.time() - 6)
        timing = json.loads((folder / "results.json").read_text())["timing_s"]
        assert {"total", "startup", "shutdown", "wall"} <= set(timing), timing
