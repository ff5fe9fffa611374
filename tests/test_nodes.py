"""A node's own data (data-path), its stable name and seed, and the identity query."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from gems_fl.clientapp.handlers import handle
from gems_fl.data import load_dataset, node_data, parse_division
from gems_fl.data.nodes import NodeDataError, load_node_data, load_node_file, node_name
from gems_fl.protocol import identity_replies, wire
from gems_fl.protocol.rounds import Round, round_messages
from gems_fl.settings import Settings
from gems_fl.settings.options import node_data_options
from tests.helpers import FAST, app_defaults, run_in_process


@pytest.fixture(autouse=True)
def _task_identity():
    """Flower's runtime sets these before app code creates a Message."""
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID


@pytest.fixture(scope="module")
def partition0():
    splits = load_dataset("digits", seed=0)
    return node_data(splits, parse_division("paper", 3, splits.num_classes), 0, 0)


def _npz(path, x_tr, y_tr, x_val, y_val):
    np.savez(path, x_train=x_tr, y_train=y_tr, x_val=x_val, y_val=y_val)
    return str(path)


def test_npz_and_csv_files_load_the_same_arrays(tmp_path, partition0):
    x_tr, y_tr, x_val, y_val = partition0
    from_npz = load_node_file(_npz(tmp_path / "a.npz", *partition0))
    np.savetxt(tmp_path / "b.csv", np.c_[x_tr, y_tr], delimiter=",")
    np.savetxt(tmp_path / "b_val.csv", np.c_[x_val, y_val], delimiter=",")
    from_csv = load_node_file(tmp_path / "b.csv")
    for a, b, c in zip(from_npz, from_csv, partition0):
        np.testing.assert_array_equal(a, c)
        np.testing.assert_allclose(b, c, rtol=1e-6)


@pytest.mark.parametrize("change, message", [
    (lambda a: (a[0][:, :32], a[1], a[2][:, :32], a[3]),
     "x_train has 32 features but the run's dataset 'digits' has 64"),
    (lambda a: (a[0], a[1] + 8, a[2], a[3]), "labels in [8, 10]"),
    (lambda a: (a[0], a[1][:-1], a[2], a[3]), "one label per row"),
    (lambda a: (a[0], a[1], a[2][:0], a[3][:0]), "the val split is empty"),
])
def test_data_that_does_not_fit_the_run_is_refused_with_the_reason(tmp_path, partition0,
                                                                   change, message):
    path = _npz(tmp_path / "site.npz", *change(partition0))
    with pytest.raises(NodeDataError, match=f"node 'site-x': .*{message}".replace("[", r"\[")
                       .replace("]", r"\]")):
        load_node_data(node_data_options(Settings()), {"data-path": path, "node-name": "site-x"})


def test_missing_file_missing_arrays_and_no_data_config_are_clear(tmp_path):
    with pytest.raises(NodeDataError, match="does not exist"):
        load_node_file(tmp_path / "nope.npz")
    np.savez(tmp_path / "partial.npz", x_train=np.zeros((2, 64)))
    with pytest.raises(NodeDataError, match=r"lacks array\(s\) y_train; it must hold x_train, y_train \(optional: x_val, y_val"):
        load_node_file(tmp_path / "partial.npz")
    with pytest.raises(NodeDataError, match="unknown file type"):
        (tmp_path / "x.txt").write_text("1")
        load_node_file(tmp_path / "x.txt")
    with pytest.raises(NodeDataError, match="data-path="):
        load_node_data(node_data_options(Settings()), {})


def test_name_and_seed_come_from_the_node_config_not_the_flower_node_id(tmp_path, partition0):
    """A restarted SuperNode gets a new node id; its name and numbers must not change.
    (Adam's epochs: the exact solve takes no seed, so only a seeded fit shows the seed.)"""
    config = {"data-path": _npz(tmp_path / "site.npz", *partition0), "node-name": "site-a"}
    assert node_name(config) == "site-a"
    assert node_name({"partition-id": 2, "num-partitions": 3}) == "partition-2"
    assert node_name({"data-path": "/srv/hospital-b.npz"}) == "hospital-b"
    settings = {**app_defaults(), **FAST, "space": "ball", "local-solve": "adam"}
    msg = round_messages(Round.SPACES, wire.encode_config(settings), [1], group_id="1")[0]
    replies = [handle(msg, Context(run_id=1, node_id=node_id, node_config=config,
                                         state=RecordDict(), run_config=settings))
               for node_id in (11, 987654321)]
    first, second = (r.content[wire.CENTER_KEY]["weight"].numpy() for r in replies)
    np.testing.assert_array_equal(first, second)
    renamed = handle(msg, Context(run_id=1, node_id=11, node_config={**config, "node-name": "b"},
                                        state=RecordDict(), run_config=settings))
    assert not np.array_equal(renamed.content[wire.CENTER_KEY]["weight"].numpy(), first)


def test_a_data_file_node_equals_the_partition_node_with_the_same_seed_identity(tmp_path, partition0):
    """data-path plus partition-id (seed identity) gives the partition node's exact reply."""
    settings = {**app_defaults(), **FAST, "space": "ball"}
    msg = round_messages(Round.SPACES, wire.encode_config(settings), [1], group_id="1")[0]
    configs = [{"partition-id": 0, "num-partitions": 3},
               {"partition-id": 0, "data-path": _npz(tmp_path / "p0.npz", *partition0)}]
    replies = [handle(msg, Context(run_id=1, node_id=1, node_config=c, state=RecordDict(),
                                         run_config=settings)) for c in configs]
    a, b = (r.content[wire.CENTER_KEY]["weight"].numpy() for r in replies)
    np.testing.assert_array_equal(a, b)


def test_identity_query_reports_name_and_shape(tmp_path, partition0):
    settings = {**app_defaults(), **FAST}
    msg = round_messages(Round.IDENTIFY, wire.encode_config(settings), [1],
                         group_id="identify")[0]
    config = {"data-path": _npz(tmp_path / "s.npz", *partition0), "node-name": "site-a"}
    reply = handle(msg, Context(run_id=1, node_id=5, node_config=config,
                                      state=RecordDict(), run_config=settings))
    name, source, counts = identity_replies.decode_identity(reply.content)
    assert name == "site-a" and source.startswith("data-path=")
    assert counts == {"num-features": 64, "num-classes": 10,
                      "num-train-examples": len(partition0[1]),
                      "num-val-examples": len(partition0[3])}


def test_in_process_node_with_bad_data_is_left_out_and_named(tmp_path, partition0):
    rng = np.random.default_rng(0)
    good = [{"partition-id": k, "num-partitions": 3} for k in range(3)]
    bad = {"node-name": "site-bad",
           "data-path": _npz(tmp_path / "bad.npz", rng.random((20, 10)), rng.integers(0, 10, 20),
                             rng.random((5, 10)), rng.integers(0, 10, 5))}
    results = run_in_process(4, tmp_path / "out", node_configs=[*good, bad], space="ball",
                             **{"evaluate-on-server": False, "required-nodes": "3"})
    assert [p["name"] for p in results["participants"]] == [f"partition-{k}" for k in range(3)]
    (rejected,) = results["rejected"]
    assert rejected["node_id"] == 1003
    assert "node 'site-bad'" in rejected["reason"] and "10 features" in rejected["reason"]
    assert len(results["nodes"]) == 3


def test_round_timeout_is_a_validated_setting():
    assert Settings.from_run_config({"round-timeout": 30}).round_timeout == 30.0
    with pytest.raises(ValueError, match="round-timeout"):
        Settings.from_run_config({"round-timeout": 0.0})


def test_partition_nodes_share_one_read_only_split_per_process_and_own_their_rows():
    from gems_fl.data.datasets import clear_dataset_cache, shared_splits
    from gems_fl.data.nodes import load_node_data
    from gems_fl.settings import Settings

    clear_dataset_cache()
    settings = Settings.from_run_config({"label-division": "iid"})
    config = {"partition-id": 1, "num-partitions": 3}
    first = load_node_data(node_data_options(settings), config)
    second = load_node_data(node_data_options(settings), config)
    assert shared_splits.cache_info().misses == 1 and shared_splits.cache_info().hits == 1
    from gems_fl.data import FeatureOptions

    splits = shared_splits("digits", settings.seed, None, FeatureOptions.from_settings(settings))
    assert shared_splits.cache_info().hits == 2  # the very split the nodes used
    assert not splits.train_x.flags.writeable
    np.testing.assert_array_equal(first.x_train, second.x_train)
    first.x_train += 1.0  # a node's rows are its own copy
    assert not np.array_equal(first.x_train, second.x_train)
