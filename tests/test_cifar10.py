"""CIFAR-10: batch files in the real pickle format, VGG-16 features, cache, splits, a GEMS run."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from gems_fl.data import (
    FeatureOptions,
    cifar10,
    clear_dataset_cache,
    load_dataset,
    parse_division,
)
from gems_fl.data.cifar10 import cifar10_split_sizes, vgg_input
from gems_fl.data.vgg16 import VGG16Features, load_vgg16_features
from gems_fl.settings import Settings
from tests.helpers import run_in_process

N_PER_BATCH, N_TEST = 24, 40


# runs that test something else with an eps (or data) that h_G meets on few sites: the
# min-good-enough check (its own test in test_protocol.py) is turned off there
NO_CHECK = {"min-good-enough": "0"}


def write_cifar(folder: Path, n_per_batch: int = N_PER_BATCH, n_test: int = N_TEST) -> dict[str, tuple]:
    """Write data_batch_1..5 and test_batch as the python release does (bytes keys, uint8 rows)."""
    root = folder / "cifar-10-batches-py"
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    written = {}
    for name, n in [*((f"data_batch_{i}", n_per_batch) for i in range(1, 6)), ("test_batch", n_test)]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n)]
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        with (root / name).open("wb") as f:
            pickle.dump(batch, f, protocol=2)
        written[name] = (data, np.asarray(labels))
    return written


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory) -> Path:
    """Random VGG-16 weights saved like torchvision's file (features.* plus classifier.*).

    Initialised as torchvision initialises VGG (He, fan-out) so features keep their scale.
    """
    torch.manual_seed(0)
    model = VGG16Features()
    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            torch.nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            torch.nn.init.normal_(module.bias, std=0.01)
    state = model.state_dict()
    state["classifier.0.weight"] = torch.zeros(2, 2)  # a full VGG-16 file has these too
    path = tmp_path_factory.mktemp("weights") / "vgg16-random.pth"
    torch.save(state, path)
    return path


@pytest.fixture()
def tiny(tmp_path, weights_file):
    clear_dataset_cache()
    written = write_cifar(tmp_path / "data")
    options = FeatureOptions(vgg16_weights=str(weights_file), feature_cache_dir=str(tmp_path / "cache"))
    yield {"dir": tmp_path / "data", "written": written, "options": options, "cache": tmp_path / "cache"}
    clear_dataset_cache()


def test_vgg16_features_has_torchvision_layout():
    model = VGG16Features()
    convs = [i for i, m in enumerate(model.features) if isinstance(m, torch.nn.Conv2d)]
    pools = [i for i, m in enumerate(model.features) if isinstance(m, torch.nn.MaxPool2d)]
    assert len(model.features) == 31
    assert convs == [0, 2, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28]
    assert pools == [4, 9, 16, 23, 30]
    # torchvision's vgg16().features has 14,714,688 parameters.
    assert sum(p.numel() for p in model.parameters()) == 14_714_688
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


def test_split_sizes_with_the_real_counts():
    # 60000 images: the paper's val/test 5000/5000 from the test batch; its 50000
    # training images give the nodes 45000 and the public pool 5000.
    assert cifar10_split_sizes(50000, 10000) == {"train": 45000, "val": 5000, "test": 5000, "public": 5000}
    assert cifar10_split_sizes(120, 40) == {"train": 108, "val": 20, "test": 20, "public": 12}
    with pytest.raises(ValueError, match="at least 10 training and 2 test images"):
        cifar10_split_sizes(9, 40)


def test_loader_features_labels_and_splits(tiny, weights_file):
    splits = load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    assert splits.name == "cifar10" and splits.num_classes == 10 and splits.num_features == 512
    assert splits.split_sizes() == {"train": 108, "val": 20, "test": 20, "public": 12}
    # Every row is the VGG-16 feature vector of one written image, with that image's label.
    written = tiny["written"]
    train_images = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    train_labels = np.concatenate([written[f"data_batch_{i}"][1] for i in range(1, 6)])
    model = load_vgg16_features(str(weights_file))
    with torch.no_grad():
        expected_train = model(vgg_input(train_images.reshape(-1, 3, 32, 32))).numpy()
        expected_test = model(vgg_input(written["test_batch"][0].reshape(-1, 3, 32, 32))).numpy()

    def match(x, y, feats, labels):
        for row, label in zip(x, y):
            dist = np.linalg.norm(feats - row, axis=1)
            nearest, second = np.argsort(dist)[:2]
            assert dist[nearest] < 1e-3 * dist[second]  # one image, not a look-alike
            assert labels[nearest] == label

    match(splits.train_x, splits.train_y, expected_train, train_labels)
    match(splits.public_x, splits.public_y, expected_train, train_labels)
    match(splits.val_x, splits.val_y, expected_test, written["test_batch"][1])
    match(splits.test_x, splits.test_y, expected_test, written["test_batch"][1])
    # Disjoint: train + public are the 120 training images, val + test the 40 test images.
    pooled = np.concatenate([splits.train_x, splits.public_x])
    gaps = np.linalg.norm(pooled[:, None] - pooled[None], axis=2) + np.eye(120)
    assert gaps.min() > 0


def test_features_are_cached_and_reused(tiny, monkeypatch):
    first = load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    entries = sorted(tiny["cache"].glob("cifar10-*.npz"))
    assert len(entries) == 1
    clear_dataset_cache()

    def no_extraction(*args, **kwargs):
        raise AssertionError("features were recomputed despite the cache")

    monkeypatch.setattr(cifar10, "extract_features", no_extraction)
    again = load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    np.testing.assert_array_equal(first.train_x, again.train_x)
    other_seed = load_dataset("cifar10", seed=1, data_dir=tiny["dir"], features=tiny["options"])
    assert not np.array_equal(first.train_y, other_seed.train_y)  # the split changes, the cache does not
    assert sorted(tiny["cache"].glob("cifar10-*.npz")) == entries


def test_other_weights_or_data_get_their_own_cache_entry(tiny, tmp_path):
    load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    torch.manual_seed(1)
    other = tmp_path / "other.pth"
    torch.save(VGG16Features().state_dict(), other)  # bare features.* keys are accepted too
    clear_dataset_cache()
    load_dataset("cifar10", seed=0, data_dir=tiny["dir"],
                 features=FeatureOptions(vgg16_weights=str(other), feature_cache_dir=str(tiny["cache"])))
    assert len(list(tiny["cache"].glob("cifar10-*.npz"))) == 2
    batch = tiny["dir"] / "cifar-10-batches-py" / "test_batch"
    with batch.open("rb") as f:
        content = pickle.load(f, encoding="bytes")
    content[b"labels"][0] = (content[b"labels"][0] + 1) % 10
    with batch.open("wb") as f:
        pickle.dump(content, f, protocol=2)
    clear_dataset_cache()
    load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    assert len(list(tiny["cache"].glob("cifar10-*.npz"))) == 3


def test_missing_batch_file_is_named(tiny):
    (tiny["dir"] / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match=r"data_batch_3.*not found.*data-dir"):
        load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a pickle", r"test_batch.*expected a python pickle"),
        (pickle.dumps({b"data": np.zeros((3, 3072), np.uint8)}), r"test_batch.*expected the keys 'data' and 'labels'"),
        (pickle.dumps({b"data": np.zeros((3, 1024), np.uint8), b"labels": [0, 1, 2]}),
         r"test_batch.*uint8 of shape \(n, 3072\).*\(3, 1024\)"),
        (pickle.dumps({b"data": np.zeros((3, 3072), np.uint8), b"labels": [0, 1]}),
         r"test_batch.*expected 3 integer 'labels'"),
        (pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}),
         r"test_batch.*labels in 0..9.*from 0 to 10"),
    ],
    ids=["not-a-pickle", "no-labels", "wrong-image-size", "too-few-labels", "label-out-of-range"],
)
def test_malformed_batch_file_is_named(tiny, content, message):
    (tiny["dir"] / "cifar-10-batches-py" / "test_batch").write_bytes(content)
    with pytest.raises(ValueError, match=message):
        load_dataset("cifar10", seed=0, data_dir=tiny["dir"], features=tiny["options"])


def test_missing_or_wrong_weights_say_how_to_provide_them(tiny, tmp_path):
    opts = tiny["options"]
    with pytest.raises(FileNotFoundError, match=r"No VGG-16 weights.*torchvision.*vgg16-weights"):
        load_dataset("cifar10", seed=0, data_dir=tiny["dir"],
                     features=FeatureOptions(feature_cache_dir=opts.feature_cache_dir))
    with pytest.raises(FileNotFoundError, match=r"nowhere.pth.*not found.*vgg16-weights"):
        load_vgg16_features(str(tmp_path / "nowhere.pth"))
    wrong = tmp_path / "wrong.pth"
    torch.save({"features.0.weight": torch.zeros(3, 3, 3, 3)}, wrong)
    with pytest.raises(ValueError, match=r"wrong.pth.*expected the `features.\*` tensors"):
        load_vgg16_features(str(wrong))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"junk.pth.*expected a torch state dict"):
        load_vgg16_features(str(junk))


def test_missing_data_dir_says_how_to_get_cifar10():
    with pytest.raises(ValueError, match=r"needs data_dir.*cifar-10-python.tar.gz"):
        load_dataset("cifar10", seed=0)


def test_hidden_auto_is_100_for_cifar10_and_50_otherwise():
    assert Settings(dataset="cifar10").hidden_widths == [100]
    assert Settings(dataset="fashion-mnist").hidden_widths == [50]
    assert Settings(dataset="ham10000").hidden_widths == [50]
    assert Settings(dataset="cifar10", hidden="30").hidden_widths == [30]
    assert Settings.from_run_config({"dataset": "cifar10"}).to_config()["hidden"] == "100"


def test_paper_divisions_for_cifar10():
    assert parse_division("paper", 2, 10) == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]
    assert parse_division("paper", 3, 10) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert parse_division("paper", 5, 10) == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]


def test_short_gems_run_on_cifar10(tiny, tmp_path):
    results = run_in_process(5, tmp_path / "out", **NO_CHECK, dataset="cifar10", **{
            "data-dir": str(tiny["dir"]), "vgg16-weights": tiny["options"].vgg16_weights,
            "feature-cache-dir": str(tiny["cache"]), "public-samples": 12})
    assert results["status"] == "completed"
    meta = results["dataset"]
    assert meta["name"] == "cifar10" and meta["num_features"] == 512 and meta["num_classes"] == 10
    assert meta["label_division"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert meta["node_train_total"] == 108 and meta["test"] == 20 and meta["public_pool"] == 12
    assert len(results["nodes"]) == 5
    assert results["rows"]["GEMS"]["accuracy"] is not None
    assert len(list(tiny["cache"].glob("cifar10-*.npz"))) == 1  # server and five nodes shared it


def test_prepare_fills_the_cache_that_a_run_then_reads(tiny, monkeypatch, capsys):
    from gems_fl.data import prepare

    prepare.main(["cifar10", "--data-dir", str(tiny["dir"]), "--vgg16-weights", tiny["options"].vgg16_weights,
                  "--feature-cache-dir", str(tiny["cache"])])
    assert "cifar10: 512 features" in capsys.readouterr().out
    clear_dataset_cache()
    monkeypatch.setattr(cifar10, "extract_features", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    splits = load_dataset("cifar10", seed=3, data_dir=tiny["dir"], features=tiny["options"])
    assert splits.num_features == 512
