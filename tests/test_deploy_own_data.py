"""Real sites over TLS (real processes on loopback): own CSV files with 13 features and
3 string-labelled classes, no data on the server; `gems-fl submit` failing loudly; a
node killed mid-round counted once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from gems_fl.data.site_files import read_site_file
from gems_fl.running.federation import CONNECTION, TlsFederation, make_node_key, stop_group
from tests.helpers import FAST, ROOT, app_defaults, run_in_process
from tests.sitegen import CLASSES, site_config

pytestmark = pytest.mark.slow

OWN = {**FAST, "dataset": "node-files", "evaluate-on-server": False, "space": "ball",
       "eps": 0.5, "standardize": "federated"}


def test_own_csv_sites_over_tls_agree_evaluate_on_nodes_and_leave_out_the_odd_one(tmp_path, sites):
    """Real SuperNodes over TLS on CSV sites: one with 9 features is left out; site-2's file
    holds its columns in reverse order and is matched by name (the pooled scaling below
    is that of the rows in the run's order)."""
    odd = site_config(tmp_path / "sites", "site-odd", seed=5, num_features=9)
    reversed_2 = site_config(tmp_path / "reversed", "site-2", seed=2, order=list(reversed(range(13))))
    with TlsFederation(tmp_path / "fed") as fed:
        for config in [*sites[:2], reversed_2, odd]:
            fed.add_node(config)
        run = fed.run(ROOT, {**OWN, "output-dir": str(tmp_path / "out"), "required-nodes": "3"},
                      timeout=400)
    assert run.status == "finished:completed", run.output[-4000:]
    results = run.results
    assert results["dataset"]["classes"] == list(CLASSES)
    assert results["dataset"]["num_features"] == 13
    assert results["dataset"]["columns"] == [f"f{i}" for i in range(13)]
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1", "site-2"]
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-odd" and "lacks column(s) f9, f10, f11, f12" in rejected["reason"]
    assert "site-odd" in run.output
    # Every node scaled with the same numbers: the mean/std of all training rows pooled.
    raw = np.concatenate([read_site_file(c["data-path"]).x["train"] for c in sites])
    np.testing.assert_allclose(results["dataset"]["scale"]["mean"], raw.mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(results["dataset"]["scale"]["std"], raw.std(axis=0), rtol=1e-6)
    ver = results["verification"]
    assert set(ver["per_node"]) == {"site-0", "site-1", "site-2"}
    for entry in ver["per_node"].values():
        assert entry["split"] == "test"
        assert {"gems", "averaged", "local.site-0", "local.site-1", "local.site-2"} <= set(entry["accuracy"])
    assert {"gems", "averaged", "local.site-0"} <= set(ver["pooled"])
    assert ver["pooled"]["gems"] > 0.8
    assert "Evaluated on the nodes' own data" in run.output


TRAINS_FOREVER = {"local-max-epochs": 100000, "local-patience": 100000,
                  "local-solve": "adam"}  # see test_deploy


def _submit(fed: TlsFederation, overrides: str, *args: str) -> subprocess.Popen:
    env = {**fed.env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gems_fl.running.cli", "submit", str(ROOT),
                             "--superlink", CONNECTION, "--run-config", overrides, *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _cli(fed: TlsFederation, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**fed.env, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "gems_fl.running.cli", *args], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def _finished(fed: TlsFederation, run_id: int, polls: int) -> str:
    """The run's status once the SuperLink says it finished (a state, polled each second
    up to ``polls`` times), else the last status seen."""
    status = ""
    for _ in range(polls):
        listed = json.loads(fed.flwr("ls", "--run-id", str(run_id), CONNECTION,
                                     "--format", "json").stdout)
        status = listed["runs"][0]["status"]
        if status.startswith("finished"):
            break
        time.sleep(1.0)
    return status


def test_submit_exits_non_zero_when_the_superlink_stops_mid_run(tmp_path, sites):
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node({**config, **TRAINS_FOREVER}) for config in sites]
        out = tmp_path / "out"
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false "
                            f"output-dir='{out}'", "--output-dir", str(tmp_path / "home"))
        try:
            fed.wait_for_log(nodes[0], "Receiving: train message", 300)
            stop_group(fed.superlink)  # the SuperLink goes away mid-run
            output, _ = proc.communicate(timeout=180)
        finally:
            stop_group(proc)
    assert proc.returncode == 1, output[-3000:]
    assert "gems-fl: run failed" in output
    assert "does not report the run's status" in output or "ended with status" in output
    # the failed run's log is kept under submit's own --output-dir, not the working folder
    assert len(list((tmp_path / "home" / "logs").glob("gems-fl-submit-*.log"))) == 1


def test_submit_a_site_killed_mid_round_exits_3_names_it_and_brings_the_results_home(tmp_path, sites):
    """required-nodes defaults to every site present at the identity round: losing one
    mid-round is not success. The results still come home, through the run's log, into
    submit's own --output-dir (the ServerApp writes its copy elsewhere). The lost site's
    sums were in the federated scaling, so the rounds ran again without it: the model is
    bit for bit the one the two survivors give alone."""
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node(config) for config in sites[:2]]
        victim = fed.add_node({**sites[2], **TRAINS_FOREVER})

        def kill_when_training_starts() -> None:
            fed.wait_for_log(victim, "Receiving: train message", 300)
            fed.kill_node(victim)

        killer = threading.Thread(target=kill_when_training_starts, daemon=True)
        killer.start()
        server_side, home = tmp_path / "superlink-machine", tmp_path / "home"
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false round-timeout=60.0 "
                            f"standardize='federated' output-dir='{server_side}'",
                       "--output-dir", str(home))
        try:
            output, _ = proc.communicate(timeout=400)
        finally:
            stop_group(proc)
        killer.join(timeout=5)
        assert victim.process.poll() is not None and nodes[0].process.poll() is None
    assert proc.returncode == 3, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert "completed with 2 of 3 sites; left out: site-2 (" in last, last
    assert "required-nodes='all' is not met: missing site-2" in last, last
    (path,) = home.glob("run-*/results.json")
    assert path.parent.name in last
    results = json.loads(path.read_text())
    assert results["status"] == "incomplete"
    assert [r.get("node_name") for r in results["rejected"]] == ["site-2"], results["rejected"]
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1"]
    assert results["run"]["git_commit"] and results["run"]["superlink"] == CONNECTION
    assert (path.parent / "gems_model.npz").is_file() and (path.parent / "run.log").is_file()
    assert "GEMS-FL-BUNDLE" not in (path.parent / "run.log").read_text()
    (server_copy,) = server_side.glob("run-*/results.json")
    assert server_copy.parent.name == path.parent.name
    with np.load(path.parent / "gems_model.npz") as home_model, \
            np.load(server_copy.parent / "gems_model.npz") as server_model:
        for key in server_model.files:
            np.testing.assert_array_equal(home_model[key], server_model[key])
    assert [a["lost"] for a in results["abandoned_attempts"]] == [["site-2"]]
    defaults = {key: app_defaults()[key] for key in FAST}  # the deployment ran the defaults
    run_in_process(2, tmp_path / "alone", node_configs=sites[:2], **defaults,
                   dataset="node-files", standardize="federated",
                   **{"evaluate-on-server": False, "min-good-enough": "0"})
    with np.load(path.parent / "gems_model.npz") as deployed, \
            np.load(tmp_path / "alone" / "run-1" / "gems_model.npz") as alone:
        assert deployed.files == alone.files
        for key in alone.files:
            np.testing.assert_array_equal(deployed[key], alone[key])


def test_ctrl_c_on_submit_stops_the_run_on_the_superlink(tmp_path, sites):
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node({**config, **TRAINS_FOREVER}) for config in sites]
        proc = _submit(fed, "dataset='node-files' evaluate-on-server=false",
                       "--output-dir", str(tmp_path / "home"))
        try:
            fed.wait_for_log(nodes[0], "Receiving: train message", 300)  # the run is training
            os.kill(proc.pid, signal.SIGINT)
            output, _ = proc.communicate(timeout=120)
        finally:
            stop_group(proc)
        assert proc.returncode == 130, output[-3000:]
        run_id = int(re.search(r"stopped run (\d+) on 'gems-tls'", output).group(1))
        assert output.strip().splitlines()[-1].startswith("gems-fl: interrupted by SIGINT")
        assert "Traceback" not in output
        assert _finished(fed, run_id, 60) == "finished:stopped"  # the SuperLink's stop


def test_detached_submit_then_status_and_pull(tmp_path, sites):
    with TlsFederation(tmp_path / "fed") as fed:
        for config in sites:
            fed.add_node(config)
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false "
                            f"output-dir='{tmp_path / 'server'}'", "--detach")
        output, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, output
        run_id = int(re.search(r"run (\d+) started on 'gems-tls' and left running", output).group(1))
        assert f"flwr stop {run_id} {CONNECTION}" in output
        assert f"gems-fl pull {run_id} --superlink {CONNECTION}" in output
        assert _finished(fed, run_id, 300) == "finished:completed"
        shown = _cli(fed, "status", "--superlink", CONNECTION)
        assert shown.returncode == 0, shown.stderr
        assert "3 SuperNode(s)" in shown.stdout
        for name in ("site-0", "site-1", "site-2"):
            assert f": {name}, online" in shown.stdout, shown.stdout
        assert f"run {run_id}: finished:completed" in shown.stdout
        pulled = _cli(fed, "pull", str(run_id), "--superlink", CONNECTION,
                      "--output-dir", str(tmp_path / "home"))
        assert pulled.returncode == 0, pulled.stderr
        results = json.loads((tmp_path / "home" / f"run-{run_id}" / "results.json").read_text())
        assert results["status"] == "completed"
        assert results["attendance"]["line"] == "completed with 3 of 3 sites"


def test_gems_fl_run_on_site_files_before_deploying(tmp_path, sites):
    """Own data in a local simulation, one node per file: the odd site (9 features) would
    be left out by the identity round as a deployment would, so with the default
    required-nodes the run is refused before anything starts (exit 2) with the reason;
    with required-nodes=3 it completes without it (a warning names it), and a site
    whose columns are in another order takes part, matched by name."""
    odd = site_config(tmp_path / "sites", "site-odd", seed=5, num_features=9)
    shuffled = site_config(tmp_path / "sites", "site-shuffled", seed=6,
                           order=list(reversed(range(13))))
    files = [a for c in [*sites, odd] for a in ("--site", c["data-path"])]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), *files,
                           "--output-dir", str(out), "--run-config",
                           "standardize='federated' space='ball' eps=0.5"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    error = proc.stderr[proc.stderr.index("--site: the run would stop before training"):]
    assert "required-nodes='all'; checked on the files, nothing was started" in error, error
    assert "site-odd: node 'site-odd' lacks column(s) f9, f10, f11, f12 that the run has" in \
        error, error
    assert "check-data" in last and not out.exists()
    files += ["--site", shuffled["data-path"]]
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), *files,
                           "--output-dir", str(tmp_path / "three"), "--run-config",
                           "standardize='federated' space='ball' eps=0.5 required-nodes=3 "
                           "min-good-enough=0"],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gems-fl: warning: --site: site-odd will be left out: node 'site-odd' lacks " \
           "column(s) f9, f10, f11, f12" in proc.stderr
    (path,) = (tmp_path / "three").glob("run-*/results.json")
    results = json.loads(path.read_text())
    names = ["site-0", "site-1", "site-2", "site-shuffled"]
    assert [p["name"] for p in results["participants"]] == names
    assert set(results["verification"]["per_node"]) == set(names)
    assert results["dataset"]["columns"] == [f"f{i}" for i in range(13)]
    assert (path.parent / "run.log").is_file()


def test_the_python_classifier_gives_the_model_of_gems_fl_run_site(tmp_path):
    """The notebook path and the command line on the same rows: GEMSClassifier.fit on the
    sites' arrays gives, bit for bit, the h_G of `gems-fl run --site` on CSV files
    holding those rows (text labels, class subsets, unscaled features)."""
    import csv

    from gems_fl.api import load_model
    from gems_fl.estimator import GEMSClassifier
    from tests.test_api import _wine_sites

    sites, _, _ = _wine_sites()
    files = []
    for name, data in sites.items():
        for split, suffix in (("train", ""), ("val", "_val")):
            with open(tmp_path / f"{name}{suffix}.csv", "w", newline="") as f:
                writer = csv.writer(f)
                writer.writerow([f"f{i}" for i in range(13)] + ["cultivar"])
                writer.writerows([*map(repr, map(float, row)), label]
                                 for row, label in zip(data[f"x_{split}"], data[f"y_{split}"]))
        files += ["--site", str(tmp_path / f"{name}.csv")]
    proc = subprocess.run([sys.executable, "-m", "gems_fl.running.cli", "run", str(ROOT), *files,
                           "--output-dir", str(tmp_path / "out"), "--run-config", "eps=0.5"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (folder,) = (tmp_path / "out").glob("run-*")
    run_model = load_model(folder)
    clf = GEMSClassifier(eps=0.5).fit(sites)
    assert run_model.classes == clf.model_.classes
    np.testing.assert_array_equal(run_model.mean, clf.model_.mean)
    for (w_run, b_run), (w_fit, b_fit) in zip(run_model.layers, clf.model_.layers, strict=True):
        np.testing.assert_array_equal(w_run, w_fit)
        np.testing.assert_array_equal(b_run, b_fit)


def test_registered_sites_are_expected_named_before_their_first_run_and_a_useless_model_exits_4(
        tmp_path, sites):
    """SuperNode authentication: the sites the operator registered by name are the run's
    expected sites. `gems-fl status` names them before any run; a registered site that
    never connects stops the run before training (exit 3, named); a registered name wins
    over the node-name a site reports. A DP run at chance is no success (exit 4), its
    results written and marked."""
    server_side, home = tmp_path / "superlink-machine", tmp_path / "home"
    with TlsFederation(tmp_path / "fed", supernode_auth=True) as fed:
        for k in range(2):
            make_node_key(tmp_path / f"site-{k}.key")
            registered = fed.register(tmp_path / f"site-{k}.key.pub", f"site-{k}")
            assert registered.returncode == 0, registered.stdout + registered.stderr

        def key(k: int) -> tuple[str, str]:
            return ("--auth-supernode-private-key", str(tmp_path / f"site-{k}.key"))

        fed.add_node({**sites[0], "node-name": "what-site-0-calls-itself"}, extra_args=key(0))
        shown = _cli(fed, "status", "--superlink", CONNECTION)
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"node \d+: site-0, online", shown.stdout), shown.stdout
        assert re.search(r"node \d+: site-1, registered", shown.stdout), shown.stdout
        assert "0 run(s)" in shown.stdout

        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false site-wait=5.0 "
                            f"output-dir='{server_side}'", "--output-dir", str(home))
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 3, output[-4000:]
        assert "expecting the 2 site(s) registered on 'gems-tls' (SuperNode authentication): " \
               "site-0, site-1" in output, output[-4000:]
        last = output.strip().splitlines()[-1]
        assert "stopped before training: expected site-0, site-1" in last, last
        assert "heard from 1 site(s) (site-0); missing: site-1 (not connected after 5 s)" in last

        fed.add_node(sites[1], extra_args=key(1))
        # seeded noise: the same release, so the same verdict, on every run (fresh noise at
        # epsilon 0.01 once left h_G good enough on both of these easy sites)
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false dp-epsilon=0.001 "
                            f"lab='dp-seeded-noise=true' "
                            f"output-dir='{server_side}'", "--output-dir", str(home))
        output, _ = proc.communicate(timeout=400)
    assert proc.returncode == 4, output[-4000:]
    last = output.strip().splitlines()[-1]
    assert re.search(r"h_G is good enough on [01] of 2 site\(s\) that checked it; "
                     r"min-good-enough=majority asks for 2", last), last
    assert "expected site-0, site-1 (required-nodes='site-0,site-1'); heard from 2 site(s) " \
           "(site-0, site-1)" in output
    (path,) = [p for p in home.glob("run-*/results.json")
               if json.loads(p.read_text())["status"] == "not-good-enough"]
    results = json.loads(path.read_text())
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1"]
    assert results["good_enough"]["sites"] < 2 and not results["good_enough"]["ok"]
    assert (path.parent / "gems_model.npz").is_file()
