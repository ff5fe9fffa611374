"""Tests for gems_fl.data: IDX files, dataset loading and splits, label divisions."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gems_fl.data import (
    PAPER_DIVISIONS,
    DatasetSplits,
    load_dataset,
    node_data,
    parse_division,
    partition_indices,
    read_idx,
    write_idx,
)

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
IDX_STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def make_images(n: int, offset: int) -> np.ndarray:
    """Return ``n`` 28x28 uint8 images whose first two pixels encode ``offset + i``."""
    rng = np.random.default_rng(n + offset)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    ids = np.arange(offset, offset + n)
    images[:, 0, 0] = ids % 256
    images[:, 0, 1] = ids // 256
    return images


def image_ids(x: np.ndarray) -> np.ndarray:
    """Recover the ids written by :func:`make_images` from flattened [0, 1] features."""
    pixels = np.rint(x[:, :2] * 255).astype(np.int64)
    return pixels[:, 0] + 256 * pixels[:, 1]


def write_tiny_dataset(folder: Path, n_train: int = 600, n_test: int = 100, gz: tuple[str, ...] = ()) -> None:
    """Write the four IDX files of a tiny 10-class dataset into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": make_images(n_train, 0),
        "train_labels": (np.arange(n_train) % 10).astype(np.uint8),
        "test_images": make_images(n_test, 10_000),
        "test_labels": (np.arange(n_test) % 10).astype(np.uint8),
    }
    for key, array in arrays.items():
        suffix = ".gz" if key in gz else ""
        write_idx(folder / f"{IDX_STEMS[key]}{suffix}", array)


# ---------------------------------------------------------------- IDX files


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip_uint8_images_and_labels(tmp_path, suffix):
    images = make_images(7, 0)
    labels = np.array([3, 1, 4, 1, 5, 9, 2], dtype=np.uint8)
    write_idx(tmp_path / f"img{suffix}", images)
    write_idx(tmp_path / f"lbl{suffix}", labels)

    got_images = read_idx(tmp_path / f"img{suffix}")
    got_labels = read_idx(tmp_path / f"lbl{suffix}")

    np.testing.assert_array_equal(got_images, images)
    np.testing.assert_array_equal(got_labels, labels)
    assert got_images.dtype == np.uint8 and got_labels.dtype == np.uint8
    assert got_images.flags.writeable


def test_idx_header_is_the_real_format(tmp_path):
    write_idx(tmp_path / "img", make_images(2, 0))
    write_idx(tmp_path / "lbl.gz", np.zeros(2, dtype=np.uint8))
    raw_images = (tmp_path / "img").read_bytes()
    raw_labels = gzip.decompress((tmp_path / "lbl.gz").read_bytes())
    assert raw_images[:16] == bytes.fromhex("00000803 00000002 0000001c 0000001c")
    assert raw_labels[:8] == bytes.fromhex("00000801 00000002")


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.float32, np.float64])
def test_idx_round_trip_generic_dtypes(tmp_path, dtype):
    array = (np.arange(24).reshape(2, 3, 4) - 10).astype(dtype)
    write_idx(tmp_path / "a.gz", array)
    got = read_idx(tmp_path / "a.gz")
    np.testing.assert_array_equal(got, array)
    assert got.dtype == np.dtype(dtype)


def test_idx_gzip_detected_without_suffix(tmp_path):
    write_idx(tmp_path / "a.gz", np.arange(5, dtype=np.uint8))
    (tmp_path / "a.gz").rename(tmp_path / "plain-name")
    np.testing.assert_array_equal(read_idx(tmp_path / "plain-name"), np.arange(5))


def test_write_idx_rejects_unsupported_arrays(tmp_path):
    with pytest.raises(ValueError, match="dtype"):
        write_idx(tmp_path / "a", np.zeros(3, dtype=bool))
    with pytest.raises(ValueError, match="dimensions"):
        write_idx(tmp_path / "a", np.uint8(3))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_bad_magic_names_file(tmp_path, suffix):
    path = tmp_path / f"bad-magic{suffix}"
    payload = bytes.fromhex("12345678") + bytes(8)
    path.write_bytes(gzip.compress(payload) if suffix else payload)
    with pytest.raises(ValueError, match="bad-magic") as info:
        read_idx(path)
    assert "0x12345678" in str(info.value) and "0x00000803" in str(info.value)


def test_idx_unknown_type_code_is_rejected(tmp_path):
    path = tmp_path / "bad-type"
    path.write_bytes(bytes([0, 0, 0x0A, 1]) + (1).to_bytes(4, "big") + bytes(1))
    with pytest.raises(ValueError, match="bad-type.*0x00000A01"):
        read_idx(path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_truncated_data_names_file_and_sizes(tmp_path, suffix):
    good = tmp_path / "good"
    write_idx(good, make_images(3, 0))
    path = tmp_path / f"truncated{suffix}"
    payload = good.read_bytes()[:-10]
    path.write_bytes(gzip.compress(payload) if suffix else payload)
    with pytest.raises(ValueError, match="truncated") as info:
        read_idx(path)
    message = str(info.value)
    assert str(path) in message
    assert f"expected {16 + 3 * 784} bytes" in message and f"found {16 + 3 * 784 - 10} bytes" in message


def test_idx_truncated_header_and_tiny_file(tmp_path):
    (tmp_path / "short-header").write_bytes(bytes([0, 0, 8, 3]) + bytes(4))
    (tmp_path / "tiny").write_bytes(b"\x00\x00")
    with pytest.raises(ValueError, match="short-header.*header of 16 bytes"):
        read_idx(tmp_path / "short-header")
    with pytest.raises(ValueError, match="tiny.*4-byte magic"):
        read_idx(tmp_path / "tiny")


def test_idx_corrupt_gzip_names_file(tmp_path):
    write_idx(tmp_path / "full.gz", make_images(3, 0))
    path = tmp_path / "cut.gz"
    path.write_bytes((tmp_path / "full.gz").read_bytes()[:40])
    with pytest.raises(ValueError, match="cut.gz.*gzip"):
        read_idx(path)


def test_idx_trailing_bytes_are_rejected(tmp_path):
    path = tmp_path / "long"
    write_idx(path, np.arange(4, dtype=np.uint8))
    path.write_bytes(path.read_bytes() + b"\x00")
    with pytest.raises(ValueError, match="expected 12 bytes.*found 13 bytes"):
        read_idx(path)


# ---------------------------------------------------------------- datasets


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ValueError, match="digits.*fashion-mnist.*mnist"):
        load_dataset("cifar", seed=0)


@pytest.mark.parametrize("seed", [-1, 1.5, True, 2**32])
def test_invalid_seed_is_rejected(seed):
    with pytest.raises(ValueError, match="seed"):
        load_dataset("digits", seed=seed)


def test_missing_fashion_file_says_where_and_how(tmp_path):
    write_tiny_dataset(tmp_path)
    (tmp_path / IDX_STEMS["test_labels"]).unlink()
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)
    message = str(info.value)
    assert "t10k-labels-idx1-ubyte" in message
    assert str(tmp_path / "t10k-labels-idx1-ubyte") in message
    assert str(tmp_path / "t10k-labels-idx1-ubyte.gz") in message
    assert "apt-get install dataset-fashion-mnist" in message and "data-dir" in message


@pytest.mark.parametrize("gz", [(), tuple(IDX_STEMS), ("train_images", "test_labels")])
def test_fashion_loader_on_tiny_files(tmp_path, gz):
    write_tiny_dataset(tmp_path, gz=gz)
    splits = load_dataset("fashion-mnist", seed=3, data_dir=str(tmp_path))

    assert isinstance(splits, DatasetSplits)
    assert splits.name == "fashion-mnist" and splits.num_classes == 10
    assert splits.num_features == 784
    assert splits.split_sizes() == {"train": 500, "val": 50, "test": 50, "public": 50}
    for x, y in [(splits.train_x, splits.train_y), (splits.val_x, splits.val_y),
                 (splits.test_x, splits.test_y), (splits.public_x, splits.public_y)]:
        assert x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == 784
        assert y.dtype == np.int64 and y.shape == (len(x),)
        assert 0.0 <= x.min() and x.max() <= 1.0
    ids = [image_ids(splits.train_x), image_ids(splits.val_x), image_ids(splits.public_x)]
    all_train = np.concatenate(ids)
    assert np.array_equal(np.sort(all_train), np.arange(600))
    np.testing.assert_array_equal(splits.train_y, image_ids(splits.train_x) % 10)
    test_ids = image_ids(splits.test_x)
    assert len(np.unique(test_ids)) == 50 and test_ids.min() >= 10_000


def test_fashion_split_is_seeded(tmp_path):
    write_tiny_dataset(tmp_path)
    a = load_dataset("fashion-mnist", seed=1, data_dir=tmp_path)
    b = load_dataset("fashion-mnist", seed=1, data_dir=tmp_path)
    c = load_dataset("fashion-mnist", seed=2, data_dir=tmp_path)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    np.testing.assert_array_equal(a.test_y, b.test_y)
    assert not np.array_equal(image_ids(a.train_x), image_ids(c.train_x))


@pytest.mark.parametrize("division", ["dirichlet:0.5", "classes-per-node:2", "iid"])
def test_shared_idx_splits_give_each_node_the_rows_of_the_float_splits(tmp_path, division):
    """A process's shared IDX splits keep the images as read and scale a node's rows when it
    takes them: the same numbers, dtype and shapes as the float splits' rows."""
    from gems_fl.data import node_data, parse_division
    from gems_fl.data.datasets import clear_dataset_cache, shared_splits
    from gems_fl.data.idx import ScaledImages

    write_tiny_dataset(tmp_path, gz=("train_images",))
    clear_dataset_cache()
    floats = load_dataset("fashion-mnist", seed=4, data_dir=tmp_path)
    shared = shared_splits("fashion-mnist", 4, str(tmp_path))
    assert isinstance(shared.train_x, ScaledImages)
    for name in ("train_x", "val_x", "test_x", "public_x"):
        view, full = getattr(shared, name), getattr(floats, name)
        assert view.shape == full.shape and view.dtype == full.dtype
        np.testing.assert_array_equal(np.asarray(view), full)
    parts = parse_division(division, 4, floats.num_classes)
    for node in range(4):
        for mine, theirs in zip(node_data(shared, parts, node, 4), node_data(floats, parts, node, 4)):
            assert mine.dtype == theirs.dtype
            np.testing.assert_array_equal(mine, theirs)
    clear_dataset_cache()


def test_returned_arrays_do_not_corrupt_cache(tmp_path):
    write_tiny_dataset(tmp_path)
    first = load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)
    expected = first.train_x.copy()
    first.train_x[:] = 7.0
    first.train_y[:] = 7
    again = load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)
    np.testing.assert_array_equal(again.train_x, expected)


def test_torchvision_layout_is_searched(tmp_path):
    write_tiny_dataset(tmp_path / "FashionMNIST" / "raw", gz=("test_images",))
    splits = load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)
    assert splits.split_sizes()["train"] == 500


def test_mismatched_label_count_is_rejected(tmp_path):
    write_tiny_dataset(tmp_path)
    write_idx(tmp_path / IDX_STEMS["train_labels"], np.zeros(599, dtype=np.uint8))
    with pytest.raises(ValueError, match="599 labels for 600 images"):
        load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)


def test_labels_out_of_range_are_rejected(tmp_path):
    write_tiny_dataset(tmp_path)
    write_idx(tmp_path / IDX_STEMS["test_labels"], np.full(100, 12, dtype=np.uint8))
    with pytest.raises(ValueError, match="t10k-labels.*0..9"):
        load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)


def test_too_small_files_are_rejected(tmp_path):
    write_tiny_dataset(tmp_path, n_train=11, n_test=4)
    with pytest.raises(ValueError, match="at least 60 training"):
        load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)


def test_mnist_requires_data_dir():
    with pytest.raises(ValueError, match="data-dir"):
        load_dataset("mnist", seed=0)


def test_mnist_missing_without_torchvision(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", None)
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("mnist", seed=0, data_dir=tmp_path)
    message = str(info.value)
    assert "train-images-idx3-ubyte" in message and str(tmp_path) in message
    assert "MNIST" in message and "data-dir" in message and "torchvision is not importable" in message


def _fake_torchvision(monkeypatch, mnist_class) -> None:
    """Install a stand-in ``torchvision.datasets`` module exposing ``MNIST``."""
    package = types.ModuleType("torchvision")
    submodule = types.ModuleType("torchvision.datasets")
    submodule.MNIST = mnist_class
    package.datasets = submodule
    monkeypatch.setitem(sys.modules, "torchvision", package)
    monkeypatch.setitem(sys.modules, "torchvision.datasets", submodule)


def test_mnist_download_failure_gives_missing_file_error(tmp_path, monkeypatch):
    def offline(root, download):
        raise RuntimeError("no internet")

    _fake_torchvision(monkeypatch, offline)
    with pytest.raises(FileNotFoundError, match="(?s)train-images-idx3-ubyte.*no internet"):
        load_dataset("mnist", seed=0, data_dir=tmp_path)


def test_mnist_reads_files_written_by_torchvision(tmp_path, monkeypatch):
    calls = []

    def downloader(root, download):
        calls.append((root, download))
        write_tiny_dataset(Path(root) / "MNIST" / "raw")

    _fake_torchvision(monkeypatch, downloader)
    splits = load_dataset("mnist", seed=0, data_dir=tmp_path)
    assert calls == [(str(tmp_path), True)]
    assert splits.name == "mnist" and splits.split_sizes()["val"] == 50


def test_digits_split_sizes_and_disjointness():
    from sklearn.datasets import load_digits

    splits = load_dataset("digits", seed=0)
    sizes = splits.split_sizes()
    assert sum(sizes.values()) == 1797
    assert sizes == {"train": 1284, "val": 128, "test": 128, "public": 257}
    assert splits.num_features == 64 and splits.train_x.dtype == np.float32
    assert splits.train_x.max() <= 1.0 and splits.train_y.dtype == np.int64

    rows = np.column_stack([
        np.concatenate([splits.train_x, splits.val_x, splits.test_x, splits.public_x]),
        np.concatenate([splits.train_y, splits.val_y, splits.test_y, splits.public_y]),
    ])
    bunch = load_digits()
    original = np.column_stack([(bunch.data / 16.0).astype(np.float32), bunch.target])
    sort = lambda a: a[np.lexsort(a.T[::-1])]
    np.testing.assert_array_equal(sort(rows), sort(original))
    assert np.all(np.abs(np.bincount(splits.val_y, minlength=10) - 12.8) <= 1)


def test_digits_split_is_seeded():
    a, b, c = (load_dataset("digits", seed=s) for s in (5, 5, 6))
    np.testing.assert_array_equal(a.public_x, b.public_x)
    assert not np.array_equal(a.train_y, c.train_y)


@pytest.mark.skipif(not os.path.exists(FASHION_DIR), reason="Debian package dataset-fashion-mnist not installed")
def test_real_fashion_mnist():
    splits = load_dataset("fashion-mnist", seed=0)
    assert splits.split_sizes() == {"train": 50000, "val": 5000, "test": 5000, "public": 5000}
    assert splits.num_features == 784
    assert set(np.unique(splits.train_y)) == set(range(10))


# ---------------------------------------------------------------- divisions


def test_parse_division_paper():
    for k, division in PAPER_DIVISIONS.items():
        assert parse_division("paper", k, 10) == division
    assert parse_division(" PAPER ", 5, 10) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    parsed = parse_division("paper", 3, 10)
    parsed[0].append(99)
    assert PAPER_DIVISIONS[3][0] == [0, 1, 2]


def test_parse_division_paper_errors():
    with pytest.raises(ValueError, match=r"label-division.*4 nodes.*\[2, 3, 5\].*classes-per-node:N"):
        parse_division("paper", 4, 10)
    with pytest.raises(ValueError, match="label-division.*7 or 10 classes.*has 6"):
        parse_division("paper", 2, 6)
    with pytest.raises(ValueError, match=r"label-division.*4 nodes and 7 classes.*\[2, 3, 5\]"):
        parse_division("paper", 4, 7)


def test_parse_division_classes_per_node():
    assert parse_division("classes-per-node:2", 3, 10) == [[0, 1], [2, 3], [4, 5]]
    assert parse_division("classes-per-node:3", 4, 10) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 9]]
    assert parse_division("classes-per-node:10", 2, 10) == [list(range(10))] * 2


@pytest.mark.parametrize("spec", ["classes-per-node:0", "classes-per-node:11", "classes-per-node:x",
                                  "classes-per-node", "classes-per-node=2"])
def test_parse_division_classes_per_node_errors(spec):
    with pytest.raises(ValueError, match="label-division.*classes-per-node:N"):
        parse_division(spec, 3, 10)


def test_parse_division_iid():
    assert parse_division("iid", 3, 4) == [[0, 1, 2, 3]] * 3


def test_parse_division_explicit():
    assert parse_division("0,1/2,3/4,5/6,7/8,9", 5, 10) == PAPER_DIVISIONS[5]
    assert parse_division(" 3, 1 / 1 ", 2, 10) == [[1, 3], [1]]
    assert parse_division("0/0", 2, 10) == [[0], [0]]


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("0,1/2,3", "2 group"),
        ("0,1/2,3/", "node 2 holds no class"),
        ("0,1/a,3/4", "'a' is not an integer"),
        ("0,1/2,10/4", "class 10 is out of range"),
        ("0,1/2,-1/4", "class -1 is out of range"),
        ("0,0/2/4", "more than once"),
        ("", "non-empty string"),
    ],
)
def test_parse_division_explicit_errors(spec, problem):
    with pytest.raises(ValueError, match="label-division") as info:
        parse_division(spec, 3, 10)
    assert problem in str(info.value)
    assert "0,1/2,3/4,5/6,7/8,9" in str(info.value)


def test_parse_division_rejects_bad_counts():
    with pytest.raises(ValueError, match="num_nodes"):
        parse_division("iid", 0, 10)
    with pytest.raises(ValueError, match="num_classes"):
        parse_division("iid", 2, 0)


# ---------------------------------------------------------------- partitions


LABELS = np.random.default_rng(0).integers(0, 10, size=1000)


def test_partition_indices_disjoint_and_class_restricted():
    division = parse_division("paper", 3, 10)
    parts = partition_indices(LABELS, division, seed=0)
    assert len(parts) == 3
    joined = np.concatenate(parts)
    assert len(joined) == len(np.unique(joined)) == len(LABELS)
    for part, classes in zip(parts, division):
        assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
        assert set(np.unique(LABELS[part])) == set(classes)


def test_partition_indices_shared_class_is_split_evenly():
    parts = partition_indices(LABELS, [[0, 1], [1, 2], [1]], seed=0)
    counts = [int(np.sum(LABELS[p] == 1)) for p in parts]
    assert sum(counts) == int(np.sum(LABELS == 1))
    assert max(counts) - min(counts) <= 1
    assert not np.any(np.isin(LABELS[np.concatenate(parts)], [3, 4, 5, 6, 7, 8, 9]))


def test_partition_indices_is_seeded():
    division = PAPER_DIVISIONS[2]
    a = partition_indices(LABELS, division, seed=4)
    b = partition_indices(LABELS, division, seed=4)
    c = partition_indices(LABELS, division, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_partition_indices_validates_inputs():
    with pytest.raises(ValueError, match="node 1 must hold a non-empty"):
        partition_indices(LABELS, [[0], []], seed=0)
    with pytest.raises(ValueError, match="more than once"):
        partition_indices(LABELS, [[0, 0]], seed=0)
    with pytest.raises(ValueError, match="1-D array of integer"):
        partition_indices(LABELS.astype(float), [[0]], seed=0)
    with pytest.raises(ValueError, match="seed"):
        partition_indices(LABELS, [[0]], seed=-1)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=0, max_size=200),
    division=st.lists(st.sets(st.integers(0, 5), min_size=1), min_size=1, max_size=6),
    seed=st.integers(0, 2**32 - 1),
)
def test_partition_property_disjoint_and_exact_cover(labels, division, seed):
    labels = np.asarray(labels, dtype=np.int64)
    division = [sorted(group) for group in division]
    spec = "/".join(",".join(map(str, group)) for group in division)
    assert parse_division(spec, len(division), 6) == division
    parts = partition_indices(labels, division, seed)
    joined = np.concatenate(parts)
    held = set().union(*map(set, division))
    assert len(joined) == len(np.unique(joined))
    assert set(joined.tolist()) == {i for i, y in enumerate(labels) if y in held}
    for part, group in zip(parts, division):
        assert set(labels[part].tolist()) <= set(group)


def test_node_data_uses_train_and_val_partitions(tmp_path):
    write_tiny_dataset(tmp_path)
    splits = load_dataset("fashion-mnist", seed=0, data_dir=tmp_path)
    division = parse_division("paper", 5, 10)
    pieces = [node_data(splits, division, k, seed=7) for k in range(5)]
    for (x_tr, y_tr, x_va, y_va), classes in zip(pieces, division):
        assert set(np.unique(y_tr)) == set(classes) and set(np.unique(y_va)) == set(classes)
        assert x_tr.shape == (len(y_tr), 784) and x_va.shape == (len(y_va), 784)
    train_ids = np.concatenate([image_ids(p[0]) for p in pieces])
    assert np.array_equal(np.sort(train_ids), np.sort(image_ids(splits.train_x)))
    expected_val = partition_indices(splits.val_y, division, 8)[2]
    np.testing.assert_array_equal(pieces[2][3], splits.val_y[expected_val])
    with pytest.raises(ValueError, match="node_id"):
        node_data(splits, division, 5, seed=0)
    with pytest.raises(ValueError, match="only 10 classes"):
        node_data(splits, [[0], [10]], 0, seed=0)


def test_flwr_datasets_partitioner_matches_partition_indices():
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("flwr_datasets")
    from gems_fl.data import LabelDivisionPartitioner

    labels = LABELS[:300]
    dataset = datasets.Dataset.from_dict({"x": np.arange(300), "label": labels})
    division = parse_division("0,1,2/2,3/4,5,6,7,8,9", 3, 10)
    partitioner = LabelDivisionPartitioner(division, partition_by="label", seed=11)
    partitioner.dataset = dataset
    expected = partition_indices(labels, division, seed=11)

    assert partitioner.num_partitions == 3
    for k in range(3):
        partition = partitioner.load_partition(k)
        np.testing.assert_array_equal(np.asarray(partition["x"]), expected[k])
    with pytest.raises(ValueError, match="partition_id"):
        partitioner.load_partition(3)

    from_spec = LabelDivisionPartitioner.from_spec("paper", 2, 10, seed=11)
    from_spec.dataset = dataset
    np.testing.assert_array_equal(
        np.asarray(from_spec.load_partition(1)["x"]), partition_indices(labels, PAPER_DIVISIONS[2], 11)[1]
    )


def test_import_does_not_load_flwr_datasets():
    code = "import sys, gems_fl.data; print('flwr_datasets' in sys.modules, 'sklearn' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_dataset_shapes_table_matches_the_loaded_data():
    from gems_fl.data import DATASET_NAMES, DATASET_SHAPES

    splits = load_dataset("digits", seed=0)
    assert DATASET_SHAPES["digits"] == (splits.num_features, splits.num_classes)
    assert set(DATASET_SHAPES) == set(DATASET_NAMES)
    if os.path.exists("/usr/share/datasets/fashion-mnist"):
        fm = load_dataset("fashion-mnist", seed=0)
        assert DATASET_SHAPES["fashion-mnist"] == (fm.num_features, fm.num_classes)


def test_a_dataset_is_one_registry_entry(monkeypatch, tmp_path):
    """load_dataset and the preflight's file check ask the dataset's entry: a dataset
    registered from here loads through load_dataset, and one whose files are missing is
    refused before a run with the README section its entry names."""
    from gems_fl.data import DATASETS, Dataset, dataset_named
    from gems_fl.serverapp.preflight import PreflightError, check_data_files
    from gems_fl.settings import DataSettings

    digits = load_dataset("digits", seed=0)
    seen = []

    def load(folder, seed, options):
        seen.append((folder, seed))
        return digits

    monkeypatch.setitem(DATASETS, "toy", Dataset("toy", 64, 10, "8x8 pixels", load))
    assert dataset_named(" TOY ") is DATASETS["toy"]
    assert load_dataset("toy", seed=3) is digits and seen == [("", 3)]  # bundled: no folder

    monkeypatch.setitem(DATASETS, "toy-files", Dataset(
        "toy-files", 784, 10, "28x28 pixels", load, files="idx", idx_subdir="Toy",
        readme_section='"Toy files"'))
    with pytest.raises(ValueError, match="needs data_dir"):
        load_dataset("toy-files", seed=0)
    assert load_dataset("toy-files", seed=1, data_dir=str(tmp_path)) is digits
    assert seen[-1] == (str(tmp_path), 1)
    with pytest.raises(PreflightError, match='README, "Toy files"'):
        check_data_files(DataSettings(dataset="toy-files"))
    with pytest.raises(PreflightError, match="holds no toy-files IDX file"):
        check_data_files(DataSettings(dataset="toy-files", data_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="valid names are digits, fashion-mnist"):
        dataset_named("absent")
