"""HAM10000: metadata CSV + JPEG folders, balancing, CNN features, cache, divisions, a GEMS run."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from gems_fl.data import (
    FeatureOptions,
    clear_dataset_cache,
    ham10000,
    load_dataset,
    node_data,
    parse_division,
)
from gems_fl.data.ham10000 import DIAGNOSES, balanced_split, load_images, split_counts
from tests.helpers import run_in_process

# Images per diagnosis in the tiny dataset: nv has more than the balanced target of 20,
# so its split is pure sampling; the others need augmented copies.
COUNTS = {"akiec": 6, "bcc": 5, "bkl": 6, "df": 4, "mel": 6, "nv": 30, "vasc": 5}
PER_CLASS, EPOCHS = 20, 1


def class_colour(label: int) -> int:
    return 20 + 30 * label


def write_ham(folder: Path, counts: dict[str, int] = COUNTS) -> list[tuple[str, str]]:
    """Metadata CSV in the published column layout plus JPEGs in two part folders.

    Each image's red channel is ``class_colour(label)`` and its green channel a ramp that
    differs per image, so images are distinct and their label can be read off.
    """
    rng = np.random.default_rng(0)
    rows, k = [], 0
    for dx, n in counts.items():
        for _ in range(n):
            rows.append((f"HAM_{k:07d}", dx))
            k += 1
    rng.shuffle(rows)
    parts = [folder / "HAM10000_images_part_1", folder / "HAM10000_images_part_2"]
    for part in parts:
        part.mkdir(parents=True)
    with (folder / "HAM10000_metadata.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["lesion_id", "image_id", "dx", "dx_type", "age", "sex", "localization"])
        for i, (image_id, dx) in enumerate(rows):
            writer.writerow([f"HAMLES_{i:07d}", image_id, dx, "histo", "50.0", "male", "back"])
            pixels = np.zeros((45, 60, 3), dtype=np.uint8)
            pixels[..., 0] = class_colour(DIAGNOSES.index(dx))
            pixels[..., 1] = (np.arange(60)[None, :] * (1 + i % 4) + 3 * i) % 256
            pixels[..., 2] = rng.integers(0, 50)
            Image.fromarray(pixels).save(parts[i % 2] / f"{image_id}.jpg", quality=95)
    return rows


@pytest.fixture()
def tiny(tmp_path):
    clear_dataset_cache()
    rows = write_ham(tmp_path / "data")
    options = FeatureOptions(feature_cache_dir=str(tmp_path / "cache"), ham10000_per_class=PER_CLASS,
                             ham10000_cnn_epochs=EPOCHS)
    yield {"dir": tmp_path / "data", "rows": rows, "options": options, "cache": tmp_path / "cache"}
    clear_dataset_cache()


def test_split_counts_give_the_papers_80_10_10_with_a_public_pool():
    assert split_counts(2000) == {"train": 1400, "public": 200, "val": 200, "test": 200}
    # The paper's 80 % training share is the nodes' 70 % plus the 10 % public pool.
    assert split_counts(115) == {"train": 79, "public": 12, "val": 12, "test": 12}  # df, the rarest class
    assert split_counts(4) == {"train": 1, "public": 1, "val": 1, "test": 1}


def test_labels_follow_the_papers_order(tiny):
    images, labels, _ = load_images(tiny["dir"], tiny["options"].feature_cache_dir)
    assert images.shape == (sum(COUNTS.values()), 64, 64, 3) and images.dtype == np.uint8
    expected = [DIAGNOSES.index(dx) for _, dx in tiny["rows"]]
    np.testing.assert_array_equal(labels, expected)
    assert DIAGNOSES == ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")
    # Row i of the CSV is image i: its red channel is its class colour.
    red = images[..., 0].mean(axis=(1, 2))
    np.testing.assert_allclose(red, [class_colour(v) for v in expected], atol=3)


def test_balancing_is_seeded_disjoint_and_keeps_labels(tiny):
    images, labels, _ = load_images(tiny["dir"], tiny["options"].feature_cache_dir)
    parts = balanced_split(images, labels, PER_CLASS, seed=0)
    for name, want in split_counts(PER_CLASS).items():
        x, y = parts[name]
        assert np.bincount(y, minlength=7).tolist() == [want] * 7, name
        # Augmented copies keep their class: the red channel still encodes the label.
        centre_red = x[:, 16:48, 16:48, 0].mean(axis=(1, 2))
        np.testing.assert_allclose(centre_red, [class_colour(v) for v in y], atol=4)
    # nv (label 5) needs no augmentation: its images are originals, none in two splits.
    seen = {}
    for name, (x, y) in parts.items():
        for image in x[y == 5]:
            key = image.tobytes()
            assert key in {im.tobytes() for im in images[labels == 5]}
            assert seen.setdefault(key, name) == name, "an nv image is in two splits"
    again = balanced_split(images, labels, PER_CLASS, seed=0)
    other = balanced_split(images, labels, PER_CLASS, seed=1)
    assert all(np.array_equal(parts[n][0], again[n][0]) for n in parts)
    assert not np.array_equal(parts["train"][0], other["train"][0])


def test_loader_features_split_sizes_and_cache(tiny, monkeypatch):
    splits = load_dataset("ham10000", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    assert splits.name == "ham10000" and splits.num_classes == 7 and splits.num_features == 512
    assert splits.split_sizes() == {"train": 98, "val": 14, "test": 14, "public": 14}
    assert splits.train_x.dtype == np.float32 and splits.train_x.min() >= 0  # ReLU activations
    assert np.bincount(splits.test_y).tolist() == [2] * 7
    assert len(list(tiny["cache"].glob("ham10000-images-*.npz"))) == 1
    assert len(list(tiny["cache"].glob("ham10000-[0-9a-f]*.npz"))) == 1
    clear_dataset_cache()

    def no_training(*args, **kwargs):
        raise AssertionError("the feature CNN was retrained despite the cache")

    monkeypatch.setattr(ham10000, "train_extractor", no_training)
    monkeypatch.setattr(ham10000, "decode_image", no_training)
    again = load_dataset("ham10000", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    np.testing.assert_array_equal(splits.train_x, again.train_x)
    np.testing.assert_array_equal(splits.test_y, again.test_y)
    with pytest.raises(AssertionError, match="retrained"):  # another seed is another entry
        load_dataset("ham10000", seed=1, data_dir=tiny["dir"], features=tiny["options"])


def test_paper_divisions_for_ham10000():
    assert parse_division("paper", 2, 7) == [[0, 1, 2, 3], [4, 5, 6]]
    assert parse_division("paper", 3, 7) == [[0, 1], [2, 3], [4, 5, 6]]
    assert parse_division("paper", 5, 7) == [[k, 5, 6] for k in range(5)]


def test_k5_nodes_share_labels_5_and_6_evenly_without_repeats(tiny):
    splits = load_dataset("ham10000", seed=0, data_dir=tiny["dir"], features=tiny["options"])
    division = parse_division("paper", 5, 7)
    parts = [node_data(splits, division, k, seed=0) for k in range(5)]
    for k, (_, y_tr, _, _) in enumerate(parts):
        assert set(np.unique(y_tr)) == {k, 5, 6}
        assert np.sum(y_tr == k) == 14  # all of label k
    for label in (5, 6):
        shares = [int(np.sum(p[1] == label)) for p in parts]
        assert sum(shares) == 14 and max(shares) - min(shares) <= 1
    rows = np.concatenate([p[0] for p in parts])
    assert len(np.unique(rows, axis=0)) == len(rows) == 98


@pytest.mark.parametrize(
    "break_it, error, message",
    [
        (lambda d: (d / "HAM10000_metadata.csv").unlink(), FileNotFoundError,
         r"HAM10000_metadata.csv.*not found.*data-dir"),
        (lambda d: (d / "HAM10000_metadata.csv").write_text("lesion_id,image,diagnosis\nx,y,nv\n"),
         ValueError, r"HAM10000_metadata.csv.*columns 'image_id' and 'dx'"),
        (lambda d: (d / "HAM10000_metadata.csv").write_text("image_id,dx\nHAM_0000000,nv\nHAM_0000001,lupus\n"),
         ValueError, r"HAM10000_metadata.csv.*line 3.*akiec, bcc, bkl, df, mel, nv, vasc.*'lupus'"),
        (lambda d: next(d.glob("*/HAM_0000003.jpg")).unlink(), FileNotFoundError,
         r"HAM_0000003.jpg.*not found.*1 of 62 images are missing"),
        (lambda d: next(d.glob("*/HAM_0000004.jpg")).write_bytes(b"not a jpeg"), ValueError,
         r"HAM_0000004.jpg.*expected a readable JPEG"),
    ],
    ids=["no-metadata", "wrong-columns", "unknown-dx", "missing-jpeg", "corrupt-jpeg"],
)
def test_missing_or_malformed_files_are_named(tiny, break_it, error, message):
    break_it(tiny["dir"])
    with pytest.raises(error, match=message):
        load_dataset("ham10000", seed=0, data_dir=tiny["dir"], features=tiny["options"])


def test_a_class_with_too_few_images_is_named(tmp_path):
    write_ham(tmp_path, {**COUNTS, "df": 3})
    options = FeatureOptions(feature_cache_dir=str(tmp_path / "cache"), ham10000_per_class=PER_CLASS)
    with pytest.raises(ValueError, match=r"class df has 3 image\(s\).*at least 4"):
        load_dataset("ham10000", seed=0, data_dir=tmp_path, features=options)


def test_short_gems_mlp_run_on_ham10000(tiny, tmp_path):
    results = run_in_process(
        5, tmp_path / "out", dataset="ham10000", model="mlp", hidden="8", clusters=4,
        **{"data-dir": str(tiny["dir"]), "feature-cache-dir": str(tiny["cache"]),
           "ham10000-per-class": PER_CLASS, "ham10000-cnn-epochs": EPOCHS,
           "num-directions": 20, "eps-neuron": 0.5, "public-samples": 14})
    assert results["status"] == "completed"
    meta = results["dataset"]
    assert meta["name"] == "ham10000" and meta["num_features"] == 512 and meta["num_classes"] == 7
    assert meta["label_division"] == [[k, 5, 6] for k in range(5)]
    assert meta["node_train_total"] == 98 and meta["test"] == 14 and meta["public_pool"] == 14
    assert results["rows"]["GEMS"]["accuracy"] is not None
    assert len(list(tiny["cache"].glob("ham10000-[0-9a-f]*.npz"))) == 1  # computed once, shared
