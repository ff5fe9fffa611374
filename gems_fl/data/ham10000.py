"""HAM10000: metadata + JPEGs, seeded class balancing, and the paper's CNN features.

Files (the published layout): ``HAM10000_metadata.csv`` with at least the columns
``image_id`` and ``dx``, and the JPEGs ``<image_id>.jpg`` in ``data-dir`` or any folder
directly below it (``HAM10000_images_part_1``, ``HAM10000_images_part_2``).

Pipeline (appendix B.1), all seeded by the run's ``seed``:

1. Labels in the paper's order: akiec 0, bcc 1, bkl 2, df 3, mel 4, nv 5, vasc 6.
   Images are decoded once and resized to 64x64 RGB (cached on disk).
2. Split: each class's *original* images are shuffled and split 70 / 10 / 10 / 10 into
   node-training, public, validation and test images; the paper's 80 % training share
   is thus 70 % for the nodes plus a 10 % public pool that no node uses. Splitting
   before augmenting keeps augmented copies of a test image out of training.
3. Balancing: each split is brought to its share of ``per_class`` (2000) images per
   class (1400 / 200 / 200 / 200) by drawing originals without replacement and, when a
   class has too few, adding augmented copies (:mod:`gems_fl.data.augment`, Pillow:
   rotation, shifts, flips).
4. Feature extractor: the paper's CNN (3x3 convolutions with 32, 64, 128 filters, each
   followed by 2x2 max-pooling, then a dense layer of 512 and a 7-way head), trained
   with Adam (lr 1e-3, batch 32) on 66 % of all balanced images, drawn from the nodes'
   training split only. The head is then removed: every image's 512 ReLU activations
   are its features. The features of all four splits are cached on disk, keyed by the
   metadata, the image files (names and sizes), the seed and these settings.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import torch
from torch import nn

from gems_fl.data.augment import augment
from gems_fl.data.feature_cache import (
    cached,
    extract_features,
    file_digest,
    fingerprint,
    resolve_cache_dir,
)

DIAGNOSES = ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")
NUM_CLASSES = len(DIAGNOSES)
METADATA_FILE = "HAM10000_metadata.csv"
IMAGE_SIZE = 64
NUM_FEATURES = 512
SPLITS = ("train", "public", "val", "test")
SPLIT_TENTHS = {"public": 1, "val": 1, "test": 1}  # the rest (7/10) is "train"
EXTRACTOR_FRACTION = 0.66

HOW_TO_GET = (
    "Download HAM10000 (https://doi.org/10.7910/DVN/DBW86T: HAM10000_metadata.csv, "
    "HAM10000_images_part_1.zip, HAM10000_images_part_2.zip), unzip the image archives into "
    "the folder holding the CSV and pass that folder with the run setting `data-dir`."
)


def split_counts(n: int) -> dict[str, int]:
    """Split ``n`` items 70 / 10 / 10 / 10 (train, public, val, test), each part >= 1."""
    if n < len(SPLITS):
        raise ValueError(f"cannot split {n} items into {len(SPLITS)} non-empty parts")
    counts = {name: max(1, round(n * tenths / 10)) for name, tenths in SPLIT_TENTHS.items()}
    return {"train": n - sum(counts.values()), **counts}


def read_metadata(data_dir: Path) -> tuple[list[str], np.ndarray]:
    """Return the image ids and labels (0..6) listed in ``HAM10000_metadata.csv``."""
    path = data_dir / METADATA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"HAM10000 metadata file {str(path)!r} not found. {HOW_TO_GET}")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        if "image_id" not in columns or "dx" not in columns:
            raise ValueError(
                f"HAM10000 metadata file {str(path)!r}: expected a CSV header with the columns "
                f"'image_id' and 'dx', found {columns}."
            )
        ids, labels = [], []
        for line, row in enumerate(reader, start=2):
            dx = (row["dx"] or "").strip()
            if dx not in DIAGNOSES:
                raise ValueError(
                    f"HAM10000 metadata file {str(path)!r}, line {line}: expected dx in "
                    f"{', '.join(DIAGNOSES)}, found {dx!r}."
                )
            ids.append((row["image_id"] or "").strip())
            labels.append(DIAGNOSES.index(dx))
    if len(set(ids)) != len(ids) or "" in ids:
        raise ValueError(f"HAM10000 metadata file {str(path)!r}: expected unique, non-empty image_id values.")
    return ids, np.asarray(labels, dtype=np.int64)


def locate_images(data_dir: Path, ids: list[str]) -> list[Path]:
    """Find ``<image_id>.jpg`` in ``data_dir`` or a folder directly below it."""
    index = {p.stem: p for p in [*data_dir.glob("*/*.jpg"), *data_dir.glob("*.jpg")]}
    missing = [i for i in ids if i not in index]
    if missing:
        raise FileNotFoundError(
            f"HAM10000 image {missing[0]}.jpg (listed in {METADATA_FILE}) not found in "
            f"{str(data_dir)!r} or a folder directly below it; {len(missing)} of {len(ids)} "
            f"images are missing. {HOW_TO_GET}"
        )
    return [index[i] for i in ids]


def decode_image(path: Path) -> np.ndarray:
    """Decode a JPEG into uint8 ``(IMAGE_SIZE, IMAGE_SIZE, 3)`` RGB."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except (UnidentifiedImageError, OSError) as exc:
        raise ValueError(f"HAM10000 image {str(path)!r}: expected a readable JPEG image, got {exc}.") from None


def load_images(data_dir: str | Path, cache_dir: str | Path | None) -> tuple[np.ndarray, np.ndarray, str]:
    """All images (uint8 ``(n, 64, 64, 3)``), labels and their cache key, decoded once and cached."""
    from rich.progress import track

    data_dir = Path(data_dir)
    ids, labels = read_metadata(data_dir)
    paths = locate_images(data_dir, ids)
    key = fingerprint("ham10000-images-v1", IMAGE_SIZE, file_digest(data_dir / METADATA_FILE),
                      [(p.name, p.stat().st_size) for p in paths])

    def compute() -> dict[str, np.ndarray]:
        images = np.stack([decode_image(p) for p in track(paths, description="HAM10000: decoding JPEGs",
                                                           transient=True)])
        return {"images": images, "labels": labels}

    arrays, _, _ = cached(resolve_cache_dir(cache_dir), "ham10000-images", key, compute)
    return arrays["images"], arrays["labels"], key


def balanced_split(
    images: np.ndarray, labels: np.ndarray, per_class: int, seed: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Split originals per class 70/10/10/10, then balance each split by sampling and augmenting.

    Every class ends with ``split_counts(per_class)[split]`` images in each split.
    """
    rng = np.random.default_rng(seed)
    targets = split_counts(per_class)
    out: dict[str, tuple[list, list]] = {name: ([], []) for name in SPLITS}
    for label in range(NUM_CLASSES):
        originals = np.flatnonzero(labels == label)
        if len(originals) < len(SPLITS):
            raise ValueError(
                f"HAM10000: class {DIAGNOSES[label]} has {len(originals)} image(s) in {METADATA_FILE}; "
                f"expected at least {len(SPLITS)} (one for each of train, public, val and test)."
            )
        rng.shuffle(originals)
        bounds = np.cumsum([split_counts(len(originals))[name] for name in SPLITS])[:-1]
        for name, part in zip(SPLITS, np.split(originals, bounds)):
            want = targets[name]
            keep = rng.choice(part, size=min(want, len(part)), replace=False)
            chosen = [images[i] for i in keep]
            sources = rng.choice(part, size=want - len(keep), replace=True)
            chosen += [augment(images[i], rng) for i in sources]
            out[name][0].extend(chosen)
            out[name][1].extend([label] * want)
    result = {}
    for name, (xs, ys) in out.items():
        order = rng.permutation(len(ys))
        result[name] = (np.stack(xs)[order], np.asarray(ys, dtype=np.int64)[order])
    return result


class HamCNN(nn.Module):
    """The paper's extractor: conv 32-64-128 (3x3) with 2x2 max-pooling, dense 512, head 7."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.LazyLinear(NUM_FEATURES), nn.ReLU(),
        )
        self.features(torch.zeros(1, 3, IMAGE_SIZE, IMAGE_SIZE))  # materialise the lazy layer
        self.head = nn.Linear(NUM_FEATURES, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def cnn_input(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(n, h, w, 3)`` -> float ``(n, 3, h, w)`` in [0, 1]."""
    return torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float().div_(255.0)


def train_extractor(
    images: np.ndarray, labels: np.ndarray, epochs: int, seed: int, device: str = "cpu"
) -> nn.Module:
    """Train :class:`HamCNN` (Adam, lr 1e-3, batch 32) and return its headless feature part.

    Trains on ``device`` (``auto``, ``cpu``, ``cuda``); the returned module is on the CPU.
    """
    from rich.progress import track

    from gems_fl.learning.train import resolve_device

    target = resolve_device(device)
    torch.manual_seed(seed)
    model = HamCNN().to(target)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(seed)
    y = torch.from_numpy(labels)
    batches = [(e, s) for e in range(epochs) for s in range(0, len(labels), 32)]
    order = None
    model.train()
    for _epoch, start in track(batches, description="HAM10000: training the feature CNN", transient=True):
        if start == 0:
            order = torch.randperm(len(labels), generator=generator)
        idx = order[start:start + 32].numpy()
        optimiser.zero_grad()
        loss = loss_fn(model(cnn_input(images[idx]).to(target)), y[idx].to(target))
        loss.backward()
        optimiser.step()
    return model.to("cpu").features.eval()


def ham10000_splits(
    data_dir: str | Path, seed: int, per_class: int, epochs: int, cache_dir: str | Path | None,
    device: str = "auto",
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Features and labels of each split (``train``, ``public``, ``val``, ``test``), cached.

    The CNN trains and extracts on ``device`` (not part of the cache key).
    """
    images, labels, images_key = load_images(data_dir, cache_dir)
    key = fingerprint("ham10000-features-v1", images_key, seed, per_class, epochs)

    def compute() -> dict[str, np.ndarray]:
        parts = balanced_split(images, labels, per_class, seed)
        n_total = sum(len(y) for _, y in parts.values())
        n_fit = min(len(parts["train"][1]), round(EXTRACTOR_FRACTION * n_total))
        fit = np.random.default_rng(seed).choice(len(parts["train"][1]), size=n_fit, replace=False)
        extractor = train_extractor(parts["train"][0][fit], parts["train"][1][fit], epochs, seed,
                                    device=device)
        arrays = {}
        for name, (x, y) in parts.items():
            arrays[f"{name}_x"] = extract_features(extractor, x, cnn_input, f"HAM10000: features ({name})",
                                                   device=device)
            arrays[f"{name}_y"] = y
        return arrays

    arrays, _, _ = cached(resolve_cache_dir(cache_dir), "ham10000", key, compute)
    return {name: (arrays[f"{name}_x"], arrays[f"{name}_y"]) for name in SPLITS}
