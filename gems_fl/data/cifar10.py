"""CIFAR-10: the python-pickle release, VGG-16 features, and the paper's splits.

Files: ``data_batch_1`` .. ``data_batch_5`` and ``test_batch`` of
``cifar-10-python.tar.gz``, in ``data-dir`` or in ``data-dir/cifar-10-batches-py``.
Each is a pickled dict with ``data`` (uint8, ``(n, 3072)``: the red, green and blue
32x32 planes) and ``labels`` (n ints in 0..9).

Features (appendix B.1): every image goes through the convolutional part of an
ImageNet-pretrained VGG-16 (:mod:`gems_fl.data.vgg16`), 512 features per image. The
features of all 60000 images are cached on disk, keyed by the batch files' contents
and the weights, so the split seed does not change the cache entry.

Splits: the paper uses train / validation / test = 50000 / 5000 / 5000, which takes all
60000 images; a public pool that no node uses must come out of one of them. Here the
official test batch gives validation and test (5000 / 5000), and the official training
batches give the nodes' training pool and the public pool (45000 / 5000). Smaller
folders are split in the same proportions (:func:`cifar10_split_sizes`).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch

from gems_fl.data.download import try_torchvision_download
from gems_fl.data.feature_cache import (
    cached,
    extract_features,
    file_digest,
    fingerprint,
    resolve_cache_dir,
)
from gems_fl.data.vgg16 import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    load_vgg16_features,
    weights_fingerprint,
)

NUM_CLASSES = 10
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
SUBDIR = "cifar-10-batches-py"
IMAGE_SHAPE = (3, 32, 32)
PUBLIC_FRACTION = 10  # 1/10 of the official training images: 5000 of 50000

HOW_TO_GET = (
    "Download the python version of CIFAR-10 (https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz), "
    "unpack it (it holds the folder cifar-10-batches-py with data_batch_1..5 and test_batch) and pass "
    "the folder holding it with the run setting `data-dir`; with torchvision installed and internet, "
    "`torchvision.datasets.CIFAR10(root=FOLDER, download=True)` puts it there."
)


def cifar10_split_sizes(n_train_official: int, n_test_official: int) -> dict[str, int]:
    """Sizes of the four splits for the given numbers of official train and test images.

    With the real counts (50000, 10000): train 45000, public 5000, val 5000, test 5000.
    """
    public = n_train_official // PUBLIC_FRACTION
    val = n_test_official // 2
    sizes = {"train": n_train_official - public, "val": val, "test": n_test_official - val, "public": public}
    if min(sizes.values()) < 1:
        raise ValueError(
            f"CIFAR-10: expected at least {PUBLIC_FRACTION} training and 2 test images so that every "
            f"split is non-empty, found {n_train_official} training and {n_test_official} test images."
        )
    return sizes


def _find_folder(data_dir: Path) -> Path | None:
    for folder in (data_dir / SUBDIR, data_dir):
        if all((folder / name).is_file() for name in (*TRAIN_FILES, TEST_FILE)):
            return folder
    return None


def locate(data_dir: str | Path) -> Path:
    """Return the folder holding all six batch files, or raise naming the first missing one."""
    data_dir = Path(data_dir)
    folder = _find_folder(data_dir)
    if folder is None:
        note = try_torchvision_download(data_dir, "CIFAR10")
        folder = _find_folder(data_dir)
        if folder is None:
            tried = [d / name for d in (data_dir / SUBDIR, data_dir) for name in (*TRAIN_FILES, TEST_FILE)]
            missing = next(p for p in tried if not p.is_file())
            raise FileNotFoundError(
                f"CIFAR-10 batch file {str(missing)!r} not found: expected data_batch_1..5 and "
                f"test_batch in {str(data_dir / SUBDIR)!r} or {str(data_dir)!r}. {note} {HOW_TO_GET}"
            )
    return folder


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled batch: images ``(n, 3, 32, 32)`` uint8 and labels ``(n,)`` int64.

    Raises ``ValueError`` naming the file and what was expected when it is malformed.
    """
    try:
        with path.open("rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except Exception as exc:  # noqa: BLE001 - truncated, not a pickle, ...
        raise ValueError(
            f"CIFAR-10 batch file {str(path)!r}: expected a python pickle of a dict with 'data' and "
            f"'labels', could not unpickle it ({exc!r}). Re-download it. {HOW_TO_GET}"
        ) from None
    if not isinstance(batch, dict):
        raise ValueError(f"CIFAR-10 batch file {str(path)!r}: expected a pickled dict, found {type(batch).__name__}.")
    batch = {k.decode() if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValueError(
            f"CIFAR-10 batch file {str(path)!r}: expected the keys 'data' and 'labels', "
            f"found {sorted(map(str, batch))}."
        )
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != int(np.prod(IMAGE_SHAPE)):
        raise ValueError(
            f"CIFAR-10 batch file {str(path)!r}: expected 'data' as uint8 of shape (n, 3072) "
            f"(32x32 RGB planes), found dtype {data.dtype} with shape {data.shape}."
        )
    if labels.ndim != 1 or len(labels) != len(data) or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(
            f"CIFAR-10 batch file {str(path)!r}: expected {len(data)} integer 'labels', one per "
            f"image, found dtype {labels.dtype} with shape {labels.shape}."
        )
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(
            f"CIFAR-10 batch file {str(path)!r}: expected labels in 0..{NUM_CLASSES - 1}, found values "
            f"from {labels.min()} to {labels.max()}."
        )
    return data.reshape(len(data), *IMAGE_SHAPE), labels.astype(np.int64)


def read_cifar10(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return ``(train_images, train_labels, test_images, test_labels)`` of a located folder."""
    parts = [read_batch(folder / name) for name in TRAIN_FILES]
    test_images, test_labels = read_batch(folder / TEST_FILE)
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            test_images, test_labels)


def vgg_input(images: np.ndarray) -> torch.Tensor:
    """uint8 ``(n, 3, 32, 32)`` -> float tensor in [0, 1] normalised with ImageNet's mean/std."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def cifar10_features(
    data_dir: str | Path, weights: str | None, cache_dir: str | Path | None,
    device: str = "auto",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """VGG-16 features of every CIFAR-10 image (cached): ``(train_x, train_y, test_x, test_y)``.

    The extraction runs on ``device`` (``auto``: CUDA when available); the features come
    back as CPU numpy arrays.
    """
    folder = locate(data_dir)
    digests = [file_digest(folder / name) for name in (*TRAIN_FILES, TEST_FILE)]
    model = load_vgg16_features(weights)
    key = fingerprint("cifar10-vgg16-v1", digests, weights_fingerprint(model))

    def compute() -> dict[str, np.ndarray]:
        train_images, train_y, test_images, test_y = read_cifar10(folder)
        images = np.concatenate([train_images, test_images])
        torch.manual_seed(0)
        feats = extract_features(model, images, vgg_input, "CIFAR-10: VGG-16 features",
                                 device=device)
        n = len(train_y)
        return {"train_x": feats[:n], "train_y": train_y, "test_x": feats[n:], "test_y": test_y}

    arrays, _, _ = cached(resolve_cache_dir(cache_dir), "cifar10", key, compute)
    return arrays["train_x"], arrays["train_y"], arrays["test_x"], arrays["test_y"]


def split_cifar10(
    train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray, seed: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Seeded split into ``train``, ``public`` (official train) and ``val``, ``test`` (official test)."""
    sizes = cifar10_split_sizes(len(train_y), len(test_y))
    rng = np.random.default_rng(seed)
    train_perm = rng.permutation(len(train_y))
    test_perm = rng.permutation(len(test_y))
    tr, pub = train_perm[:sizes["train"]], train_perm[sizes["train"]:]
    val, te = test_perm[:sizes["val"]], test_perm[sizes["val"]:]
    return {
        "train": (train_x[tr], train_y[tr]), "public": (train_x[pub], train_y[pub]),
        "val": (test_x[val], test_y[val]), "test": (test_x[te], test_y[te]),
    }
