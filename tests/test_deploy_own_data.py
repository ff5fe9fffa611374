"""Real sites over TLS (real processes on loopback): own CSV files with 13 features and
3 string-labelled classes, no data on the server; `gems-fl submit` failing loudly; a
node killed mid-round counted once."""

from __future__ import annotations

import subprocess
import sys
import threading

import numpy as np
import pytest

from gems_fl.data.site_files import read_site_file
from gems_fl.running.federation import CONNECTION, TlsFederation, _stop_group
from tests.helpers import FAST, ROOT
from tests.sitegen import CLASSES, site_config

pytestmark = pytest.mark.slow

OWN = {**FAST, "dataset": "node-files", "evaluate-on-server": False, "space": "ball",
       "eps": 0.5, "standardize": "federated"}


def test_own_csv_sites_over_tls_agree_evaluate_on_nodes_and_leave_out_the_odd_one(tmp_path, sites):
    odd = site_config(tmp_path / "sites", "site-odd", seed=5, num_features=9)
    with TlsFederation(tmp_path / "fed") as fed:
        for config in [*sites, odd]:
            fed.add_node(config)
        run = fed.run(ROOT, {**OWN, "output-dir": str(tmp_path / "out")}, timeout=400)
    assert run.status == "finished:completed", run.output[-4000:]
    results = run.results
    assert results["dataset"]["classes"] == list(CLASSES)
    assert results["dataset"]["num_features"] == 13
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1", "site-2"]
    (rejected,) = results["rejected"]
    assert rejected["node_name"] == "site-odd" and "9 features" in rejected["reason"]
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


def _submit(fed: TlsFederation, overrides: str) -> subprocess.Popen:
    env = {**fed.env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gems_fl.running.cli", "submit", str(ROOT),
                             "--superlink", CONNECTION, "--run-config", overrides], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_submit_exits_non_zero_when_the_superlink_stops_mid_run(tmp_path, sites):
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node(config) for config in sites]
        out = tmp_path / "out"
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false "
                            f"local-max-epochs=200 local-patience=200 output-dir='{out}'")
        try:
            fed.wait_for_log(nodes[0], "Receiving: train message", 300)
            _stop_group(fed.superlink)  # the SuperLink goes away mid-run
            output, _ = proc.communicate(timeout=180)
        finally:
            _stop_group(proc)
    assert proc.returncode == 1, output[-3000:]
    assert "gems-fl: run failed" in output
    assert "does not report the run's status" in output or "ended with status" in output


def test_submit_exits_zero_and_a_killed_node_is_rejected_once(tmp_path, sites):
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node(config) for config in sites]
        victim = nodes[2]

        def kill_when_training_starts() -> None:
            fed.wait_for_log(victim, "Receiving: train message", 300)
            fed.kill_node(victim)

        killer = threading.Thread(target=kill_when_training_starts, daemon=True)
        killer.start()
        out = tmp_path / "out"
        proc = _submit(fed, f"dataset='node-files' evaluate-on-server=false round-timeout=20.0 "
                            f"output-dir='{out}'")
        try:
            output, _ = proc.communicate(timeout=400)
        finally:
            _stop_group(proc)
        killer.join(timeout=5)
    assert proc.returncode == 0, output[-4000:]
    import json

    (path,) = out.glob("run-*/results.json")
    results = json.loads(path.read_text())
    assert [r.get("node_name") for r in results["rejected"]] == ["site-2"], results["rejected"]
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1"]
