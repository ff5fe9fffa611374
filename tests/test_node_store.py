"""What a node keeps between messages: small arrays in Flower's state, large ones in a file
of its own (gems_fl/protocol/node_store.py)."""

import os

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from gems_fl.protocol import node_store
from gems_fl.protocol.node_store import ENV_VAR, SPILL_BYTES, NodeStore


@pytest.fixture
def store_dir(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "store"))
    return tmp_path / "store"


def _context(run_id=7, node_id=3):
    return Context(run_id=run_id, node_id=node_id, node_config={}, state=RecordDict(),
                   run_config={})


def _files(folder):
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_small_arrays_stay_in_flowers_state(store_dir):
    context = _context()
    small = {"center": np.arange(12.0).reshape(3, 4)}
    NodeStore(context).keep("own", small)
    assert "own" in context.state.array_records and not _files(store_dir)
    np.testing.assert_array_equal(NodeStore(context).kept("own")["center"], small["center"])


def test_large_arrays_go_to_a_file_and_come_back_bit_for_bit(store_dir):
    context = _context()
    rng = np.random.default_rng(0)
    large = {"factor": rng.standard_normal((SPILL_BYTES // 4 // 64 + 1, 64)).astype(np.float32),
             "residual": rng.standard_normal(64)}
    NodeStore(context).keep("factor", large)
    assert "factor" not in context.state.array_records
    assert len(_files(store_dir)) == 1
    # what the state carries (and a simulation sends to the node and back) is small
    assert sum(len(str(v)) for v in context.state.config_records["factor"].values()) < 1000
    kept = NodeStore(context).kept("factor")
    for name, array in large.items():
        assert kept[name].dtype == array.dtype
        np.testing.assert_array_equal(kept[name], array)
    NodeStore(context).keep("factor", {"factor": large["factor"][:2]})  # replaced: file gone
    assert not _files(store_dir) and "factor" in context.state.array_records


def test_a_file_removed_or_changed_during_the_run_is_an_error_that_says_so(store_dir):
    context = _context()
    NodeStore(context).keep("big", {"x": np.ones(SPILL_BYTES // 8 + 1)})
    (path,) = _files(store_dir)
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ValueError, match="changed"):
        NodeStore(context).kept("big")
    path.unlink()
    with pytest.raises(ValueError, match=ENV_VAR):
        NodeStore(context).kept("big")
    assert NodeStore(context).kept("never-kept") is None


def test_forget_removes_this_nodes_files_and_leaves_other_nodes(store_dir):
    first, second = _context(node_id=1), _context(node_id=2)
    for context in (first, second):
        NodeStore(context).keep("big", {"x": np.zeros(SPILL_BYTES)})
        NodeStore(context).keep("small", {"x": np.zeros(3)})
    NodeStore(first).forget()
    assert [p.parent for p in _files(store_dir)] == [NodeStore(second).folder]
    assert NodeStore(second).folder.name.startswith("node-2-")
    assert NodeStore(first).kept("small") is not None  # what Flower holds is Flower's
    NodeStore(second).forget()
    assert not store_dir.exists() or not any(store_dir.iterdir())


def test_a_crashed_runs_folder_is_removed_a_week_later(store_dir):
    stale = store_dir / "run-1" / "node-1"
    stale.mkdir(parents=True)
    (stale / "left.npz").write_bytes(b"x")
    week = node_store.STALE_AFTER_S + 60
    os.utime(store_dir / "run-1", (os.path.getatime(stale) - week,) * 2)
    recent = store_dir / "run-2"
    recent.mkdir()
    NodeStore(_context(run_id=3)).keep("big", {"x": np.zeros(SPILL_BYTES)})
    assert not (store_dir / "run-1").exists() and recent.exists()


def test_two_runs_of_the_same_run_and_node_ids_keep_apart(store_dir):
    """In-process runs (the estimator, tests) all have run id 1: each node's folder is its
    own, so one run's end removes nothing of another's."""
    one, other = _context(run_id=1, node_id=1000), _context(run_id=1, node_id=1000)
    for context in (one, other):
        NodeStore(context).keep("big", {"x": np.ones(SPILL_BYTES)})
    assert NodeStore(one).folder != NodeStore(other).folder
    NodeStore(one).forget()
    assert NodeStore(other).kept("big")["x"].sum() == SPILL_BYTES


def test_by_default_the_files_go_to_a_folder_of_this_users_alone(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    context = _context()
    NodeStore(context).keep("big", {"x": np.zeros(SPILL_BYTES)})
    (base,) = tmp_path.glob("gems-fl-node-store-*")
    assert base.stat().st_mode & 0o777 == 0o700
    assert NodeStore(context).folder.is_relative_to(base)
    NodeStore(context).forget()


def test_a_disk_that_takes_no_file_leaves_the_arrays_in_flowers_state(tmp_path, monkeypatch,
                                                                        caplog):
    """A full or read-only disk costs memory, not the run: the arrays stay in the state,
    the node's rows in its process's memory, each with a warning naming the setting."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV_VAR, str(blocker / "store"))
    context = _context()
    large = {"x": np.arange(SPILL_BYTES // 8 + 1, dtype=np.float64)}
    with caplog.at_level("WARNING"):
        NodeStore(context).keep("big", large)
    assert "big" in context.state.array_records and ENV_VAR in caplog.text
    np.testing.assert_array_equal(NodeStore(context).kept("big")["x"], large["x"])

    from tests.helpers import run_in_process

    monkeypatch.setattr(node_store, "SPILL_BYTES", 0)
    results = run_in_process(3, tmp_path / "run")
    assert results["verification"]["good_enough"] == 3
