"""A node keeps what it loaded for the later messages of a run, keyed by everything the
data depend on (in its folder where it has one, else in memory); each message gets arrays
of its own."""

from __future__ import annotations

import os

import numpy as np

from gems_fl.data.node_cache import NodeDataCache
from gems_fl.data.nodes import cast_node_arrays, load_node_data
from gems_fl.settings import Settings
from gems_fl.settings.options import node_data_options
from tests.sitegen import write_csv_site


def _csv_site(tmp_path):
    """A CSV site's file, settings, node config, a loader and the list of its loads."""
    path = write_csv_site(tmp_path, "site-a", seed=0)
    settings = Settings(dataset="node-files", evaluate_on_server=False)
    config = {"data-path": str(path), "node-name": "site-a"}
    loads = []

    def load():
        loads.append(1)
        return cast_node_arrays(load_node_data(node_data_options(settings), config))

    return path, settings, config, load, loads


def test_a_node_loads_its_file_once_per_run_and_again_when_it_changes(tmp_path):
    path, settings, config, load, loads = _csv_site(tmp_path)
    cache = NodeDataCache()
    first = cache.get(node_data_options(settings), config, None, load)
    second = cache.get(node_data_options(settings), config, None, load)
    assert len(loads) == 1 and second is not first
    np.testing.assert_array_equal(second.x_train, first.x_train)
    first.x_train[0, 0] += 1.0  # one message's change does not reach the next
    assert cache.get(node_data_options(settings), config, None, load).x_train[0, 0] == second.x_train[0, 0]
    cache.get(node_data_options(Settings(dataset="node-files", evaluate_on_server=False, seed=1)), config, None, load)
    assert len(loads) == 2  # other settings: other data
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10 ** 9))  # the file changed
    cache.get(node_data_options(settings), config, None, load)
    assert len(loads) == 3


def test_the_cache_keeps_at_most_its_bytes():
    settings = Settings()
    cache = NodeDataCache(max_bytes=1200)

    def data(k):
        from gems_fl.data.nodes import NodeData

        x = np.zeros((10, 10))
        return lambda: NodeData(f"n{k}", k, "test", x.copy(), np.zeros(10), x[:1].copy(),
                                np.zeros(1), num_classes=2)

    for k in range(3):
        cache.get(node_data_options(settings), {"node-name": f"n{k}"}, None, data(k))
    assert len(cache) == 1  # each about 1 KB: only the newest fits


def test_what_memory_no_longer_holds_is_read_back_from_the_nodes_folder(tmp_path):
    """Given a folder, a load is written there; another process (another cache) serving
    the same node reads it back, every field equal, instead of loading again."""
    from dataclasses import fields

    _, settings, config, load, loads = _csv_site(tmp_path)
    folder = tmp_path / "node"
    cache = NodeDataCache()
    first = cache.get(node_data_options(settings), config, None, load, folder=folder)
    again = NodeDataCache().get(node_data_options(settings), config, None, load, folder=folder)
    assert len(loads) == 1 and len(list(folder.glob("data-*.npz"))) == 1
    assert len(cache) == 0  # with a folder, memory keeps none of a node's rows
    kept = first.x_train[0, 0].copy()
    first.x_train[0, 0] += 1.0  # the first message's change does not reach the next
    third = cache.get(node_data_options(settings), config, None, load, folder=folder)
    assert len(loads) == 1 and third.x_train[0, 0] == again.x_train[0, 0] != first.x_train[0, 0]
    first.x_train[0, 0] = kept
    for f in fields(first):
        a, b = getattr(first, f.name), getattr(again, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        elif isinstance(a, tuple):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        else:
            assert a == b, f.name
    (next(folder.glob("data-*.npz"))).write_bytes(b"not an npz")  # unreadable: loaded again
    NodeDataCache().get(node_data_options(settings), config, None, load, folder=folder)
    assert len(loads) == 2


def test_where_the_folder_refuses_the_file_memory_keeps_the_rows(tmp_path, monkeypatch):
    from gems_fl.data import node_cache

    _, settings, config, load, loads = _csv_site(tmp_path)

    def full_disk(file, data):
        raise OSError("No space left on device")

    monkeypatch.setattr(node_cache, "_write", full_disk)
    cache, folder = NodeDataCache(), tmp_path / "node"
    first = cache.get(node_data_options(settings), config, None, load, folder=folder)
    second = cache.get(node_data_options(settings), config, None, load, folder=folder)
    assert len(loads) == 1 and len(cache) == 1 and second.x_train is not first.x_train
    np.testing.assert_array_equal(second.x_train, first.x_train)
