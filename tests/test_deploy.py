"""Real deployment on loopback: a TLS SuperLink and SuperNodes as separate processes.

Each SuperNode trains on its own data file (made from a digits partition so that an
in-process simulation of the same data and seed can be compared number for number).
Every process is started by :class:`gems_fl.running.federation.TlsFederation` and stopped by
its PID when the fixture or test ends, also on failure.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from gems_fl.data.nodes import write_partition_files
from gems_fl.running.federation import TlsFederation, make_certs, make_node_key
from tests.helpers import FAST, ROOT, run_in_process

pytestmark = pytest.mark.slow

NUM_NODES = 3
# Replies travel as float32/float64 arrays through Flower's serialisation, and both
# runs execute the same code on the same data and seeds: we require agreement to 1e-6.
TOL = 1e-6
MLP = {"model": "mlp", "hidden": "12", "num-directions": 20, "clusters": 6,
       "eps-neuron": 0.5, "evaluate-on-server": False}


def _write_site(path: Path, arrays) -> Path:
    x_tr, y_tr, x_val, y_val = arrays
    np.savez(path, x_train=x_tr, y_train=y_tr, x_val=x_val, y_val=y_val)
    return path


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> list[dict]:
    """One .npz per node: the digits partitions of the paper's K=3 division."""
    paths = write_partition_files(tmp_path_factory.mktemp("sites"), NUM_NODES)
    return [{"data-path": str(p), "node-name": p.stem} for p in paths]


@pytest.fixture(scope="module")
def federation(tmp_path_factory, sites):
    with TlsFederation(tmp_path_factory.mktemp("fed")) as fed:
        for config in sites:
            fed.add_node(config)
        yield fed


def _assert_same(deployed: dict, simulated: dict) -> None:
    exact = lambda res: [(n["name"], n["num_train"]) for n in res["nodes"]]
    close = lambda res: [v for n in res["nodes"]
                         for v in (n["radius"], n["local_val_accuracy"])]
    assert exact(deployed) == exact(simulated)
    assert close(deployed) == pytest.approx(close(simulated), abs=TOL)
    for name, row in simulated["rows"].items():
        if row["accuracy"] is None:
            assert deployed["rows"][name]["accuracy"] is None
        else:
            assert deployed["rows"][name]["accuracy"] == pytest.approx(row["accuracy"], abs=TOL)
    assert deployed["intersection"]["found"] == simulated["intersection"]["found"]
    dep_model = np.load(Path(deployed["output"]["model"]))
    sim_model = np.load(Path(simulated["output"]["model"]))
    assert sorted(dep_model.files) == sorted(sim_model.files)
    for key in sim_model.files:
        np.testing.assert_allclose(dep_model[key], sim_model[key], atol=TOL, rtol=0)


def _run(fed: TlsFederation, tmp_path: Path, **overrides) -> dict:
    cfg = {**FAST, "output-dir": str(tmp_path / "deployed"), **overrides}
    run = fed.run(ROOT, cfg, timeout=400)
    assert run.status == "finished:completed", run.output[-4000:]
    assert run.results is not None, f"no results file; output:\n{run.output[-3000:]}"
    return {"run": run, "results": run.results}


def test_convex_over_tls_equals_the_simulation(federation, sites, tmp_path):
    out = _run(federation, tmp_path)
    deployed, run = out["results"], out["run"]
    simulated = run_in_process(NUM_NODES, tmp_path / "sim", node_configs=sites)
    _assert_same(deployed, simulated)
    assert [p["name"] for p in deployed["participants"]] == ["site-0", "site-1", "site-2"]
    assert all(p["data"].startswith("data-path=") for p in deployed["participants"])
    # The results sit at the absolute path the log announces.
    assert Path(deployed["output"]["results"]).is_absolute()
    assert f"Results written to {deployed['output']['results']}" in run.output
    # Per round, the log says which nodes replied, by name.
    assert "Round 1: Replies from 3 of 3 nodes" in run.output
    for k in range(NUM_NODES):
        assert f"('site-{k}')" in run.output
    round1, selection = deployed["rounds"]  # the spaces, then the selection round
    assert selection["refine"] == 0
    assert (selection["pooled_ridge"] is not None) == (selection["point"] == "pooled")
    assert (selection.get("lda_shrinkage") is not None) == (selection["point"] == "lda")
    assert round1["bytes_sent"] > 0 and round1["bytes_received"] > 0 and round1["wall_s"] > 0


def test_nn_over_tls_equals_the_simulation(federation, sites, tmp_path):
    deployed = _run(federation, tmp_path, **MLP)["results"]
    simulated = run_in_process(NUM_NODES, tmp_path / "sim", node_configs=sites, **MLP)
    _assert_same(deployed, simulated)
    assert deployed["hidden_widths"] == simulated["hidden_widths"]
    assert [r["width"] for r in deployed["rounds"]] == [r["width"] for r in simulated["rounds"]]
    assert [r["bytes_received"] for r in deployed["rounds"]] == \
        [r["bytes_received"] for r in simulated["rounds"]]


def test_kernel_model_over_tls_equals_the_simulation(federation, sites, tmp_path):
    """The landmark round between SuperNode processes: the same centres, map and model
    as in simulation; the saved model carries the landmarks."""
    kernel = {"model": "kernel", "kernel-landmarks": 60}
    deployed = _run(federation, tmp_path, **kernel)["results"]
    simulated = run_in_process(NUM_NODES, tmp_path / "sim", node_configs=sites, **kernel)
    _assert_same(deployed, simulated)
    assert deployed["dataset"]["feature_map"] == simulated["dataset"]["feature_map"]
    assert "feature-map.landmarks" in np.load(Path(deployed["output"]["model"])).files


def test_node_whose_data_has_the_wrong_features_is_rejected(federation, tmp_path):
    rng = np.random.default_rng(0)
    bad = _write_site(tmp_path / "bad.npz", (rng.random((40, 32)), rng.integers(0, 10, 40),
                                             rng.random((8, 32)), rng.integers(0, 10, 8)))
    node = federation.add_node({"data-path": str(bad), "node-name": "site-bad"})
    try:
        out = _run(federation, tmp_path, **{"evaluate-on-server": False, "space": "ball",
                                             "required-nodes": "site-0,site-1,site-2"})
    finally:
        federation.kill_node(node)
    results, run = out["results"], out["run"]
    assert results["attendance"]["line"].startswith(
        "completed with 3 of 4 sites; left out: site-bad (node 'site-bad': ")
    assert [p["name"] for p in results["participants"]] == ["site-0", "site-1", "site-2"]
    (rejection,) = results["rejected"]
    assert "node 'site-bad'" in rejection["reason"]
    assert "32 features but the run's dataset 'digits' has 64" in rejection["reason"]
    assert "Rejected reply from node" in run.output and "site-bad" in run.output
    assert len(results["nodes"]) == NUM_NODES


def test_supernode_with_the_wrong_ca_cannot_join(federation, tmp_path):
    other = make_certs(tmp_path / "other-ca", "127.0.0.1")
    node = federation.add_node({"partition-id": 0, "num-partitions": 3, "node-name": "intruder"},
                               ca=other.ca, wait=False,
                               extra_args=("--max-retries", "2", "--max-wait-time", "15"))
    try:
        node.process.wait(timeout=90)
    finally:
        federation.kill_node(node)
    log = node.log()
    assert "SuperNode ID:" not in log, log[-3000:]
    assert "CERTIFICATE_VERIFY_FAILED" in log or "certificate verify failed" in log, log[-3000:]
    assert node.process.returncode == 1  # deploy/README.md says so


# A victim trains for 100,000 epochs (by Adam's epochs, its own choice: the exact solve
# would finish in seconds): it is still training whenever its "Receiving: train
# message" line is seen and it is killed, however loaded the machine (no race with its reply).
TRAINS_FOREVER = {"local-max-epochs": 100000, "local-patience": 100000,
                  "local-solve": "adam"}


def _run_killing(fed: TlsFederation, victim, out: Path, **overrides):
    """``flwr run`` while a thread kills ``victim`` as soon as its train message arrives
    (start the victim with :data:`TRAINS_FOREVER` in its node config)."""

    def kill_when_training_starts() -> None:
        fed.wait_for_log(victim, "Receiving: train message", 300)
        fed.kill_node(victim)

    killer = threading.Thread(target=kill_when_training_starts, daemon=True)
    killer.start()
    run = fed.run(ROOT, {**FAST, "output-dir": str(out), "evaluate-on-server": False,
                         "space": "ball", **overrides}, timeout=400)
    killer.join(timeout=5)
    assert victim.process.poll() is not None, "the node was not killed during the run: " + run.output[-3000:]
    return run


def _node_id(node) -> int:
    return int(node.log().split("SuperNode ID: ")[1].split()[0])


def test_killed_node_mid_round_the_run_completes_or_stops_clearly(sites, tmp_path):
    # The round timeout also bounds the identity round, where every live SuperNode starts a
    # ClientApp process: on a loaded machine 20 s was too short for that (the run then
    # failed before any node trained). The killed node's round waits it out once per run.
    timeout = 60.0
    with TlsFederation(tmp_path / "fed") as fed:
        nodes = [fed.add_node(config) for config in sites[:2]]
        nodes.append(fed.add_node({**sites[2], **TRAINS_FOREVER}))
        run = _run_killing(fed, nodes[2], tmp_path / "a",
                           **{"round-timeout": timeout, "min-replies": 2, "required-nodes": "2"})
        assert run.status == "finished:completed", run.output[-4000:]
        results = run.results
        assert results["attendance"]["left_out"][0]["name"] == "site-2"
        assert sorted(n["name"] for n in results["nodes"]) == ["site-0", "site-1"]
        (missing,) = results["rejected"]
        assert missing["node_name"] == "site-2" and missing["node_id"] == _node_id(nodes[2])
        assert "Round 1: Replies from 2 of 3 nodes" in run.output

        # Restarted, site-2 gets a new Flower node id but keeps its name. With
        # min-replies=3 losing it again must stop the run with a clear message.
        restarted = fed.add_node({**sites[2], **TRAINS_FOREVER})
        assert _node_id(restarted) != _node_id(nodes[2])
        run = _run_killing(fed, restarted, tmp_path / "b",
                           **{"round-timeout": timeout, "min-replies": 3})
        assert run.status == "finished:failed", run.output[-4000:]
        assert "only 2 valid replies from 3 nodes; min-replies=3" in run.output, run.output[-4000:]
        assert f"{_node_id(restarted)} ('site-2')" in run.output
        assert not list((tmp_path / "b").glob("run-*/results.json"))


def test_supernode_auth_only_registered_keys_join(sites, tmp_path):
    """flwr 1.42 offers SuperNode authentication on a self-hosted SuperLink: use it."""
    with TlsFederation(tmp_path / "fed", supernode_auth=True) as fed:
        registered = make_node_key(tmp_path / "site-0.key")
        make_node_key(tmp_path / "stranger.key")
        reg = fed.register(registered, "site-0")
        assert reg.returncode == 0 and "registered successfully" in reg.stdout, reg.stdout + reg.stderr
        good = fed.add_node(sites[0], extra_args=(
            "--auth-supernode-private-key", str(tmp_path / "site-0.key")))
        retry = ("--max-retries", "2", "--max-wait-time", "15")
        stranger = fed.add_node({**sites[1], "node-name": "stranger"}, wait=False, extra_args=(
            "--auth-supernode-private-key", str(tmp_path / "stranger.key"), *retry))
        keyless = fed.add_node({**sites[2], "node-name": "keyless"}, wait=False, extra_args=retry)
        for node in (stranger, keyless):
            node.process.wait(timeout=90)
            assert node.process.returncode != 0
            assert "SuperNode ID:" not in node.log(), node.log()[-3000:]
        assert "must be registered" in keyless.log(), keyless.log()[-3000:]
        assert good.process.poll() is None
        listed = fed.flwr("supernode", "ls", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        assert good.log().split("SuperNode ID: ")[1].split()[0] in listed.stdout


def test_secure_aggregation_over_tls_equals_the_simulation(federation, sites, tmp_path):
    """SecAgg+ between SuperNode processes over TLS gives the sums, and the model, of the
    same secure run simulated in-process (the quantisation is seeded on every node)."""
    secure = {"secure-aggregation": True}
    deployed = _run(federation, tmp_path, **secure)["results"]
    simulated = run_in_process(NUM_NODES, tmp_path / "sim", node_configs=sites, **secure)
    _assert_same(deployed, simulated)
    assert deployed["privacy"]["secure_aggregation"] is True
    assert deployed["rounds"][0]["secure_aggregation"]["nodes"] == NUM_NODES
    assert [n["inside_by_node"] for n in deployed["nodes"]] == \
        [n["inside_by_node"] for n in simulated["nodes"]]
